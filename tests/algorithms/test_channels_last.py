"""ChannelsLast: a change of memory format only; outputs are those of the original model, and training is the
contiguous model's on every CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from composer_fn import Trainer, optim
from composer_fn.algorithms import ChannelsLast
from composer_fn.algorithms.channels_last import (
    _contiguous_input,
    _faulty_layers,
    channels_last_fault,
    onednn_avx2_kernels,
)
from composer_fn.core import random as R
from composer_fn.functional import apply_channels_last, channels_last_tensors
from composer_fn.models import SmallCNN
from composer_fn.testing import make_setup


@given(st.integers(0, 2**32 - 1))
def test_channels_last_model_gives_the_original_outputs(seed) -> None:
    model = SmallCNN(in_channels=3, num_classes=5, width=8).eval()
    x = R.normal(R.key(seed), (4, 3, 8, 8))
    converted = apply_channels_last(model)
    torch.testing.assert_close(converted(x), model(x), rtol=1e-5, atol=1e-6)


def test_apply_channels_last_returns_a_new_model_and_leaves_the_input_alone() -> None:
    model = SmallCNN(in_channels=3, num_classes=5, width=8)
    before = {n: (p.clone(), p.stride()) for n, p in model.named_parameters()}
    converted = apply_channels_last(model)
    assert converted is not model
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name][0]) and parameter.stride() == before[name][1]
    conv_weights = [p for p in converted.parameters() if p.dim() == 4]
    assert conv_weights and all(p.stride() == channels_last_strides(p) for p in conv_weights)


def test_the_algorithm_converts_4d_parameters_at_init_and_keeps_their_values() -> None:
    plain = make_setup([])
    converted = make_setup([ChannelsLast()])
    for name, tensor in converted.state.params.items():
        assert torch.equal(tensor, plain.state.params[name])
        if tensor.dim() == 4:
            assert tensor.stride() == channels_last_strides(tensor)


def channels_last_strides(tensor: torch.Tensor) -> tuple[int, ...]:
    return torch.empty(tensor.shape, memory_format=torch.channels_last).stride()


def contiguous_strides(tensor: torch.Tensor) -> tuple[int, ...]:
    return torch.empty(tensor.shape).stride()


@given(st.tuples(*(st.integers(1, 4) for _ in range(4))), st.sampled_from([torch.contiguous_format, torch.channels_last]))
def test_channels_last_tensors_gives_every_4d_tensor_torchs_channels_last_strides(shape, memory_format) -> None:
    # Also where a dimension of size 1 makes is_contiguous true in both formats (a grayscale model's first
    # convolution): the strides are what tells a convolution which kernels to run.
    given_tensor = torch.arange(float(torch.Size(shape).numel())).reshape(shape).contiguous(memory_format=memory_format)
    strides = given_tensor.stride()
    converted = channels_last_tensors({"w": given_tensor})["w"]
    assert converted.stride() == channels_last_strides(given_tensor)
    assert torch.equal(converted, given_tensor) and given_tensor.stride() == strides
    assert channels_last_tensors({"w": converted})["w"] is converted


def test_a_one_channel_weight_is_converted_as_module_to_converts_it() -> None:
    layer = nn.Conv2d(1, 16, 5)
    weight = channels_last_tensors({"weight": layer.weight.detach()})["weight"]
    assert layer.weight.detach().contiguous(memory_format=torch.channels_last).stride() == (25, 25, 5, 1)
    assert weight.stride() == layer.to(memory_format=torch.channels_last).weight.stride() == (25, 1, 5, 1)


def test_the_guard_gives_a_one_channel_channels_last_input_contiguous_strides() -> None:
    x = R.normal(R.key(0), (2, 1, 6, 6)).clone(memory_format=torch.channels_last)
    assert x.is_contiguous() and x.stride() != contiguous_strides(x)
    (guarded,) = _contiguous_input(nn.Conv2d(1, 8, 1, stride=2), (x,))
    assert guarded.stride() == contiguous_strides(x) and torch.equal(guarded, x)
    plain = R.normal(R.key(0), (2, 1, 6, 6))
    assert _contiguous_input(nn.Conv2d(1, 8, 1, stride=2), (plain,))[0] is plain


def test_channels_last_tensors_keeps_other_ranks_as_they_are() -> None:
    tensors = {"w": torch.zeros(2, 3, 4, 5), "b": torch.zeros(3)}
    converted = channels_last_tensors(tensors)
    assert converted["b"] is tensors["b"]
    assert converted["w"].is_contiguous(memory_format=torch.channels_last)
    assert tensors["w"].is_contiguous()


# The oneDNN fault: its AVX2 weight-gradient kernel for 1×1 strided convolutions with fewer than 8 input
# channels writes past its workspace in channels-last format (benchmarks/channels_last_sweep.py).

FAULTY_RUN = """
import copy, sys, warnings
import torch
from torch import nn
torch.set_num_threads(int(sys.argv[1]))
from composer_fn import Trainer, optim
from composer_fn.algorithms import ChannelsLast
from composer_fn.functional import apply_channels_last
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 1, stride=2), nn.ReLU(), nn.Flatten(),
                      nn.Linear(8 * 4 * 4, 10))
