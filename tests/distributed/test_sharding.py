"""Sharded training on torch's FSDP2: two gloo processes train what one process trains, and what a hand-written
``fully_shard`` + ``torch.optim`` loop trains, on models we did not write (Hugging Face GPT-2 with its tied
embedding and Llama, torchvision's ResNet and ViT)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

from composer_fn.algorithms import (
    EMA,
    SAM,
    SWA,
    BlurPool,
    GradientClipping,
    LayerFreezing,
    MixUp,
    SelectiveBackprop,
)
from composer_fn.callbacks import OptimizerMonitor
from composer_fn.core.random import key
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.models.cnn import SmallCNN
from composer_fn.optim import adamw, sgd
from composer_fn.testing.differential import (
    ADAMW,
    SGD_MOMENTUM,
    fully_shard_reference,
    keyword_reference,
    torch_reference,
    trainer_result,
)
from composer_fn.testing.models import tiny_gpt2, tiny_llama
from composer_fn.trainer import FSDP as PublicFSDP
from composer_fn.trainer import Trainer
from composer_fn.trainer.checkpoint import convert_checkpoint
from composer_fn.trainer.distributed import all_reduce_sum
from composer_fn.trainer.sharding import (
    FSDP,
    device_mesh,
    local_shards,
    make_sharded_step,
    shard_module,
    shard_units,
)
from tests.distributed.launch import run_ranks
from tests.local_s3 import local_s3, new_bucket

WORLD = 2
STEPS = 3
BATCH = 8


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    return GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _vit() -> nn.Module:
    return torchvision.models.VisionTransformer(
        image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=4
    )


def _resnet() -> nn.Module:
    return torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=4)


# name: (model, batches, model input, loss, whether the model calls it with keywords, the hand loop's units)
def _tokens(step: int) -> tuple[Tensor, ...]:
    ids = torch.randint(0, 64, (BATCH, 12), generator=torch.Generator().manual_seed(step))
    return (ids,)


def _images(step: int) -> tuple[Tensor, ...]:
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 3, 16, 16, generator=generator), torch.randint(0, 4, (BATCH,), generator=generator)


def _larger_images(step: int) -> tuple[Tensor, ...]:
    # A ResNet's last stage sees 2x2 of a 64x64 image. Smaller, its BatchNorm normalises over a process's few values
    # there, which amplifies rounding into whole updates: at 32x32 and four processes, torch's own fully_shard loop
    # ends 4e-3 from one process, and from ours as far on another instruction set (ONEDNN_MAX_CPU_ISA=AVX2).
    generator = torch.Generator().manual_seed(200 + step)
    return torch.randn(BATCH, 3, 64, 64, generator=generator), torch.randint(0, 4, (BATCH,), generator=generator)


def _lm_input(batch: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {"input_ids": batch[0], "labels": batch[0]}


def _lm_loss(outputs: Any, batch: Any) -> Tensor:
    # The model's own loss: the mean over this process's tokens (equal counts on every process here).
    return outputs.loss


def _image_loss(outputs: Tensor, batch: tuple[Tensor, ...]) -> Tensor:
    return F.cross_entropy(outputs, batch[1])


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple[Tensor, ...]], bool, Callable[[nn.Module], list[nn.Module]]]] = {
    "gpt2": (_gpt2, _tokens, True, lambda m: list(m.transformer.h)),
    "llama": (_llama, _tokens, True, lambda m: list(m.model.layers)),
    "vit": (_vit, _images, False, lambda m: list(m.encoder.layers)),
    "resnet": (_resnet, _larger_images, False, lambda m: [block for stage in (m.layer1, m.layer2, m.layer3, m.layer4) for block in stage]),
}
OPTIMIZERS = {
    "adamw": (lambda: adamw(1e-2, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)),
    "sgd": (lambda: sgd(0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
}
RUNS = [("gpt2", "adamw"), ("llama", "adamw"), ("vit", "sgd"), ("resnet", "sgd")]


MODEL_RUNS = [(case, optimizer) for case in CASES for optimizer in OPTIMIZERS]
PAIRS = {"adamw": ADAMW, "sgd": SGD_MOMENTUM}


def _global_batches(case: str, world: int) -> list[Any]:
    # Each process holds 4 samples, at any number of processes (BatchNorm normalises over a process's).
    pieces = max(world * 4 // BATCH, 1)
    batches = [tuple(torch.cat(parts) for parts in zip(*(CASES[case][1](index + 50 * piece) for piece in range(pieces)), strict=True)) for index in range(STEPS)]
    return [_lm_input(batch) for batch in batches] if CASES[case][2] else batches


def _share_of(batch: Any, rank: int, world: int) -> Any:
    if isinstance(batch, dict):
        return {name: item.chunk(world)[rank] for name, item in batch.items()}
    return tuple(item.chunk(world)[rank] for item in batch)


def _through_trainer(rank: int, world: int, runs: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    # The Trainer sharded over the processes, and torch's own sharded loop, each on this process's shares.
    results = {}
    for case, optimizer in runs:
        model, shares = _build(case), [_share_of(batch, rank, world) for batch in _global_batches(case, world)]
        results[case, optimizer] = {
            "trainer": trainer_result(model, shares, PAIRS[optimizer], "sharded"),
            "hand": fully_shard_reference(model, shares, PAIRS[optimizer], CASES[case][3]),
        }
    return results


def _one_process_reference(case: str, optimizer: str, world: int) -> dict[str, Tensor]:
    # One process on the whole batches; BatchNorm normalises by each process's share, so the images come in its
    # microbatches.
    model, batches = _build(case), _global_batches(case, world)
    if CASES[case][2]:
        return {n: p.detach().clone() for n, p in keyword_reference(model, batches, PAIRS[optimizer]).named_parameters()}
    return torch_reference(model, batches, PAIRS[optimizer], microbatch_size=len(batches[0][0]) // world)


def _check_world_size_invariance(results: list[dict[str, Any]], runs: list[tuple[str, str]], world: int) -> None:
    # Ours within fp32 reduction-order noise of one process, and within a fixed tolerance of torch's own sharded loop.
    # Two processes' sums round as one process's do (two terms add alike in either order): a fixed tolerance. More
    # processes sum in the collective's order; AdamW moves an element whose gradient is rounding alone by its
    # learning rate, either way (torch's own fully_shard loop ends 1e-3 from one process on the ResNet). Ours may be
    # off by the fixed tolerance plus twice as far as torch's loop is.
    for case, optimizer in runs:
        reference = _one_process_reference(case, optimizer, world)
        atol = 5e-5 if optimizer == "adamw" else 2e-6  # Adam moves a gradient of rounding noise by its rounding
        for rank in results:
            got = rank["models"][case, optimizer]
            assert got["trainer"].keys() == reference.keys()
            for name, expected in reference.items():
                said = f"{case}, {optimizer}, {name} at {world} processes: ".__add__
                torch_noise = 2 * float((got["hand"][name] - expected).abs().max()) if world > 2 else 0.0
                torch.testing.assert_close(got["trainer"][name], expected, rtol=2e-5, atol=atol + torch_noise, msg=said)
                torch.testing.assert_close(got["trainer"][name], got["hand"][name], rtol=2e-5, atol=atol, msg=said)
                assert torch.equal(got["trainer"][name], results[0]["models"][case, optimizer]["trainer"][name])
        initial = dict(_build(case).named_parameters())
        assert sum(not torch.equal(reference[n], p.detach()) for n, p in initial.items()) > len(initial) // 2


def _build(case: str) -> nn.Module:
    torch.manual_seed(0)
    return CASES[case][0]()


def _share(batch: tuple[Tensor, ...], rank: int) -> tuple[Tensor, ...]:
    return tuple(t.chunk(WORLD)[rank] for t in batch)


def _call(model: nn.Module, batch: tuple[Tensor, ...], keywords: bool) -> Any:
    return model(**_lm_input(batch)) if keywords else model(batch[0])


def _loss(case: str) -> Callable[[Any, Any], Tensor]:
    return _lm_loss if CASES[case][2] else _image_loss


def _ours(case: str, optimizer: str, rank: int, options: FSDP) -> tuple[dict[str, Tensor], dict[str, Any]]:
    model = _build(case)
    tied = hasattr(model, "lm_head") and model.lm_head.weight is model.get_input_embeddings().weight
    units = [name for name, _ in shard_units(model, options)]
    # Each process holds a slice of every parameter's rows (the first dimension).
    shard_sizes = {name: -(-p.shape[0] // WORLD) * p[0].numel() for name, p in model.named_parameters()}
    shard_module(model, options, device_mesh(options, WORLD, "cpu"))
    params = local_shards(model)
    tx = OPTIMIZERS[optimizer][0]()
    from composer_fn.core.random import key
    from composer_fn.core.state import State

    state = State(params=params, buffers=dict(model.named_buffers()), opt=tx.init(params), algos={}, hparams={}, step=torch.zeros((), dtype=torch.int64), key=key(0))
    keywords = CASES[case][2]
    step = make_sharded_step(
        model,
        _lm_loss if keywords else _image_loss,
        tx,
        reduce=all_reduce_sum,
        processes=WORLD,
        input_key=None if keywords else 0,
    )
    for index in range(STEPS):
        batch = _share(CASES[case][1](index), rank)
        state, _ = step(state, _lm_input(batch) if keywords else batch)
    facts = {
        "units": units,
        "tied": tied,
        "still_tied": tied and model.lm_head.weight is model.get_input_embeddings().weight,
        "sharded": all(state.params[name].numel() <= shard_sizes[name] for name in state.params),
        "same_storage": all(
            state.params[name].data_ptr() == p.to_local().data_ptr()
            for name, p in model.named_parameters()
            if p.to_local().numel()  # a first dimension shorter than the processes leaves some an empty shard
        ),
    }
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}, facts


def _hand(case: str, optimizer: str, rank: int, bf16: bool = False) -> dict[str, Tensor]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = _build(case)
    mesh = init_device_mesh("cpu", (WORLD,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for unit in CASES[case][3](model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optim = OPTIMIZERS[optimizer][1](model.parameters())
    for index in range(STEPS):
        batch = _share(CASES[case][1](index), rank)
        optim.zero_grad()
        _loss(case)(_call(model, batch, CASES[case][2]), batch).backward()
        optim.step()
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def _one_process(case: str, optimizer: str) -> dict[str, Tensor]:
    # BatchNorm normalises by each process's batch: the one-process run has them as microbatches.
    model = _build(case)
    optim = OPTIMIZERS[optimizer][1](model.parameters())
    for index in range(STEPS):
        optim.zero_grad()
        for rank in range(WORLD):
            batch = _share(CASES[case][1](index), rank)
            (_loss(case)(_call(model, batch, CASES[case][2]), batch) / WORLD).backward()
        optim.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


DATA = synthetic_images(key(1), 76, num_classes=4, shape=(1, 8, 8))
SHORT = synthetic_images(key(1), 65, num_classes=4, shape=(1, 8, 8))
HELD_OUT = synthetic_images(key(2), 37, num_classes=4, shape=(1, 8, 8))


def _cnn_trainer(rank: int, world: int, data: Any = DATA, **arguments: Any) -> Trainer:
    # 76 samples in global batches of 16: each epoch's fifth batch is 12, 8 on rank 0 and 4 on rank 1.
    loader = TensorLoader(data, 8 if world > 1 else 16, seed=5, rank=rank, world_size=world)
    return Trainer(
        SmallCNN(1, 4, width=4),
        loader,
        TensorLoader(HELD_OUT, 8, shuffle=False, rank=rank, world_size=world),
        max_duration="12ba",
        optimizer=sgd(0.1, momentum=0.9),
        progress_bar=False,
        eval_interval="6ba",
        seed=3,
        **arguments,
    )


class _WithUnusedLayer(nn.Module):
    """A SmallCNN beside a layer its forward never calls: torch.optim leaves it, weight decay and all."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.body = SmallCNN(1, 4, width=4)
        self.spare = nn.Linear(4, 4)

    def forward(self, input: Tensor) -> Tensor:
        logits: Tensor = self.body(input)
        return logits


