"""ALiBi, GatedLinearUnits and LowPrecisionLayerNorm on Hugging Face BERT, GPT-2 and Llama (random weights).

The reference for ALiBi's attention is the formula itself, computed here from the module's own projections;
the equality with Composer's BERT surgery is ``benchmarks/hf_surgery_vs_composer.py`` (Composer's surgery needs an
older ``transformers`` than the suite runs).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from composer_fn.algorithms import Alibi, GatedLinearUnits, LowPrecisionLayerNorm
from composer_fn.algorithms._transformers import GatedIntermediate, GatedMLP, NoRotation, ZeroPositions
from composer_fn.algorithms.alibi import AlibiBias, alibi_slopes, apply_alibi
from composer_fn.algorithms.gated_linear_units import apply_gated_linear_units, feed_forward_parameter_change
from composer_fn.algorithms.low_precision_layernorm import (
    LPLayerNorm,
    LPRMSNorm,
    apply_low_precision_layernorm,
)
from composer_fn.core import random as R
from composer_fn.testing.models import VOCAB, language_model, token_batches
from composer_fn.trainer import Trainer

pytest.importorskip("transformers")

MODELS = ("gpt2", "bert-mlm", "llama")
CAUSAL = ("gpt2", "llama")


def _outputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _batch(length: int = 40) -> dict[str, torch.Tensor]:
    return token_batches(1, batch_size=3, length=length, seed=5)[0]


@pytest.mark.parametrize("name", MODELS)
def test_alibi_gives_sdpa_and_eager_attention_the_same_bias(name: str) -> None:
    sdpa = language_model(name, attn_implementation="sdpa")
    eager = language_model(name, attn_implementation="eager")
    eager.load_state_dict(sdpa.state_dict())
    batch = _batch()
    # 40 tokens: longer than the 32 positions the models were built with.
    with_sdpa, with_eager = _outputs(apply_alibi(sdpa, 64), batch), _outputs(apply_alibi(eager, 64), batch)
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(with_sdpa[keep], with_eager[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", MODELS)
def test_alibi_removes_positions_adds_the_bias_and_leaves_the_model_untouched(
    name: str, implementation: str
) -> None:
    model = language_model(name, attn_implementation=implementation)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rewritten = apply_alibi(model, 64)
    assert model.config._attn_implementation == implementation
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert rewritten.config._attn_implementation == f"composer_fn_alibi_{implementation}"
    assert sum(isinstance(m, AlibiBias) for m in rewritten.modules()) == 2
    removed = NoRotation if name == "llama" else ZeroPositions
    assert sum(isinstance(m, removed) for m in rewritten.modules()) == 1
    batch = _batch(24)
    assert not torch.allclose(_outputs(model, batch), _outputs(rewritten, batch))
    # Applied twice equals applied once.
    again = apply_alibi(rewritten, 64)
    assert sum(isinstance(m, AlibiBias) for m in again.modules()) == 2
    torch.testing.assert_close(_outputs(again, batch), _outputs(rewritten, batch), rtol=0, atol=0)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", MODELS)
def test_alibi_models_ignore_padding_and_causal_ones_never_see_the_future(
    name: str, implementation: str
) -> None:
    model = apply_alibi(language_model(name, attn_implementation=implementation), 64)
    batch = _batch()
    changed = dict(batch, input_ids=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 7))
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(
        _outputs(model, batch)[keep], _outputs(model, changed)[keep], rtol=0, atol=1e-6
    )
    if name in CAUSAL:
        full = {k: v[:, :30] for k, v in _batch().items()}
        full["attention_mask"] = torch.ones_like(full["attention_mask"])
        future = dict(full, input_ids=full["input_ids"].clone())
        future["input_ids"][:, 20:] = 5
        torch.testing.assert_close(
            _outputs(model, full)[:, :20], _outputs(model, future)[:, :20], rtol=0, atol=1e-6
        )


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_bert_alibi_attention_computes_the_biased_softmax_of_its_projections(implementation: str) -> None:
    model = apply_alibi(language_model("bert-mlm", attn_implementation=implementation), 64).eval()
    layer = model.bert.encoder.layer[0].attention.self
    hidden = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(0))
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[1, 9:] = False
    mask = torch.zeros(2, 1, 12, 12).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    if implementation == "sdpa":
        mask_arg: torch.Tensor = keep[:, None, None, :].expand(2, 1, 12, 12)
    else:
        mask_arg = mask
    with torch.no_grad():
        out, _ = layer(hidden, attention_mask=mask_arg)
        q, k, v = (p(hidden).view(2, 12, 4, 8).transpose(1, 2) for p in (layer.query, layer.key, layer.value))
        slopes = torch.tensor(alibi_slopes(4))[:, None, None]
        distance = (torch.arange(12)[None, :] - torch.arange(12)[:, None]).abs()
        scores = q @ k.transpose(-1, -2) / math.sqrt(8) - slopes * distance + mask
        expected = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 12, 32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_alibi_refuses_attention_that_takes_no_bias_and_models_it_does_not_know() -> None:
    model = language_model("gpt2")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="_attn_implementation='flash_attention_2'.*'sdpa' or 'eager'"):
        apply_alibi(model, 64)
    transformers = pytest.importorskip("transformers")
    distil = transformers.DistilBertModel(
        transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    )
    with pytest.raises(ValueError, match="model_type='distilbert'"):
        apply_alibi(distil, 64)
    upcast = language_model("gpt2", attn_implementation="eager")
    upcast.config.reorder_and_upcast_attn = True
    with pytest.raises(ValueError, match="reorder_and_upcast_attn"):
        Alibi().targets(upcast)


def test_the_alibi_algorithm_refuses_a_model_without_attention_instead_of_reshaping_its_batches() -> None:
    model = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))
    batches = [(b["input_ids"], b["input_ids"]) for b in token_batches(2)]
    with pytest.raises(ValueError, match="Alibi found no attention.*Sequential"):
        Trainer(
            model, batches, max_duration="1ba", algorithms=[Alibi()],
            loss_fn=lambda out, batch: nn.functional.cross_entropy(out.flatten(0, 1), batch[1].flatten()),
        ).fit()  # fmt: skip


@pytest.mark.parametrize("name", ["gpt2", "bert-classification"])
def test_gated_linear_units_gate_bert_and_gpt2_keeping_the_layers_after_the_gate(name: str) -> None:
    model = language_model(name)
    rewritten = apply_gated_linear_units(model, key=R.key(3))
    gated = [m for m in rewritten.modules() if isinstance(m, GatedIntermediate)]
    assert len(gated) == 2 and all(isinstance(m, GatedMLP) == (name == "gpt2") for m in gated)
    change = sum(p.numel() for p in rewritten.parameters()) - sum(p.numel() for p in model.parameters())
    d_ff = 128 if name == "gpt2" else 64
    assert change == 2 * feed_forward_parameter_change(32, d_ff)
    kept = (
        "transformer.h.0.mlp.c_proj.weight" if name == "gpt2" else "bert.encoder.layer.0.output.dense.weight"
    )
    assert torch.equal(rewritten.state_dict()[kept], model.state_dict()[kept])
    again = apply_gated_linear_units(model, key=R.key(3))
    assert all(
        torch.equal(a, b)
        for a, b in zip(rewritten.state_dict().values(), again.state_dict().values(), strict=True)
    )
    other = [
        m for m in apply_gated_linear_units(model, key=R.key(4)).modules() if isinstance(m, GatedIntermediate)
    ]
    assert not torch.equal(gated[0].gate.weight, other[0].gate.weight)
    batch = token_batches(1, kind="classification" if name != "gpt2" else "causal")[0]
    assert torch.isfinite(rewritten(**batch).loss)


def test_gated_linear_units_warn_that_llama_is_gated_already() -> None:
    with pytest.warns(UserWarning, match="LlamaMLP is gated already"):
        apply_gated_linear_units(language_model("llama"), key=R.key(0))


def test_low_precision_layernorm_converts_llamas_rms_norms_exactly_outside_autocast() -> None:
    model = language_model("llama")
    rewritten = apply_low_precision_layernorm(model)
    assert sum(isinstance(m, LPRMSNorm) for m in rewritten.modules()) == 5
    batch = _batch(12)
    torch.testing.assert_close(_outputs(rewritten, batch), _outputs(model, batch), rtol=0, atol=0)
    norm = rewritten.model.norm
    x = torch.randn(2, 3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(x).dtype == torch.bfloat16 and model.model.norm(x).dtype == torch.float32
        torch.testing.assert_close(norm(x).float(), model.model.norm(x), rtol=2e-2, atol=2e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(isinstance(m, LPRMSNorm) for m in apply_low_precision_layernorm(rewritten).modules()) == 5


@pytest.mark.parametrize("name", ["gpt2", "bert-mlm"])
def test_low_precision_layernorm_converts_every_layer_norm_of_gpt2_and_bert(name: str) -> None:
    model = language_model(name)
    count = sum(isinstance(m, nn.LayerNorm) for m in model.modules())
    rewritten = apply_low_precision_layernorm(model)
    assert sum(isinstance(m, LPLayerNorm) for m in rewritten.modules()) == count > 0


def test_a_torch_rms_norm_becomes_an_lp_rms_norm_equal_outside_autocast() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8, eps=1e-5))
    rewritten = apply_low_precision_layernorm(model)
    assert isinstance(rewritten[1], LPRMSNorm) and not rewritten[1].float32_statistics
    x = torch.randn(4, 8)
    assert torch.equal(rewritten(x), model(x))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_surgered_language_models_train_and_resume_from_a_checkpoint(name: str, tmp_path: object) -> None:
    algorithms = [Alibi(train_sequence_length_scaling=0.5), GatedLinearUnits(), LowPrecisionLayerNorm()]
    batches = token_batches(4, length=16)

    def trainer(**options: object) -> Trainer:
        return Trainer(
            language_model(name), batches, max_duration="4ba", algorithms=algorithms, seed=1,
            save_folder=str(tmp_path), save_interval="2ba", **options,
        )  # fmt: skip

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Llama's MLP is gated already
        whole = trainer()
        whole.fit()
        resumed = trainer(load_path=str(tmp_path / "ep0-ba2.pt"))  # type: ignore[operator]
        resumed.fit()
    ours, theirs = whole.state.params, resumed.state.params
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(isinstance(m, AlibiBias) for m in whole.model.modules())


def test_alibi_refuses_attention_of_older_releases_that_it_could_not_give_a_bias() -> None:
    # transformers releases whose attention forward computes the scores itself (BERT before it called the
    # attention interface), or whose GPT-2 masks with a buffer of its positions, are refused, not left silent.
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    class OwnAttention(GPT2Attention):
        def forward(self, *args: object, **kwargs: object) -> object:
            return nn.Module.__call__  # a forward that never reaches the interface

    model = language_model("gpt2")
    model.transformer.h[0].attn.__class__ = OwnAttention
    with pytest.raises(ValueError, match="OwnAttention.forward of transformers .* computes attention itself"):
        apply_alibi(model, 64)
    capped = language_model("gpt2")
    for block in capped.transformer.h:
        block.attn.register_buffer("bias", torch.ones(1, 1, 32, 32, dtype=torch.bool).tril(), persistent=False)
    with pytest.raises(ValueError, match=r"max_sequence_length=64: GPT2Attention .* buffer of 32 positions"):
        apply_alibi(capped, 64)
    assert sum(isinstance(m, AlibiBias) for m in apply_alibi(capped, 32).modules()) == 2
