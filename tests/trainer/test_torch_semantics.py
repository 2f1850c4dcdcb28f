"""Where the trainer stands in for torch, torch's semantics hold: a tied weight stays one tensor in the model handed
back, and the model's own random layers draw from the run's seed, as a seeded ``torch.optim`` loop draws.

Models are Hugging Face's at tiny sizes (random weights, no download); the reference is a hand-written
``torch.optim`` loop on the same batches (``composer_fn.testing.differential.keyword_reference``).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from composer_fn.testing.differential import ADAMW, SGD_MOMENTUM, keyword_reference, update_errors
from composer_fn.testing.models import language_model, token_batches
from composer_fn.trainer import Trainer
from composer_fn.trainer.model import load_model
from composer_fn.trainer.outputs import default_per_sample_loss
from composer_fn.trainer.randomness import model_seed

pytest.importorskip("transformers")

TIES = {
    "gpt2": ("lm_head.weight", "transformer.wte.weight"),
    "bert-mlm": ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
}


def _trained(model: Any, batches: list[dict[str, torch.Tensor]], **options: Any) -> Trainer:
    trainer = Trainer(
        copy.deepcopy(model), batches, max_duration=f"{len(batches)}ba", optimizer=ADAMW.ours(), progress_bar=False,
        **options,
    )  # fmt: skip
    trainer.fit()
    return trainer


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in module.named_parameters()}


def _far_from(ours: dict[str, torch.Tensor], model: Any, batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    # The parameters further from the torch.optim loop's than a small tolerance plus ten times torch's own fp32
    # distance from float64 arithmetic there (a bias whose gradient is zero but for rounding, such as an
    # attention's key bias, moves by rounding noise alone, which AdamW scales up to whole steps).
    initial = _tensors(model)
    expected = _tensors(keyword_reference(model, batches, ADAMW))
    errors = update_errors(initial, ours, expected)
    rounding = update_errors(initial, expected, _tensors(keyword_reference(model, batches, ADAMW, float64=True)))
    return {name: (error, rounding[name]) for name, error in errors.items() if error > 1e-5 + 10 * rounding[name]}


@pytest.mark.parametrize("name", sorted(TIES))
def test_a_tied_language_model_comes_back_tied_holding_what_its_torch_optim_loop_trains(
    name: str, tmp_path: Path
) -> None:
    model = language_model(name)
    batches = token_batches(6, kind="masked" if name == "bert-mlm" else "causal")
    head, embedding = TIES[name]
    assert model.get_parameter(head) is model.get_parameter(embedding)
    trainer = _trained(model, batches, save_folder=tmp_path, save_interval="6ba")
    for returned in (trainer.model, load_model(tmp_path / "latest.pt", model)):
        assert returned.get_parameter(head) is returned.get_parameter(embedding)
        assert not _far_from(_tensors(returned), model, batches)
    inputs = {k: v for k, v in batches[0].items() if k != "labels"}
    with torch.no_grad():
        logits = trainer.model(**inputs).logits
    assert torch.equal(logits, trainer.predict([inputs])[0].logits)


def test_a_surgery_that_would_split_a_tie_is_refused_naming_the_layer() -> None:
    from composer_fn.algorithms import Factorize

    model = language_model("gpt2")
    with pytest.raises(ValueError, match=r"Factorize would rewrite 'lm_head', whose tensor .* is tied"):
        Trainer(
            model, token_batches(1), max_duration="1ba", optimizer=ADAMW.ours(), progress_bar=False,
            algorithms=[Factorize(min_features=8, latent_features=4)],
        )  # fmt: skip


def test_a_model_with_dropout_trains_as_a_torch_optim_loop_seeded_as_the_run_seeds() -> None:
    model = language_model("gpt2", dropout=0.1)
    batches = token_batches(5)
    initial = _tensors(model)
    ours = dict(_trained(model, batches, seed=3).state.params)
    errors = update_errors(initial, ours, _tensors(keyword_reference(model, batches, ADAMW, seed=3)))
    assert max(errors.values()) < 1e-3, errors
    # Other masks move the weights far apart: the comparison sees the draws.
    other = update_errors(initial, ours, _tensors(keyword_reference(model, batches, ADAMW, seed=4)))
    assert max(other.values()) > 1e-2


def test_two_runs_of_one_seed_with_dropout_are_bitwise_equal_and_leave_torchs_generator_alone() -> None:
    model = language_model("gpt2", dropout=0.1)
    batches = token_batches(4)
    torch.manual_seed(11)
    first = _trained(model, batches)
    after = torch.rand(3)
    torch.manual_seed(12)
    second = _trained(model, batches)
    for name, tensor in first.state.params.items():
        assert torch.equal(tensor, second.state.params[name]), name
    torch.manual_seed(11)
    assert torch.equal(torch.rand(3), after)


def test_a_run_with_dropout_resumed_from_a_checkpoint_is_bitwise_the_uninterrupted_run(tmp_path: Path) -> None:
    model = language_model("gpt2", dropout=0.1)
    batches = token_batches(3)
    whole = Trainer(
        copy.deepcopy(model), batches, max_duration="6ba", optimizer=ADAMW.ours(), progress_bar=False,
        save_folder=tmp_path, save_interval="2ba",
    )  # fmt: skip
    whole.fit()
    resumed = Trainer(
        copy.deepcopy(model), batches, max_duration="6ba", optimizer=ADAMW.ours(), progress_bar=False,
        load_path=tmp_path / "ep0-ba2.pt",
    )  # fmt: skip
    resumed.fit()
    for name, tensor in whole.state.params.items():
        assert torch.equal(tensor, resumed.state.params[name]), name


def test_a_microbatched_run_of_a_model_with_dropout_says_once_that_its_draws_follow_the_cut() -> None:
    model = language_model("gpt2", dropout=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trained(model, token_batches(3), device_train_microbatch_size=2)
    said = [w for w in caught if "draws random numbers of its own" in str(w.message)]
    assert len(said) == 1 and "microbatch" in str(said[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trained(language_model("gpt2"), token_batches(3), device_train_microbatch_size=2)
    assert not [w for w in caught if "draws random numbers of its own" in str(w.message)]


def test_training_hugging_face_models_logs_no_default_loss_line() -> None:
    # In a fresh process: transformers says a line once per process.
    script = (
        "from composer_fn.testing.models import language_model, token_batches\n"
        "from composer_fn.trainer import Trainer\n"
        "from composer_fn import optim\n"
        "for name, kind in (('gpt2', 'causal'), ('bert-classification', 'classification')):\n"
        "    batches = token_batches(2, kind=kind)\n"
        "    Trainer(language_model(name), batches, batches, max_duration='2ba', optimizer=optim.adamw(1e-3),\n"
        "            progress_bar=False).fit()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "default loss" not in done.stderr + done.stdout, done.stderr[-2000:]


def test_googlenets_auxiliary_heads_train_as_torchvisions_reference_training_weighs_them() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.googlenet(num_classes=4, aux_logits=True, init_weights=True)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 64, 64, generator=generator), torch.randint(0, 4, (4,), generator=generator))] * 2
    reference = copy.deepcopy(model).train()
    steps = SGD_MOMENTUM.reference(reference.parameters())
    for step, (images, labels) in enumerate(batches):
        torch.manual_seed(model_seed(0, step))  # its dropout draws as a seed-0 run's
        steps.zero_grad(set_to_none=True)
        outputs = reference(images)
        cross_entropy = torch.nn.functional.cross_entropy
        loss = cross_entropy(outputs.logits, labels)
        loss = loss + 0.3 * cross_entropy(outputs.aux_logits1, labels) + 0.3 * cross_entropy(outputs.aux_logits2, labels)
        loss.backward()
        steps.step()
    # SGD: AdamW would scale the rounding noise of biases whose gradient is zero but for rounding into whole steps.
    trainer = Trainer(copy.deepcopy(model), batches, max_duration="2ba", optimizer=SGD_MOMENTUM.ours(), progress_bar=False)
    trainer.fit()
    ours = dict(trainer.state.params)
    initial = _tensors(model)
    auxiliary = [name for name in initial if name.startswith("aux")]
    assert auxiliary and all(not torch.equal(ours[name], initial[name]) for name in auxiliary)
    errors = update_errors(initial, ours, _tensors(reference))
    assert max(errors.values()) < 1e-3, sorted(errors.items(), key=lambda item: -item[1])[:3]


def test_outputs_the_default_loss_cannot_read_are_refused_naming_their_type_and_loss_fn() -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, num_classes=4, img_size=32, patch_size=8, depth=1,
        embed_dim=32, num_heads=2,
    )  # fmt: skip
    model.set_distilled_training(True)
    batches = [(torch.rand(2, 3, 32, 32), torch.tensor([0, 3]))]
    with pytest.raises(TypeError, match=r"returns a tuple of 2 items in training.*loss_fn="):
        _trained(model, batches)
    with torch.no_grad():
        outputs = model.train()(batches[0][0])
    with pytest.raises(TypeError, match=r"returns a tuple of 2 items in training.*loss_fn="):
        default_per_sample_loss(None, causal=False)(outputs, batches[0])


def test_a_sequence_to_sequence_model_trains_on_labels_only_batches_as_its_torch_optim_loop() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(1)
    batches = [
        {
            "input_ids": torch.randint(1, 64, (2, 8), generator=generator),
            "attention_mask": torch.ones(2, 8, dtype=torch.long),
            "labels": torch.randint(1, 64, (2, 5), generator=generator),
        }
        for _ in range(3)
    ]
    trainer = _trained(model, batches)
    errors = update_errors(_tensors(model), dict(trainer.state.params), _tensors(keyword_reference(model, batches, ADAMW)))
    assert max(errors.values()) < 1e-4, errors
    returned = trainer.model
    assert returned.lm_head.weight is returned.shared.weight is returned.encoder.embed_tokens.weight


@pytest.mark.parametrize("method", ["seq_length_warmup", "low_precision_layernorm"])
def test_a_method_that_changes_nothing_in_this_run_says_so(method: str) -> None:
    from composer_fn.algorithms import LowPrecisionLayerNorm, SeqLengthWarmup

    algorithm = SeqLengthWarmup() if method == "seq_length_warmup" else LowPrecisionLayerNorm()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trained(language_model("gpt2"), token_batches(3), algorithms=[algorithm])
    assert any("changes nothing" in str(w.message) and type(algorithm).__name__ in str(w.message) for w in caught)
    assert trainer.no_effect == (method,)