def _unused_trainer(rank: int, world: int, **arguments: Any) -> Trainer:
    loader = TensorLoader(DATA, 8 if world > 1 else 16, seed=5, rank=rank, world_size=world)
    return Trainer(
        _WithUnusedLayer(), loader, max_duration="6ba", optimizer=adamw(0.01, weight_decay=0.1), progress_bar=False,
        **arguments,
    )  # fmt: skip


def _on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return build()


def _lm_trainer(rank: int, world: int, dropout: float = 0.0, model: nn.Module | None = None, **arguments: Any) -> Trainer:
    from composer_fn.testing.models import tiny_gpt2, token_batches

    # Right-padded rows: the processes hold other numbers of labelled tokens.
    batches = token_batches(4, batch_size=4, length=16, seed=3)
    if world > 1:
        rows = 4 // world
        batches = [{name: item[rank * rows : (rank + 1) * rows] for name, item in batch.items()} for batch in batches]
    arguments = {"max_duration": "4ba", **arguments}
    model = model if model is not None else tiny_gpt2(dropout=dropout)
    return Trainer(model, batches, optimizer=sgd(0.1, momentum=0.9), progress_bar=False, seed=2, **arguments)


def _lm_methods() -> list[Any]:
    # Global norms (clipping, SAM's perturbation) over every process's shards, a loss closure run again through the
    # sharded module, an average of shards, and layers frozen after the first epoch.
    return [GradientClipping("norm", 0.5), SAM(rho=0.1), EMA(half_life="2ba"), LayerFreezing(freeze_start=0.0, freeze_level=0.5)]