generator = torch.Generator().manual_seed(0)
batches = [(torch.randn(8, 4, 10, 10, generator=generator), torch.randint(0, 10, (8,), generator=generator))
           for _ in range(3)]
results = []
for algorithms, module in (([], copy.deepcopy(model)), ([ChannelsLast()], copy.deepcopy(model)),
                          ([], None)):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = module if module is not None else apply_channels_last(model)  # its own copy, guarded
        trainer = Trainer(module, batches, max_duration="3ba", optimizer=optim.sgd(0.1, momentum=0.9),
                          algorithms=algorithms, progress_bar=False)
    print("WARNING", [str(w.message) for w in caught if "ChannelsLast" in str(w.message)])
    trainer.fit()
    results.append(trainer.state.params)
plain, *converted = results
for run in converted:
    assert all(torch.allclose(run[n], plain[n], rtol=1e-5, atol=1e-5) for n in plain), "ChannelsLast changed the run"
print("SAME")
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_channels_last_trains_as_the_contiguous_run_on_onednns_avx2_kernels(threads: int, tmp_path: Path) -> None:
    # ONEDNN_MAX_CPU_ISA=AVX2 makes an AVX-512 machine take the AVX2 kernels (on an AVX2 machine, its own). Unguarded,
    # one thread corrupts the heap and aborts; two train on wrong gradients.
    script = tmp_path / "run.py"
    script.write_text(FAULTY_RUN)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, str(script), str(threads)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "SAME" in done.stdout, done.stdout + done.stderr
    if onednn_avx2_kernels_in(env):
        assert done.stdout.count("keeps 1 layer(s) in contiguous format on this CPU (2)") == 2


def onednn_avx2_kernels_in(env: dict[str, str]) -> bool:
    code = "from composer_fn.algorithms.channels_last import onednn_avx2_kernels; print(onednn_avx2_kernels())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "True"


@pytest.mark.parametrize(
    ("layer", "faulty"),
    [
        (nn.Conv2d(4, 8, 1, stride=2), True),
        (nn.Conv2d(7, 16, 1, stride=(2, 1)), True),
        (nn.Conv2d(1, 1, 1, stride=2), True),
        (nn.Conv2d(8, 8, 1, stride=2), False),
        (nn.Conv2d(4, 8, 1, stride=1), False),
        (nn.Conv2d(4, 8, 1, stride=2, padding=1), False),
        (nn.Conv2d(4, 8, 3, stride=2), False),
        (nn.Conv2d(4, 4, 1, stride=2, groups=4), False),
        (nn.Conv2d(4, 8, 1, stride=2, groups=2), False),
        (nn.Linear(4, 8), False),
    ],
)
def test_the_faulty_layers_are_the_strided_unpadded_1x1_convolutions_with_under_8_input_channels(
    layer: nn.Module, faulty: bool
) -> None:
    assert channels_last_fault(layer) is faulty


