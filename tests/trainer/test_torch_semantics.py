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

from composer_fn import optim
from composer_fn.testing.differential import (
    ADAMW,
    SGD_MOMENTUM,
    OptimizerPair,
    keyword_reference,
    update_errors,
)
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


def _far_from(
    ours: dict[str, torch.Tensor],
    model: Any,
    batches: list[dict[str, torch.Tensor]],
    optimizer: OptimizerPair = ADAMW,
    seed: int | None = None,
) -> dict[str, Any]:
    # The parameters further from the torch.optim loop's than a small tolerance plus ten times torch's own fp32
    # distance from float64 arithmetic there (a bias whose gradient is zero but for rounding, such as an
    # attention's key bias, moves by rounding noise alone, which AdamW scales up to whole steps).
    initial = _tensors(model)
    expected = _tensors(keyword_reference(model, batches, optimizer, seed=seed))
    errors = update_errors(initial, ours, expected)
    exact = keyword_reference(model, batches, optimizer, seed=seed, float64=True)
    rounding = update_errors(initial, expected, _tensors(exact))
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


def test_a_run_lengthened_by_fit_duration_trains_as_one_torch_optim_loop_over_all_its_batches() -> None:
    # 3 steps, then fit(duration='3ba') for 3 more: the loop's 6 steps on the same batches, dropout's draws included.
    model = language_model("gpt2", dropout=0.1)
    batches = token_batches(6)
    trainer = Trainer(
        copy.deepcopy(model), batches, max_duration="3ba", optimizer=ADAMW.ours(), progress_bar=False, seed=3
    )
    trainer.fit()
    trainer.fit(duration="3ba")
    assert trainer.timestamp.batch == 6
    initial, ours = _tensors(model), dict(trainer.state.params)
    errors = update_errors(initial, ours, _tensors(keyword_reference(model, batches, ADAMW, seed=3)))
    assert max(errors.values()) < 1e-3, errors
    # Against the loop stopped after the first fit, the three more steps are seen.
    shorter = update_errors(initial, ours, _tensors(keyword_reference(model, batches[:3], ADAMW, seed=3)))
    assert max(shorter.values()) > 1e-2


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


def _labels_only_batches(steps: int, first_token: int) -> list[dict[str, torch.Tensor]]:
    # Sequence-to-sequence batches as Hugging Face makes them: the source, its mask and the labels (the model
    # builds decoder_input_ids from them); tokens from first_token up, below the special ones.
    generator = torch.Generator().manual_seed(1)
    return [
        {
            "input_ids": torch.randint(first_token, 64, (2, 8), generator=generator),
            "attention_mask": torch.ones(2, 8, dtype=torch.long),
            "labels": torch.randint(first_token, 64, (2, 5), generator=generator),
        }
        for _ in range(steps)
    ]


def test_a_sequence_to_sequence_model_trains_on_labels_only_batches_as_its_torch_optim_loop() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config)
    batches = _labels_only_batches(3, first_token=1)
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


def test_bart_layers_its_layerdrop_skips_train_as_a_torch_optim_loop_seeded_as_the_run_seeds(tmp_path: Path) -> None:
    # Bart's LayerDrop skips a layer when a draw from torch's generator falls below the rate: that layer gets no
    # gradient on that step, so AdamW's decay, moments and step count leave it alone there (torch.optim's
    # ``.grad is None``), while it trains on the other steps. Compared through the module handed back.
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=3, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.5, decoder_layerdrop=0.5,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    model = transformers.BartForConditionalGeneration(config)
    batches = _labels_only_batches(6, first_token=3)
    decayed = OptimizerPair(
        "adamw", lambda: optim.adamw(0.01, weight_decay=0.1),
        lambda parameters: torch.optim.AdamW(parameters, lr=0.01, weight_decay=0.1),
    )  # fmt: skip
    trainer = Trainer(
        copy.deepcopy(model), batches, max_duration="6ba", optimizer=decayed.ours(), progress_bar=False, seed=3,
        save_folder=tmp_path, save_interval="6ba",
    )  # fmt: skip
    trainer.fit()
    for returned in (trainer.model, load_model(tmp_path / "latest.pt", model)):
        assert not _far_from(_tensors(returned), model, batches, decayed, seed=3)
    # LayerDrop skipped layers on some steps: their own step counts say so.
    counts = {name.rpartition(".self_attn")[0]: int(c) for name, c in trainer.state.opt["adam"].count.items() if name.endswith("self_attn.k_proj.weight")}
    assert any(0 < count < 6 for count in counts.values()), counts