def _ema() -> list[Any]:
    return [EMA(half_life="1ba")]


def _cnn_methods() -> list[Any]:
    # A surgery before sharding, mixed batches, a scoring forward that picks samples, unit-wise clipping.
    return [
        BlurPool(min_channels=1), MixUp(), SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0),
        GradientClipping("adaptive", 0.05),
    ]  # fmt: skip


def _trained(trainer: Trainer) -> dict[str, Any]:
    trainer.fit()
    model = trainer.model
    return {
        "params": {name: p.detach().clone() for name, p in model.named_parameters()},
        "buffers": {name: b.detach().clone() for name, b in model.named_buffers() if b.is_floating_point()},
        "metrics": dict(trainer.metrics),
        "tied": getattr(model, "lm_head", None) is not None and model.lm_head.weight is model.get_input_embeddings().weight,
    }


def _ranks(rank: int, root: str, bucket: str | None) -> dict[str, Any]:
    torch.distributed.init_process_group("gloo")
    results: dict[str, Any] = {"cnn-trainer": _trained(_cnn_trainer(rank, WORLD, parallelism=PublicFSDP()))}
    results["lm-trainer"] = _trained(_lm_trainer(rank, WORLD, parallelism=PublicFSDP()))
    # The model's own dropout draws from the run's seed, each process as its microbatch of the global batch.
    results["lm-dropout-trainer"] = _trained(_lm_trainer(rank, WORLD, dropout=0.1, parallelism=PublicFSDP()))
    results["unused-trainer"] = _trained(_unused_trainer(rank, WORLD, parallelism=PublicFSDP()))
    try:
        _cnn_trainer(rank, WORLD, parallelism=PublicFSDP(), callbacks=[OptimizerMonitor()])
    except ValueError as error:
        results["refused-norms"] = str(error)
    try:
        _cnn_trainer(rank, WORLD, parallelism=PublicFSDP(), compile="aot_eager", device_train_microbatch_size="auto")
    except ValueError as error:
        results["refused"] = str(error)
    try:
        _cnn_trainer(rank, WORLD, parallelism=PublicFSDP(), algorithms=[SWA()])
    except ValueError as error:
        results["refused-swa"] = str(error)
    # Methods under sharding, with microbatches: what one process with the processes' microbatches trains.
    lm_methods = {"algorithms": _lm_methods(), "device_train_microbatch_size": 1, "max_duration": "8ba"}
    results["lm-methods"] = _trained(_lm_trainer(rank, WORLD, parallelism=PublicFSDP(), **lm_methods))
    results["cnn-methods"] = _trained(_cnn_trainer(rank, WORLD, parallelism=PublicFSDP(), algorithms=_cnn_methods()))
    # Models built on the meta device, each block made just before it is sharded, from the run's seed.
    for name, build in (("gpt2", tiny_gpt2), ("llama", tiny_llama)):
        results[f"meta-{name}"] = _trained(_lm_trainer(rank, WORLD, parallelism=PublicFSDP(), model=_on_meta(build)))
    # 65 samples: each epoch's last global batch is 1 sample, and rank 1's share of it is empty; it joins rank 0's
    # forward and backward (and SAM's second ones) through the sharded model.
    results["cnn-empty-share"] = _trained(_cnn_trainer(rank, WORLD, data=SHORT, parallelism=PublicFSDP(), algorithms=[SAM()]))
    # fp16 loss scaling: a step skipped for a gradient that is not finite on one process is skipped on all.
    results["lm-fp16"] = _trained(_lm_trainer(rank, WORLD, parallelism=PublicFSDP(), precision="fp16-mixed"))
    # Checkpoints: every process writes its shards of the run at batches 2 and 4; a run resumed from batch 2, at two
    # processes here and at one in the test, continues as the uninterrupted one.
    # EMA's average is a shard on each process, saved and read as the parameters' are.
    folder = Path(root) / "sharded"
    saved = _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), save_folder=str(folder), save_interval="2ba", algorithms=_ema())
    results["saved"] = _trained(saved)
    results["folder"] = sorted(path.name for path in folder.iterdir())
    middle = next(folder.glob("*-ba2"))
    resumed = _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), load_path=str(middle), algorithms=_ema())
    results["resumed_start"] = (resumed.timestamp.batch, {n: p.detach().clone() for n, p in resumed.model.named_parameters()})
    results["resumed"] = _trained(resumed)
    results["resumed_at"] = middle.name
    results["middle"] = str(middle)
    # A checkpoint file (what one process writes) resumes a sharded run too: each process takes its part.
    whole = Path(root) / "whole.pt"
    if rank == 0:
        convert_checkpoint(middle, whole)
    torch.distributed.barrier()
    from_file = _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), load_path=str(whole), algorithms=_ema())
    results["from_file_start"] = from_file.timestamp.batch
    results["from_file"] = _trained(from_file)
    if bucket is not None:  # the same run into a bucket: every process writes its shards there, and reads them back
        run = f"{bucket}/sharded"
        results["saved-s3"] = _trained(
            _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), save_folder=run, save_interval="2ba", algorithms=_ema())
        )
        from composer_fn.trainer.object_store import ObjectFolder

        results["bucket"] = ObjectFolder(run, argument="test").names() if rank == 0 else []
        resumed = _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), load_path=f"{run}/ep0-ba2", algorithms=_ema())
        results["resumed-s3"] = {"start": resumed.timestamp.batch, **_trained(resumed)}
    for case, optimizer in RUNS:
        ours, facts = _ours(case, optimizer, rank, FSDP())
        again, _ = _ours(case, optimizer, rank, FSDP())
        results[case] = {"ours": ours, "again": again, "hand": _hand(case, optimizer, rank), "facts": facts}
    kept, _ = _ours("gpt2", "adamw", rank, FSDP(reshard_after_forward=False, activation_checkpointing=True))
    results["gpt2-kept-checkpointed"] = kept
    results["gpt2-hsdp"], _ = _ours("gpt2", "adamw", rank, FSDP(replicate=WORLD))  # replicas of one shard each
    results["llama-bf16"], _ = _ours("llama", "adamw", rank, FSDP(param_dtype="bf16"))
    results["llama-bf16-hand"] = _hand("llama", "adamw", rank, bf16=True)
    results["models"] = _through_trainer(rank, WORLD, MODEL_RUNS)
    results["models-again"] = _through_trainer(rank, WORLD, [("llama", "adamw"), ("resnet", "sgd")])
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("sharding")
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:  # without the object-store extras, the bucket's part is left out
        yield run_ranks(_ranks, WORLD, root, str(root), None)
        return
    with local_s3():
        yield run_ranks(_ranks, WORLD, root, str(root), new_bucket())