@pytest.mark.parametrize(
    ("capability", "cap", "expected"),
    [
        ("AVX2", "", True),
        ("AVX2", "AVX2", True),
        ("AVX2", "AVX512_CORE", True),
        ("AVX2", "SSE41", False),
        ("AVX2", "avx", False),
        ("AVX512", "", False),
        ("AVX512", "AVX2", True),
        ("AVX512", "avx2_vnni", True),
        ("AVX512", "AVX512_CORE", False),
        ("DEFAULT", "", False),
    ],
)
def test_onednns_avx2_kernels_are_those_of_an_avx2_cpu_or_of_an_isa_capped_at_avx2(
    capability: str, cap: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert onednn_avx2_kernels() is expected


def _faulty_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 1, stride=2), nn.Flatten(), nn.LazyLinear(5))


def test_on_avx2_kernels_the_faulty_layers_stay_contiguous_with_a_warning_and_every_other_is_converted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("composer_fn.algorithms.channels_last.onednn_avx2_kernels", lambda: True)
    model = _faulty_model()
    x = R.normal(R.key(3), (2, 3, 9, 9))
    expected = model(x)
    with pytest.warns(UserWarning, match=r"keeps 1 layer\(s\) in contiguous format on this CPU \(2\).*rtus workspace"):
        converted = apply_channels_last(model)
    assert converted[0].weight.stride() == channels_last_strides(converted[0].weight) != contiguous_strides(model[0].weight)
    # A 1×1 kernel's weight is contiguous by is_contiguous in either format: only contiguous strides keep the
    # convolution on the NCHW kernels.
    assert converted[2].weight.stride() == contiguous_strides(converted[2].weight) and not model[2]._forward_pre_hooks
    seen = []
    converted[2].register_forward_pre_hook(lambda module, args: seen.append(args[0].stride() == contiguous_strides(args[0])))
    torch.testing.assert_close(converted(x.contiguous(memory_format=torch.channels_last)), expected)
    assert seen == [True]


def test_the_algorithm_keeps_the_faulty_layers_contiguous_on_avx2_kernels_and_leaves_the_model_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("composer_fn.algorithms.channels_last.onednn_avx2_kernels", lambda: True)
    model = _faulty_model()
    model(torch.zeros(1, 3, 9, 9))
    batches = [(R.normal(R.key(1), (4, 3, 9, 9)), torch.tensor([0, 1, 2, 3]))]
    with pytest.warns(UserWarning, match=r"\(2\)"):
        trainer = Trainer(model, batches, max_duration="1ba", algorithms=[ChannelsLast()], progress_bar=False,
                          optimizer=optim.sgd(0.1))  # fmt: skip
    params = trainer.state.params
    assert params["2.weight"].stride() == contiguous_strides(params["2.weight"])
    assert params["0.weight"].stride() == channels_last_strides(params["0.weight"])
    assert trainer.static.module is not model and not model[2]._forward_pre_hooks
    assert len(trainer.static.module[2]._forward_pre_hooks) == 1


def test_off_the_cpu_or_its_avx2_kernels_no_layer_is_kept_back(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _faulty_model()
    monkeypatch.setattr("composer_fn.algorithms.channels_last.onednn_avx2_kernels", lambda: True)
    assert _faulty_layers(model, torch.device("cuda")) == ()
    assert _faulty_layers(model, torch.device("cpu")) == ("2",)
    monkeypatch.setattr("composer_fn.algorithms.channels_last.onednn_avx2_kernels", lambda: False)
    assert _faulty_layers(model, torch.device("cpu")) == ()