class _SometimesUsed(torch.nn.Module):
    """A layer its forward never calls, and one it calls when the batch's first value is positive: parameters
    that get a gradient on no step, and on some steps only."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(4, 3)
        self.spare = torch.nn.Linear(4, 3)
        self.sometimes = torch.nn.Linear(4, 3)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = self.used(input)
        return output + self.sometimes(input) if bool(input[0, 0] > 0) else output


class _NeverCalled(_SometimesUsed):
    """The same layers, the forward calling ``used`` alone (a static graph, as compiling needs)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = self.used(input)
        return output


def _sometimes_reference(model: torch.nn.Module, batches: list[Any], optimizer: Any, micro: int | None) -> dict[str, torch.Tensor]:
    trained = copy.deepcopy(model)
    steps = optimizer(trained.parameters())
    for inputs, targets in batches:
        steps.zero_grad(set_to_none=True)
        size = micro or len(inputs)
        for start in range(0, len(inputs), size):
            part = slice(start, start + size)
            (torch.nn.functional.cross_entropy(trained(inputs[part]), targets[part]) * (size / len(inputs))).backward()
        steps.step()
    return _tensors(trained)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: optim.adamw(0.1, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1)),
        (
            lambda: optim.sgd(0.1, momentum=0.9, dampening=0.5, weight_decay=0.1),
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.1),
        ),
    ],
    ids=["adamw", "sgd"],
)
@pytest.mark.parametrize("micro", [None, 4], ids=["whole", "microbatched"])
def test_parameters_without_a_gradient_are_left_as_torch_optim_leaves_them(ours: Any, theirs: Any, micro: int | None) -> None:
    # On no step (no decay, no moments) or on some steps only (its own step count and first momentum buffer).
    torch.manual_seed(0)
    model = _SometimesUsed()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)) for _ in range(8)]
    trainer = Trainer(
        copy.deepcopy(model), batches, max_duration="8ba", optimizer=ours(), progress_bar=False,
        device_train_microbatch_size=micro,
    )  # fmt: skip
    trainer.fit()
    expected = _sometimes_reference(model, batches, theirs, micro)
    got = _tensors(trainer.model)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)
    assert torch.equal(got["spare.weight"], model.spare.weight)


@pytest.mark.slow
def test_a_compiled_step_leaves_a_layer_the_forward_never_calls_as_torch_optim_does() -> None:
    torch.manual_seed(0)
    model = _NeverCalled()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)) for _ in range(4)]
    trainer = Trainer(
        copy.deepcopy(model), batches, max_duration="4ba", optimizer=optim.adamw(0.1, weight_decay=0.1),
        compile="aot_eager", progress_bar=False,
    )  # fmt: skip
    trainer.fit()
    expected = _sometimes_reference(model, batches, lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1), None)
    got = _tensors(trainer.model)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)
    assert trainer.state.opt["adam"].count["spare.weight"].item() == 0


def _largest_failing(model: torch.nn.Module, sizes: list[tuple[int, int]]) -> tuple[int, int] | None:
    # The library itself as the reference: real forwards of two images at each size, largest first, in training.
    probe = copy.deepcopy(model).train()
    with torch.no_grad():
        for size in sizes:
            try:
                probe(torch.zeros(2, 3, *size))
            except Exception:  # noqa: BLE001 -- any failure of the library's forward is what the check must find
                return size
    return None