@pytest.mark.parametrize(("case", "optimizer"), RUNS)
def test_two_sharded_processes_train_what_one_process_and_a_fully_shard_loop_train(
    ranks: list[dict[str, Any]], case: str, optimizer: str
) -> None:
    result = ranks[0][case]
    reference = _one_process(case, optimizer)
    assert result["ours"].keys() == reference.keys()
    # Adam divides a gradient by its own size: one that is zero but for rounding (an attention key's bias, which the
    # softmax cancels) moves by its rounding, which the order of the reduction changes.
    atol = 5e-5 if optimizer == "adamw" else 2e-6
    for name, expected in reference.items():
        torch.testing.assert_close(result["ours"][name], expected, rtol=2e-5, atol=atol)
        torch.testing.assert_close(result["ours"][name], result["hand"][name], rtol=2e-5, atol=atol)
        assert torch.equal(result["ours"][name], result["again"][name]), name  # bitwise, run again
        assert torch.equal(result["ours"][name], ranks[1][case]["ours"][name]), name  # every rank sees one model
    initial = dict(_build(case).named_parameters())
    assert sum(not torch.equal(reference[name], p.detach()) for name, p in initial.items()) > len(initial) // 2


def test_units_are_each_block_shards_are_this_process_s_and_ties_stay() -> None:
    assert [n for n, _ in shard_units(_gpt2(), FSDP())] == ["transformer.h.0", "transformer.h.1"]
    assert [n for n, _ in shard_units(_llama(), FSDP())] == ["model.layers.0", "model.layers.1"]
    assert [n for n, _ in shard_units(_vit(), FSDP())] == ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"]
    resnet = [n for n, _ in shard_units(torchvision.models.resnet18(num_classes=4), FSDP())]
    assert resnet == [f"layer{stage}.{block}" for stage in range(1, 5) for block in range(2)]
    assert [n for n, _ in shard_units(_gpt2(), FSDP(units=("GPT2MLP",)))] == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    hinted = _gpt2()
    hinted._no_split_modules = {"GPT2Attention", "GPT2MLP"}  # a model's own units
    assert [n for n, _ in shard_units(hinted, FSDP())] == [f"transformer.h.{i}.{part}" for i in (0, 1) for part in ("attn", "mlp")]
    hinted._no_split_modules = ["NotHere"]  # a hint that names nothing in it: the blocks, as without one
    assert [n for n, _ in shard_units(hinted, FSDP())] == ["transformer.h.0", "transformer.h.1"]
    with pytest.raises(ValueError, match=r"FSDP.units=\('Block',\) names no submodule of GPT2LMHeadModel; its classes: .*GPT2Block"):
        shard_units(_gpt2(), FSDP(units=("Block",)))


