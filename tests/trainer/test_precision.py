"""A precision on a device is one record: the dtype autocast computes in, whether the loss is scaled, the hparams
a run starts with, and whether a CPU emulates the 16-bit format; bad names and devices are refused naming them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.core.state import PRECISIONS
from composer_fn.trainer.loss_scale import GROWTH_TRACKER, LOSS_SCALE, DynamicLossScale
from composer_fn.trainer.precision import Precision

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, database=None)
DTYPES = {"fp32": torch.float32, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


@PROPERTY
@given(name=st.sampled_from(PRECISIONS), device=st.sampled_from(["cpu", "meta"]))
def test_a_precision_is_one_record_whatever_form_its_device_is_given_in(name: str, device: str) -> None:
    precision = Precision.of(name, device)
    assert precision == Precision.of(name, torch.device(device))
    assert (precision.name, precision.device, precision.dtype) == (name, torch.device(device), DTYPES[name])
    assert precision.loss_scaling is (name == "fp16-mixed")


@pytest.mark.parametrize("name", PRECISIONS)
def test_autocast_computes_in_the_precisions_dtype_and_fp32_has_none(name: str) -> None:
    precision = Precision.of(name, "cpu")
    weight, inputs = torch.randn(3, 4), torch.randn(2, 4)
    with precision.autocast():
        outputs = torch.nn.functional.linear(inputs, weight)
        assert torch.is_autocast_enabled("cpu") is (name != "fp32")
    assert outputs.dtype == DTYPES[name]


@pytest.mark.parametrize("name", PRECISIONS)
def test_only_fp16_scales_the_loss_and_starts_with_the_scale_in_hparams(name: str) -> None:
    precision = Precision.of(name, "cpu")
    if name != "fp16-mixed":
        assert precision.loss_scale() is None and precision.loss_scale_entries() == {}
        return
    assert precision.loss_scale() == DynamicLossScale()
    entries = precision.loss_scale_entries()
    assert set(entries) == {LOSS_SCALE, GROWTH_TRACKER}
    assert float(entries[LOSS_SCALE]) == 2.0**16 and entries[LOSS_SCALE].dtype == torch.float32
    assert int(entries[GROWTH_TRACKER]) == 0 and entries[GROWTH_TRACKER].dtype == torch.int32


@pytest.mark.parametrize(("name", "check"), [("bf16-mixed", "_is_mkldnn_bf16_supported"), ("fp16-mixed", "_is_mkldnn_fp16_supported")])
def test_a_cpu_without_the_16_bit_formats_instructions_emulates_it_and_says_why(
    monkeypatch: pytest.MonkeyPatch, name: str, check: str
) -> None:
    monkeypatch.setattr(torch.ops.mkldnn, check, lambda: False)
    slow = Precision.of(name, "cpu").emulated()
    assert slow is not None and slow.startswith(f"precision={name!r} on this CPU, which lacks instructions")
    assert Precision.of("fp32", "cpu").emulated() is None
    assert Precision.of(name, "meta").emulated() is None  # not a CPU
    monkeypatch.setattr(torch.ops.mkldnn, check, lambda: True)
    assert Precision.of(name, "cpu").emulated() is None


@pytest.mark.parametrize(
    ("name", "device", "error", "message"),
    [
        ("bf16", "cpu", ValueError, r"^precision='bf16' must be one of fp32, bf16-mixed, fp16-mixed$"),
        (None, "cpu", ValueError, r"^precision=None must be one of"),
        ("fp32", 0, TypeError, r"^device=0: expected a torch.device or a device name"),
    ],
)
def test_a_bad_name_or_device_is_refused_naming_it(name: object, device: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Precision.of(name, device)  # type: ignore[arg-type]
