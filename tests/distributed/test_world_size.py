"""An N-process run equals the one-process run with N device microbatches: bitwise, by real gloo processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from composer_fn.algorithms import EMA, ChannelsLast, CutMix, CutOut, GradientClipping, LabelSmoothing, MixUp
from composer_fn.core.random import key
from composer_fn.data import TensorLoader, load_image_folder_task, synthetic_images
from composer_fn.models.cnn import SmallCNN
from composer_fn.optim import adamw, sgd
from composer_fn.trainer import Trainer
from tests.distributed.launch import run_ranks

DATA = synthetic_images(key(1), 76, num_classes=4, shape=(1, 8, 8))
HELD_OUT = synthetic_images(key(2), 37, num_classes=4, shape=(1, 8, 8))
OPTIMIZERS = {"sgd": lambda: sgd(0.1, momentum=0.9), "adamw": lambda: adamw(0.01, weight_decay=0.01)}
# Both optimizers eagerly; compiled once (how the step is compiled does not depend on the optimizer's rule), on a
# model with a layer its forward never calls (``_WithUnusedLayers``).
RUNS = [("sgd", False), ("adamw", False), ("adamw", "aot_eager")]
# Per-example draws are made for the global batch; each microbatch reads them from its place in it.
PER_SAMPLE = ("sgd", False, "per_sample")
# Channels-last weights: the sum across processes comes back contiguous and must meet them in their layout.
CHANNELS_LAST = ("sgd", False, "channels_last")
# An image folder read by worker-less DataLoaders under the DistributedSampler of each rank.
FOLDER = ("sgd", False, "imagefolder")
# A Hugging Face GPT-2 on right-padded rows: each rank's rows hold other numbers of labelled tokens.
LANGUAGE = ("adamw", False, "gpt2")
# The same GPT-2 with its own dropout: each microbatch draws from the seed, the step and its place in the batch.
DROPOUT = ("adamw", False, "gpt2-dropout")
# Parameters without a gradient under AdamW's weight decay: a layer nothing calls, and one that a microbatch
# calls or not (so on one rank and not the other). The compiled run of RUNS has a layer nothing calls too.
UNUSED = ("adamw", False, "unused")
# A Hugging Face datasets table of packed text rows (a tokenizer trained on the corpus), read by DatasetLoader.
DATASETS = ("adamw", False, "datasets")


class _WithUnusedLayers(nn.Module):
    """A SmallCNN with a layer its forward never calls (``spare``) and, with ``sometimes``, one it calls on a
    microbatch whose first pixel is positive (``sometimes``)."""

    def __init__(self, sometimes: bool) -> None:
        super().__init__()
        self.body = SmallCNN(1, 4, width=4)
        self.spare = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)
        self.sometimes = sometimes

    def forward(self, input: Tensor) -> Tensor:
        logits: Tensor = self.body(input)
        if self.sometimes and bool(input.flatten()[0] > 0):
            logits = logits + self.extra(logits)
        return logits


def _write_folder(root: Any) -> None:
    # 60 grayscale 8x8 PNGs in 3 classes: 48 train (3 global batches of 16), 12 held out (i % 5 == 0).
    import warnings

    from torchvision.io import write_png

    images = (synthetic_images(key(3), 60, num_classes=3, shape=(1, 8, 8))[0] * 40 + 128).clamp(0, 255).to(torch.uint8)
    for index, image in enumerate(images):
        folder = root / f"class_{index % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_png(image, str(folder / f"{index:03d}.png"))


def _folder_trainer(rank: int, world: int, root: str, **arguments: Any) -> Trainer:
    task = load_image_folder_task(root, batch_size=16 // world, eval_batch_size=4, seed=7, rank=rank, world_size=world)
    return Trainer(
        SmallCNN(1, 3, width=4),
        task.train,
        task.heldout,
        max_duration="6ba",
        optimizer=sgd(0.1, momentum=0.9),
        algorithms=[MixUp(), EMA()],
        progress_bar=False,
        eval_interval="3ba",
        **arguments,
    )


def _trainer(
    rank: int, world: int, optimizer: str, compile: Any, *, batch: int = 8, heldout: Any = HELD_OUT, **arguments: Any
) -> Trainer:
    # 76 samples in global batches of 16: the fifth batch of each epoch is 12 samples, 8 on rank 0 and 4 on rank 1.
    # Held out, 37 samples in batches of 8 a process: the second rank's last share is empty.
    loader = TensorLoader(DATA, batch if world > 1 else batch * 2, seed=5, rank=rank, world_size=world)
    return Trainer(
        arguments.pop("model", None) or SmallCNN(1, 4, width=4),
        loader,
        TensorLoader(heldout, 8, shuffle=False, rank=rank, world_size=world),
        max_duration="20ba",
        optimizer=OPTIMIZERS[optimizer](),
        algorithms=arguments.pop("algorithms", [MixUp(), CutOut(), LabelSmoothing(), EMA(), GradientClipping("norm", 1.0)]),
        compile=compile,
        progress_bar=False,
        eval_interval="10ba",
        **arguments,
    )


def _lm_trainer(rank: int, world: int, dropout: float = 0.0, **arguments: Any) -> Trainer:
    from composer_fn.testing.models import tiny_gpt2, token_batches

    batches = token_batches(4, batch_size=4, length=16, seed=3)
    if world > 1:
        batches = [{name: item[rank * 2 : (rank + 1) * 2] for name, item in batch.items()} for batch in batches]
    return Trainer(
        tiny_gpt2(dropout=dropout), batches, max_duration="4ba", optimizer=adamw(0.01), progress_bar=False, seed=2,
        **arguments,
    )  # fmt: skip


def _unused_trainer(rank: int, world: int, compile: Any, **arguments: Any) -> Trainer:
    torch.manual_seed(4)
    model = _WithUnusedLayers(sometimes=not compile)
    return _trainer(rank, world, "adamw", compile, model=model, algorithms=[EMA()], **arguments)


def _run_trainer(rank: int, world: int, optimizer: str, compile: Any, **arguments: Any) -> Trainer:
    # A run of RUNS: compiled, on a model with a layer nothing calls, with a method that draws (the eager runs hold
    # the others, EMA's restart among them, which would compile a step of its own).
    if compile:
        torch.manual_seed(4)
        arguments["model"] = _WithUnusedLayers(sometimes=False)
        arguments.setdefault("algorithms", [MixUp()])
        # The uneven last training batch is kept (each rank's share recompiles); held out, whole batches only.
        arguments.setdefault("heldout", tuple(t[:32] for t in HELD_OUT))
    return _trainer(rank, world, optimizer, compile, **arguments)


def _result(trainer: Trainer) -> dict[str, Any]:
    state = trainer.state
    return {"params": state.params, "opt": state.opt, "algos": state.algos, "metrics": trainer.metrics}


def _hf_trainer(rank: int, world: int, corpus: str, **arguments: Any) -> Trainer:
    import datasets

    from composer_fn.data.hf import DatasetLoader
    from tests.data.test_hf import gpt2_for

    packed = datasets.load_from_disk(str(Path(corpus) / "packed"))
    loader = DatasetLoader(packed, 8 // world, seed=5, rank=rank, world_size=world)
    model = gpt2_for(int((Path(corpus) / "vocab").read_text()))
    return Trainer(model, loader, max_duration="4ba", optimizer=adamw(0.01), progress_bar=False, seed=2, **arguments)


def _train_each(rank: int, root: str, corpus: str | None) -> dict[tuple[str, Any], dict[str, Any]]:
    results = {}
    trainer = _folder_trainer(rank, 2, root)
    trainer.fit()
    results[FOLDER] = _result(trainer)
    for optimizer, compile in RUNS:
        trainer = _run_trainer(rank, 2, optimizer, compile)
        trainer.fit()
        results[optimizer, compile] = _result(trainer)
    trainer = _trainer(rank, 2, "sgd", False, algorithms=_per_sample_algorithms())
    trainer.fit()
    results[PER_SAMPLE] = _result(trainer)
    trainer = _trainer(rank, 2, "sgd", False, algorithms=[ChannelsLast(), EMA()])
    trainer.fit()
    results[CHANNELS_LAST] = _result(trainer)
    trainer = _lm_trainer(rank, 2)
    trainer.fit()
    results[LANGUAGE] = _result(trainer)
    with pytest.warns(UserWarning, match="draws random numbers of its own"):
        trainer = _lm_trainer(rank, 2, dropout=0.1)
        trainer.fit()
    results[DROPOUT] = _result(trainer)
    trainer = _unused_trainer(rank, 2, False)
    trainer.fit()
    results[UNUSED] = _result(trainer)
    if corpus is not None:
        trainer = _hf_trainer(rank, 2, corpus)
        trainer.fit()
        results[DATASETS] = _result(trainer)
    return results


def _per_sample_algorithms() -> list[Any]:
    return [MixUp(alpha=0.4, per_sample=True), CutMix(alpha=1.0, per_sample=True), EMA()]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[tuple[str, Any], dict[str, Any]]]:
    root = tmp_path_factory.mktemp("images")
    _write_folder(root)
    return run_ranks(_train_each, 2, tmp_path_factory.mktemp("ranks"), str(root), _corpus(tmp_path_factory))


def _corpus(tmp_path_factory: pytest.TempPathFactory) -> str | None:
    # The packed text table and its tokenizer's size, saved for the processes to read; None without datasets.
    try:
        import datasets  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return None
    from tests.data.test_hf import packed_corpus

    folder = tmp_path_factory.mktemp("corpus")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_HUB_OFFLINE", "1")
        packed, tokenizer = packed_corpus(folder)
    packed.save_to_disk(str(folder / "packed"))
    (folder / "vocab").write_text(str(tokenizer.get_vocab_size()))
    return str(folder)


@pytest.fixture(scope="module")
def images(two_ranks: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(sorted(tmp_path_factory.getbasetemp().glob("images*"))[0])


def _assert_bitwise(one: Any, other: Any, what: str) -> None:
    flat_one, spec_one = torch.utils._pytree.tree_flatten(one)
    flat_other, spec_other = torch.utils._pytree.tree_flatten(other)
    assert spec_one == spec_other, what
    for a, b in zip(flat_one, flat_other, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f"{what}: max difference {(a.double() - b.double()).abs().max()}"
        else:
            assert a == b, what


@pytest.mark.parametrize(("optimizer", "compile"), RUNS)
def test_two_ranks_equal_one_process_with_their_batches_as_microbatches(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]], optimizer: str, compile: Any
) -> None:
    one = _run_trainer(0, 1, optimizer, compile, device_train_microbatch_size=8)
    initial = {name: p.detach().clone() for name, p in one.model.named_parameters()}
    one.fit()
    expected = _result(one)
    if compile:  # compiled, the layer nothing calls keeps its values and takes no step, as torch.optim skips it
        for name in ("spare.weight", "spare.bias"):
            assert torch.equal(expected["params"][name], initial[name])
            assert expected["opt"]["adam"].count[name].item() == 0
        assert expected["opt"]["adam"].count["body.head.weight"].item() == 20
    for rank in range(2):
        got = two_ranks[rank][optimizer, compile]
        for field in ("params", "opt", "algos"):
            _assert_bitwise(expected[field], got[field], f"rank {rank}'s {field} ({optimizer}, compile={compile})")
        # Every held-out sample counted once, on whichever rank: the metrics are the one-process ones exactly.
        assert got["metrics"]["eval/eval/accuracy"] == expected["metrics"]["eval/eval/accuracy"]
        assert got["metrics"]["eval/eval/loss"] == expected["metrics"]["eval/eval/loss"]


def test_per_sample_mixing_of_two_ranks_equals_one_process_with_their_batches_as_microbatches(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]],
) -> None:
    one = _trainer(0, 1, "sgd", False, algorithms=_per_sample_algorithms(), device_train_microbatch_size=8)
    one.fit()
    expected = _result(one)
    for rank in range(2):
        for field in ("params", "opt", "algos"):
            _assert_bitwise(expected[field], two_ranks[rank][PER_SAMPLE][field], f"rank {rank}'s {field} (per_sample)")
    # The draws are the global batch's: cut differently, the run differs.
    other = _trainer(0, 1, "sgd", False, algorithms=_per_sample_algorithms(), device_train_microbatch_size=4)
    other.fit()
    assert not torch.equal(other.state.params["head.weight"], expected["params"]["head.weight"])


def test_channels_last_weights_of_two_ranks_equal_one_process_with_their_batches_as_microbatches(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]],
) -> None:
    one = _trainer(0, 1, "sgd", False, algorithms=[ChannelsLast(), EMA()], device_train_microbatch_size=8)
    one.fit()
    expected = _result(one)
    assert expected["params"]["features.0.0.weight"].is_contiguous(memory_format=torch.channels_last)
    for rank in range(2):
        for field in ("params", "opt", "algos"):
            _assert_bitwise(expected[field], two_ranks[rank][CHANNELS_LAST][field], f"rank {rank}'s {field} (ChannelsLast)")


def test_microbatches_equal_the_whole_batch_up_to_rounding_without_batchnorm() -> None:
    # Without random algorithms (microbatches draw from keys of their own) and without batch statistics.
    def run(**arguments: Any) -> Trainer:
        algorithms = [LabelSmoothing(), EMA(), GradientClipping("norm", 1.0)]
        model = SmallCNN(1, 4, width=4, norm="group")
        trainer = _trainer(0, 1, "sgd", False, model=model, algorithms=algorithms, **arguments)
        trainer.fit()
        return trainer

    whole, cut = run(), run(device_train_microbatch_size=8)
    for name, value in whole.state.params.items():
        torch.testing.assert_close(cut.state.params[name], value, rtol=0, atol=1e-6)


def test_an_image_folder_read_by_two_ranks_equals_one_process_with_their_batches_as_microbatches(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]], images: str
) -> None:
    one = _folder_trainer(0, 1, images, device_train_microbatch_size=8)
    one.fit()
    expected = _result(one)
    for rank in range(2):
        for field in ("params", "opt", "algos"):
            _assert_bitwise(expected[field], two_ranks[rank][FOLDER][field], f"rank {rank}'s {field} (image folder)")
        assert two_ranks[rank][FOLDER]["metrics"]["eval/eval/loss"] == expected["metrics"]["eval/eval/loss"]


def test_a_language_model_on_two_ranks_equals_one_process_whatever_tokens_each_rank_holds(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]],
) -> None:
    # The loss is the global batch's mean over its labelled tokens: each rank's share weighs by its tokens.
    pytest.importorskip("transformers")
    one = _lm_trainer(0, 1, device_train_microbatch_size=2)
    one.fit()
    expected = _result(one)
    whole = _lm_trainer(0, 1)
    whole.fit()
    for rank in range(2):
        for field in ("params", "opt"):
            _assert_bitwise(expected[field], two_ranks[rank][LANGUAGE][field], f"rank {rank}'s {field} (GPT-2)")
        # And the one-process run of the whole batches, up to rounding that AdamW scales up (by rows: 2e-2 off).
        for name, value in whole.state.params.items():
            torch.testing.assert_close(two_ranks[rank][LANGUAGE]["params"][name], value, rtol=0, atol=1e-4)


def test_a_datasets_text_table_on_two_ranks_equals_one_process_with_their_batches_as_microbatches(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if DATASETS not in two_ranks[0]:
        pytest.skip("datasets and tokenizers are not installed (composer_fn[datasets])")
    corpus = str(sorted(tmp_path_factory.getbasetemp().glob("corpus*"))[0])
    one = _hf_trainer(0, 1, corpus, device_train_microbatch_size=4)
    one.fit()
    expected = _result(one)
    for rank in range(2):
        for field in ("params", "opt"):
            _assert_bitwise(expected[field], two_ranks[rank][DATASETS][field], f"rank {rank}'s {field} (datasets)")


def test_the_models_own_dropout_on_two_ranks_equals_one_process_with_their_batches_as_microbatches(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]],
) -> None:
    # A mask is drawn per microbatch, from the run's seed, the step and the microbatch's place in the global batch.
    pytest.importorskip("transformers")
    with pytest.warns(UserWarning, match="draws random numbers of its own"):
        one = _lm_trainer(0, 1, dropout=0.1, device_train_microbatch_size=2)
        one.fit()
    expected = _result(one)
    for rank in range(2):
        for field in ("params", "opt"):
            _assert_bitwise(expected[field], two_ranks[rank][DROPOUT][field], f"rank {rank}'s {field} (GPT-2, dropout)")
    # The draws are the model's: without dropout the run differs.
    assert not torch.equal(two_ranks[0][LANGUAGE]["params"]["transformer.wte.weight"], expected["params"]["transformer.wte.weight"])


def test_parameters_without_a_gradient_on_two_ranks_move_as_in_one_process_and_as_torch_optim_skips_them(
    two_ranks: list[dict[tuple[str, Any], dict[str, Any]]],
) -> None:
    case = UNUSED
    one = _unused_trainer(0, 1, False, device_train_microbatch_size=8)
    initial = {name: p.detach().clone() for name, p in one.model.named_parameters()}
    one.fit()
    expected = _result(one)
    for rank in range(2):
        for field in ("params", "opt", "algos"):
            _assert_bitwise(expected[field], two_ranks[rank][case][field], f"rank {rank}'s {field} ({case})")
    # The layer nothing calls keeps its values (no weight decay) and its optimizer state (no step counted).
    counts = expected["opt"]["adam"].count
    for name in ("spare.weight", "spare.bias"):
        assert torch.equal(expected["params"][name], initial[name])
        assert counts[name].item() == 0
    assert counts["body.head.weight"].item() == 20
    # The layer some microbatches call: stepped on the steps where one of them, on either rank, called it.
    assert 0 < counts["extra.weight"].item() < 20