def test_a_unit_holding_a_weight_tied_outside_it_is_left_to_the_unit_around_both() -> None:
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4), nn.Linear(4, 8, bias=False))
    model[2].weight = model[0].weight
    assert [n for n, _ in shard_units(model, FSDP(units=("Embedding", "Linear")))] == ["1"]


def test_sharded_facts(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        gpt2 = rank["gpt2"]["facts"]
        assert gpt2["tied"] and gpt2["still_tied"]
        assert gpt2["units"] == ["transformer.h.0", "transformer.h.1"]
        for case in CASES:
            assert rank[case]["facts"]["sharded"] and rank[case]["facts"]["same_storage"], case
    # Keeping gathered parameters to the backward, recomputing activations and replicating instead of sharding change
    # memory, not numbers; computing in bf16 is what fully_shard's bf16 policy computes.
    for name, value in ranks[0]["gpt2"]["ours"].items():
        torch.testing.assert_close(ranks[0]["gpt2-kept-checkpointed"][name], value, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(ranks[0]["gpt2-hsdp"][name], value, rtol=2e-5, atol=5e-5)
    fp32 = ranks[0]["llama"]["ours"]
    assert any(not torch.equal(ranks[0]["llama-bf16"][name], value) for name, value in fp32.items())
    for name in fp32:
        assert ranks[0]["llama-bf16"][name].dtype == torch.float32  # fp32 master weights
        torch.testing.assert_close(ranks[0]["llama-bf16"][name], ranks[0]["llama-bf16-hand"][name], rtol=2e-5, atol=5e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"units": "GPT2Block"}, r"FSDP.units='GPT2Block': expected a non-empty tuple of module class names"),
        ({"units": ()}, r"FSDP.units=\(\): expected a non-empty tuple"),
        ({"param_dtype": "int8"}, r"FSDP.param_dtype"),
        ({"replicate": 0}, r"FSDP.replicate"),
        ({"reshard_after_forward": 1}, r"FSDP.reshard_after_forward"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        FSDP(**options)


def test_a_replica_count_that_does_not_divide_the_processes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="FSDP.replicate=3 must divide the number of processes, 4"):
        device_mesh(FSDP(replicate=3), 4, "cpu")


@pytest.mark.parametrize(
    ("case", "reference"),
    [
        ("cnn-trainer", lambda: _cnn_trainer(0, 1, device_train_microbatch_size=8)),
        ("lm-trainer", lambda: _lm_trainer(0, 1)),
        ("lm-dropout-trainer", lambda: _lm_trainer(0, 1, dropout=0.1, device_train_microbatch_size=2)),
        ("unused-trainer", lambda: _unused_trainer(0, 1, device_train_microbatch_size=8)),
        (
            "lm-methods",
            lambda: _lm_trainer(0, 1, algorithms=_lm_methods(), device_train_microbatch_size=1, max_duration="8ba"),
        ),
        ("cnn-methods", lambda: _cnn_trainer(0, 1, algorithms=_cnn_methods(), device_train_microbatch_size=8)),
        ("cnn-empty-share", lambda: _cnn_trainer(0, 1, data=SHORT, algorithms=[SAM()], device_train_microbatch_size=8)),
        ("lm-fp16", lambda: _lm_trainer(0, 1, precision="fp16-mixed", device_train_microbatch_size=2)),
        # One process makes a meta model whole from the seed; sharded processes make the same values block by block.
        ("meta-gpt2", lambda: _lm_trainer(0, 1, model=_on_meta(tiny_gpt2))),
        ("meta-llama", lambda: _lm_trainer(0, 1, model=_on_meta(tiny_llama))),
    ],
)
def test_a_sharded_trainer_ends_where_one_process_ends(ranks: list[dict[str, Any]], case: str, reference: Any) -> None:
    # One process with the processes' batches as microbatches: BatchNorm normalises by each piece.
    expected = _trained(reference())
    for rank in ranks:
        got = rank[case]
        for kind in ("params", "buffers"):
            assert got[kind].keys() == expected[kind].keys()
            for name, value in expected[kind].items():
                torch.testing.assert_close(got[kind][name], value, rtol=1e-5, atol=1e-6)
        assert got["tied"] == expected["tied"]
        for metric, value in expected["metrics"].items():
            if metric != "wall_time" and isinstance(value, float) and "per_second" not in metric:
                assert got["metrics"][metric] == pytest.approx(value, rel=1e-5, abs=1e-6), metric
    assert ranks[0]["lm-trainer"]["tied"]


def test_a_sharded_trainer_refuses_what_it_does_not_do_yet(ranks: list[dict[str, Any]]) -> None:
    assert "Execution.parallelism=FSDP(" in ranks[0]["refused"] and "Execution.compile='aot_eager'" in ranks[0]["refused"]
    assert "Execution.microbatch_size='auto'" in ranks[0]["refused"]
    assert "callbacks reading the gradients' norms ['OptimizerMonitor']" in ranks[0]["refused-norms"]
    assert "does not run SmallCNN with algorithm 'swa': at its end SWA recomputes the BatchNorm" in ranks[0]["refused-swa"]


def test_methods_under_sharding_change_the_run() -> None:
    # The runs held against one process above are not the plain run under another name.
    plain, methods = _trained(_lm_trainer(0, 1, max_duration="8ba")), _trained(_lm_trainer(0, 1, algorithms=_lm_methods(), max_duration="8ba"))
    assert any(not torch.allclose(methods["params"][name], value, atol=1e-4) for name, value in plain["params"].items())


def test_a_layer_nothing_calls_is_left_as_it_was_and_dropout_draws_differ_from_a_run_without(
    ranks: list[dict[str, Any]],
) -> None:
    spare = _WithUnusedLayer().spare
    trained = ranks[0]["unused-trainer"]["params"]
    assert torch.equal(trained["spare.weight"], spare.weight.detach()) and torch.equal(trained["spare.bias"], spare.bias.detach())
    plain, dropped = ranks[0]["lm-trainer"]["params"], ranks[0]["lm-dropout-trainer"]["params"]
    assert any(not torch.allclose(dropped[name], value, atol=1e-4) for name, value in plain.items())


def test_a_sharded_trainer_needs_a_process_group() -> None:
    with pytest.raises(ValueError, match="shards over the processes of a process group: launch with torchrun"):
        _cnn_trainer(0, 1, parallelism=PublicFSDP())


def test_a_sharded_checkpoint_is_a_folder_of_every_process_s_shards_and_resumes_the_run(ranks: list[dict[str, Any]]) -> None:
    names = ranks[0]["folder"]
    assert [n for n in names if n.endswith("-ba2") or n.endswith("-ba4")] == sorted(n for n in names if "-ba" in n)
    assert len([n for n in names if "-ba" in n]) == 2 and "latest" in names and not any(n.endswith(".tmp") for n in names)
    middle = Path(ranks[0]["middle"])
    assert (middle / ".metadata").is_file() and len(list(middle.glob("*.distcp"))) == WORLD
    for rank in ranks:
        for name, value in rank["saved"]["params"].items():
            assert torch.equal(rank["resumed"]["params"][name], value), name  # bitwise: the same arithmetic
            assert torch.equal(rank["from_file"]["params"][name], value), name
        assert rank["resumed"]["tied"] and rank["from_file"]["tied"] and rank["from_file_start"] == 2


def test_a_sharded_run_saves_into_a_bucket_and_resumes_from_it_as_from_a_folder(ranks: list[dict[str, Any]]) -> None:
    if "saved-s3" not in ranks[0]:
        pytest.skip("s3fs and moto are not installed (composer_fn[s3] and the dev extras)")
    assert ranks[0]["bucket"] == ["ep0-ba2", "ep0-ba4", "latest"]
    for rank in ranks:
        assert rank["resumed-s3"]["start"] == 2
        for name, value in rank["saved"]["params"].items():
            assert torch.equal(rank["saved-s3"]["params"][name], value), name
            assert torch.equal(rank["resumed-s3"]["params"][name], value), name


def test_one_process_resumes_a_two_process_sharded_checkpoint(ranks: list[dict[str, Any]]) -> None:
    expected = _trained(_lm_trainer(0, 1, algorithms=_ema()))
    two_steps = _trained(_lm_trainer(0, 1, max_duration="2ba", algorithms=_ema()))
    for rank in ranks:  # the sharded run resumed at batch 2 with the weights (EMA's average) of batch 2
        batch, weights = rank["resumed_start"]
        assert batch == 2
        for name, value in two_steps["params"].items():
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
    trainer = _lm_trainer(0, 1, load_path=ranks[0]["middle"], algorithms=_ema())
    assert trainer.timestamp.batch == 2
    resumed = _trained(trainer)
    for name, value in expected["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ranks[0]["saved"]["params"][name], value, rtol=1e-5, atol=1e-6)


def test_a_sharded_checkpoint_reads_whole_in_one_process_and_converts_to_a_file_and_to_safetensors(
    ranks: list[dict[str, Any]], tmp_path: Path
) -> None:
    from transformers import GPT2LMHeadModel

    from composer_fn.app.cli import main
    from composer_fn.testing.models import tiny_gpt2
    from composer_fn.trainer import load_model

    middle = ranks[0]["middle"]
    batch, weights = ranks[0]["resumed_start"]
    loaded = load_model(middle, tiny_gpt2())
    assert loaded.lm_head.weight is loaded.get_input_embeddings().weight
    for name, value in loaded.named_parameters():
        assert torch.equal(value, weights[name]), name
    assert main(["convert", middle, "--output", str(tmp_path / "whole.pt")]) == 0
    whole = load_model(tmp_path / "whole.pt", tiny_gpt2())
    assert all(torch.equal(value, weights[name]) for name, value in whole.named_parameters())
    # A run resumed from the file continues as one resumed from the folder.
    from_file = _trained(_lm_trainer(0, 1, load_path=str(tmp_path / "whole.pt"), algorithms=_ema()))
    from_folder = _trained(_lm_trainer(0, 1, load_path=middle, algorithms=_ema()))
    assert all(torch.equal(from_file["params"][n], v) for n, v in from_folder["params"].items())
    # safetensors beside the model's config: Hugging Face's own loader, the tie kept.
    folder = tmp_path / "hf"
    folder.mkdir()
    tiny_gpt2().config.save_pretrained(folder)
    assert main(["convert", middle, "--output", str(folder / "model.safetensors"), "--format", "safetensors"]) == 0
    hugging = GPT2LMHeadModel.from_pretrained(folder)
    assert hugging.lm_head.weight is hugging.get_input_embeddings().weight
    training = dict(load_model(middle, tiny_gpt2(), evaluation_weights=False).named_parameters())
    for name, value in hugging.named_parameters():  # the training weights, not EMA's average
        assert torch.equal(value, training[name]) and not torch.equal(value, weights[name]), name


def _killed_while_saving(rank: int, root: str) -> None:
    # Every process is killed (SIGKILL) after writing its shards of the second checkpoint, before it is complete.
    import os
    import signal

    import composer_fn.trainer.checkpoint as checkpoint_module

    writes = []
    real = checkpoint_module.write_shards

    def write_then_die(folder: Path, tree: dict[str, Any]) -> None:
        writes.append(folder)
        real(folder, tree)
        if len(writes) == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint_module.write_shards = write_then_die  # type: ignore[assignment]
    _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), save_folder=root, save_interval="2ba", max_duration="6ba").fit()