@pytest.mark.parametrize(("name", "size"), [("inception_v3", 299), ("maxvit_t", 224), ("levit_128s", 224)])
def test_progressive_resizing_refuses_a_model_that_fails_at_a_size_the_run_visits_naming_it(name: str, size: int) -> None:
    # Declared nowhere: Inception v3's auxiliary head outgrows its feature map below 299 pixels, MaxViT's windows
    # tile its stages at multiples of 224 only, LeViT's attention biases hold one resolution. Refused before the
    # first step, naming the largest size at which the library's own forward fails.
    import timm
    import torchvision

    from composer_fn.algorithms import ProgressiveResizing
    from composer_fn.algorithms.progressive_resizing import visited_sizes

    torch.manual_seed(0)
    if name == "levit_128s":
        model = timm.create_model(name, pretrained=False, num_classes=4)
    else:
        extra = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
        model = torchvision.models.get_model(name, weights=None, num_classes=4, **extra)
    failing = _largest_failing(model, visited_sizes(size, size, 0.5))
    assert failing is not None and failing != (size, size)
    batches = [(torch.rand(2, 3, size, size), torch.tensor([0, 1]))]
    trainer = Trainer(
        model, batches, max_duration="1ba", algorithms=[ProgressiveResizing()], optimizer=optim.sgd(0.1),
        progress_bar=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match=rf"fails on {failing[0]}x{failing[1]} inputs .*ProgressiveResizing out"):
        trainer.fit()
    assert trainer.timestamp.batch == 0


def _resnet_with_an_unpadded_head() -> torch.nn.Module:
    # torchvision's ResNet-18 with an unpadded 3x3 convolution on its last feature map, ceil(size / 32) wide: inputs
    # whose map is narrower than 3 fail inside torch's convolution.
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=4)
    model.avgpool = torch.nn.Sequential(torch.nn.Conv2d(512, 512, 3), torch.nn.AdaptiveAvgPool2d(1))
    return model


def test_progressive_resizing_names_the_initial_scale_whose_sizes_all_pass() -> None:
    # torchvision's ResNet-18 with an unpadded 3×3 convolution on its last feature map, ceil(size / 32) wide: the
    # sizes whose map is narrower than 3 fail, and the suggested scale visits the smallest one that passes.
    import math

    from composer_fn.algorithms import ProgressiveResizing
    from composer_fn.algorithms.progressive_resizing import pinned_size, visited_sizes

    model = _resnet_with_an_unpadded_head()
    sizes = visited_sizes(128, 128, 0.25)
    failing = next(size for size in sizes if math.ceil(size[1] / 32) < 3)
    passing = sizes[sizes.index(failing) - 1]
    scale = math.ceil(passing[1] / 128 * 100) / 100
    assert pinned_size(128, 128, scale) == passing
    batches = [(torch.rand(2, 3, 128, 128), torch.tensor([0, 1]))]
    trainer = Trainer(
        model, batches, max_duration="1ba", algorithms=[ProgressiveResizing(initial_scale=0.25)],
        optimizer=optim.sgd(0.1), progress_bar=False,
    )  # fmt: skip
    expected = rf"from 32x32 up to 128x128, .* fails on {failing[0]}x{failing[1]} inputs .*initial_scale={scale} or more"
    with pytest.raises(ValueError, match=expected):
        trainer.fit()


def _library_fails(model: torch.nn.Module, shape: tuple[int, ...]) -> bool:
    # The library itself as the reference: a real forward at ``shape``, in training, without gradients.
    probe = copy.deepcopy(model).train()
    with torch.no_grad():
        try:
            probe(torch.zeros(shape))
        except Exception:  # noqa: BLE001 -- any failure of the library's forward is what the check must find
            return True
    return False


def _torchvision_model(name: str) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    extra = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
    return torchvision.models.get_model(name, weights=None, num_classes=4, **extra)