def _autoresumed(rank: int, root: str) -> dict[str, Any]:
    trainer = _lm_trainer(rank, WORLD, parallelism=PublicFSDP(), save_folder=root, save_interval="2ba", max_duration="6ba", autoresume=True)
    start = trainer.timestamp.batch
    return {"start": start, **_trained(trainer)}


def test_every_process_killed_during_a_sharded_save_leaves_the_previous_checkpoint_which_autoresume_takes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    with pytest.raises(AssertionError, match="SIGKILL"):
        run_ranks(_killed_while_saving, WORLD, tmp_path, str(root))
    names = sorted(path.name for path in root.iterdir())
    assert [n for n in names if "-ba" in n and not n.endswith(".tmp")] == [n for n in names if n.endswith("-ba2")]
    assert any(n.endswith("-ba4.tmp") for n in names)  # the killed save, never taken
    resumed = run_ranks(_autoresumed, WORLD, tmp_path, str(root))
    expected = _trained(_lm_trainer(0, 1, max_duration="6ba"))
    for rank in resumed:
        assert rank["start"] == 2
        for name, value in expected["params"].items():
            torch.testing.assert_close(rank["params"][name], value, rtol=1e-5, atol=1e-6)
    assert not any(path.name.endswith(".tmp") for path in root.iterdir())  # autoresume cleared it