@pytest.mark.parametrize(("name", "size"), [("inception_v3", 299), ("maxvit_t", 224)])
def test_colout_refuses_a_model_that_fails_on_the_cut_images_naming_the_size(name: str, size: int) -> None:
    # ColOut keeps int(0.85 * size) rows and columns: Inception v3's auxiliary kernel outgrows the smaller feature
    # map, MaxViT's windows no longer tile it. Refused before the first step instead of failing inside torchvision.
    from composer_fn.algorithms import ColOut

    model = _torchvision_model(name)
    kept = int(0.85 * size)
    assert not _library_fails(model, (2, 3, size, size)) and _library_fails(model, (2, 3, kept, kept))
    batches = [(torch.rand(2, 3, size, size), torch.tensor([0, 1]))]
    trainer = Trainer(
        model, batches, max_duration="1ba", algorithms=[ColOut()], optimizer=optim.sgd(0.1), progress_bar=False
    )
    with pytest.raises(ValueError, match=rf"cuts the {size}x{size} images to {kept}x{kept}, .* fails on .*ColOut out"):
        trainer.fit()
    assert trainer.timestamp.batch == 0


def test_selective_backprop_refuses_a_kept_batch_the_model_cannot_take_before_the_first_step() -> None:
    # Inception v3's auxiliary BatchNorm sees a 1x1 map: one kept sample of two gives it one value per channel.
    # Pruning starts at half the run; the refusal comes at its first batch.
    from composer_fn.algorithms import SelectiveBackprop

    model = _torchvision_model("inception_v3")
    assert not _library_fails(model, (2, 3, 299, 299)) and _library_fails(model, (1, 3, 299, 299))
    batches = [(torch.rand(2, 3, 299, 299), torch.tensor([0, 1]))] * 4
    trainer = Trainer(
        model, batches, max_duration="4ba", algorithms=[SelectiveBackprop()], optimizer=optim.sgd(0.1),
        progress_bar=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"trains on 1 of the batch's 2 samples, but Inception3 fails on a batch of 1"):
        trainer.fit()
    assert trainer.timestamp.batch == 0


def test_selective_backprop_refuses_a_scoring_size_the_model_cannot_take() -> None:
    # Scoring at half of 128 leaves the unpadded head's map 2 wide. Keeping half of 4 samples passes; the scoring
    # size is what is named.
    from composer_fn.algorithms import SelectiveBackprop

    model = _resnet_with_an_unpadded_head()
    assert not _library_fails(model, (2, 3, 128, 128)) and _library_fails(model, (4, 3, 64, 64))
    batches = [(torch.rand(4, 3, 128, 128), torch.tensor([0, 1, 2, 3]))] * 2
    trainer = Trainer(
        model, batches, max_duration="2ba", algorithms=[SelectiveBackprop(scale_factor=0.5)], optimizer=optim.sgd(0.1),
        progress_bar=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"scale_factor=0\.5\) scores the batch at 64x64, but ResNet fails"):
        trainer.fit()
    assert trainer.timestamp.batch == 0


def test_selective_backprop_checks_nothing_in_a_run_that_never_prunes() -> None:
    # One batch at 0% of the run: the interval [0.5, 0.9) holds no batch, so the scoring size is never used.
    from composer_fn.algorithms import SelectiveBackprop

    model = _resnet_with_an_unpadded_head()
    batches = [(torch.rand(4, 3, 128, 128), torch.tensor([0, 1, 2, 3]))]
    trainer = Trainer(
        model, batches, max_duration="1ba", algorithms=[SelectiveBackprop(scale_factor=0.5)], optimizer=optim.sgd(0.1),
        progress_bar=False,
    )  # fmt: skip
    trainer.fit()
    assert trainer.timestamp.batch == 1


def test_a_surgery_is_refused_where_the_parent_reads_the_layers_weight_itself() -> None:
    # torchvision's Swin v2 attention hands self.qkv.weight to a function instead of calling self.qkv.
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    from composer_fn.algorithms import Factorize

    torch.manual_seed(0)
    model = SwinTransformer(
        [2, 2], 64, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4], num_classes=4, block=SwinTransformerBlockV2,
        downsample_layer=PatchMergingV2,
    )  # fmt: skip
    batches = [(torch.rand(2, 3, 16, 16), torch.tensor([0, 1]))]
    with pytest.raises(ValueError, match=r"ShiftedWindowAttentionV2\.forward\(\) reads self\.qkv\.weight"):
        Trainer(
            model, batches, max_duration="1ba", optimizer=optim.sgd(0.1), progress_bar=False,
            algorithms=[Factorize(min_features=32, latent_features=0.25)],
        ).fit()  # fmt: skip