def _four_resumed(rank: int, middle: str) -> dict[str, Any]:
    trainer = _lm_trainer(rank, 4, parallelism=PublicFSDP(), load_path=middle, algorithms=_ema())
    resumed = {"start": trainer.timestamp.batch, **_trained(trainer)}
    # HSDP on a 2-D mesh: two replicas, each sharded over two processes.
    hybrid = _trained(_lm_trainer(rank, 4, parallelism=PublicFSDP(replicate=2)))
    return {**resumed, "models": _through_trainer(rank, 4, MODEL_RUNS), "hsdp": hybrid}


@pytest.fixture(scope="module")
def four(ranks: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(_four_resumed, 4, tmp_path_factory.mktemp("four"), ranks[0]["middle"])


def test_the_trainer_sharded_over_two_processes_ends_where_one_process_and_torch_s_fully_shard_loop_end(
    ranks: list[dict[str, Any]],
) -> None:
    _check_world_size_invariance(ranks, MODEL_RUNS, WORLD)
    for run in [("llama", "adamw"), ("resnet", "sgd")]:  # bitwise, run again
        for name, value in ranks[0]["models"][run]["trainer"].items():
            assert torch.equal(ranks[0]["models-again"][run]["trainer"][name], value), name


def test_the_trainer_sharded_over_four_processes_ends_where_one_process_ends(four: list[dict[str, Any]]) -> None:
    _check_world_size_invariance(four, MODEL_RUNS, 4)
    expected = _trained(_lm_trainer(0, 1))
    for rank in four:  # replicated twice, sharded twice
        for name, value in expected["params"].items():
            torch.testing.assert_close(rank["hsdp"]["params"][name], value, rtol=1e-5, atol=1e-6)
        assert rank["hsdp"]["tied"]


def test_four_sharded_processes_resume_a_two_process_checkpoint(ranks: list[dict[str, Any]], four: list[dict[str, Any]]) -> None:
    resumed = four
    for rank in resumed:
        assert rank["start"] == 2
        for name, value in ranks[0]["saved"]["params"].items():
            torch.testing.assert_close(rank["params"][name], value, rtol=1e-5, atol=1e-6)


def test_a_model_on_the_meta_device_is_made_from_the_seed_with_its_ties_and_buffers() -> None:
    from composer_fn.trainer.sharding import materialise

    made = [materialise(_on_meta(tiny_gpt2), seed=5) for _ in range(2)]
    assert made[0].lm_head.weight is made[0].get_input_embeddings().weight  # one tensor, still tied
    for name, value in made[0].state_dict().items():
        assert not value.is_meta and torch.equal(value, made[1].state_dict()[name]), name
    other = materialise(_on_meta(tiny_gpt2), seed=6)
    assert not torch.equal(other.transformer.wte.weight, made[0].transformer.wte.weight)
    # The model's own initialiser: GPT-2's embeddings at std 0.02, its residual projections scaled down by depth.
    assert made[0].transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.1)
    projection = made[0].transformer.h[0].mlp.c_proj.weight.std().item()
    assert projection == pytest.approx(0.02 / (2 * made[0].config.n_layer) ** 0.5, rel=0.1)
    llama = materialise(_on_meta(tiny_llama), seed=5)
    torch.testing.assert_close(llama.model.rotary_emb.inv_freq, tiny_llama().model.rotary_emb.inv_freq)


def test_a_meta_module_without_an_initialiser_is_refused_by_name() -> None:
    from composer_fn.trainer.sharding import materialise

    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 3), Bare())
    with pytest.raises(ValueError, match=r"Sequential's submodule 1 \(Bare\) is on the meta device and has no reset_parameters"):
        materialise(model, seed=0)
