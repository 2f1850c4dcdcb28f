"""StochasticDepth: rate 0 changes nothing, evaluation scales branches by the keep probability, training drops
them with the documented probability from the step's keys, and the warm-up moves the rates without a recompile."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torchvision.models import resnet as torchvision_resnets

from composer_fn.algorithms.blurpool import BlurPool
from composer_fn.algorithms.stochastic_depth import (
    StochasticBlock,
    StochasticBranch,
    StochasticDepth,
    apply_stochastic_depth,
    drop_rates,
    warmup_factor,
)
from composer_fn.callbacks.base import Callback, RunView
from composer_fn.core import random as R
from composer_fn.core.engine import check_surgery_conflicts
from composer_fn.core.event import Event
from composer_fn.core.time import Timestamp
from composer_fn.data import TensorLoader
from composer_fn.models.resnet import BasicBlock, CIFARResNet
from composer_fn.nn import forward_key_names, forward_keys, materialise
from composer_fn.optim import sgd
from composer_fn.optim.base import GradientTransformation
from composer_fn.trainer import Trainer


def _torchvision_blocks(seed: int = 0) -> nn.Module:
    """A torchvision BasicBlock that downsamples, then a Bottleneck, at small widths."""
    with torch.device("meta"):
        downsample = nn.Sequential(nn.Conv2d(4, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8))
        model = nn.Sequential(
            torchvision_resnets.BasicBlock(4, 8, stride=2, downsample=downsample),
            torchvision_resnets.Bottleneck(8, 2),
        )
    return materialise(model, R.key(seed))


def _branch_and_shortcut(block: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """The residual branch and the shortcut of a block, written out from each class's layers."""
    if isinstance(block, torchvision_resnets.Bottleneck):
        out = F.relu(block.bn2(block.conv2(F.relu(block.bn1(block.conv1(x))))))
        branch = block.bn3(block.conv3(out))
    else:
        branch = block.bn2(block.conv2(F.relu(block.bn1(block.conv1(x)))))
    shortcut_layer = getattr(block, "shortcut", None) or getattr(block, "downsample", None)
    return branch, (shortcut_layer(x) if shortcut_layer is not None else x)


def _cifar(seed: int = 0) -> nn.Module:
    return CIFARResNet(8, width=4, in_channels=4, num_classes=3, key=R.key(seed))


MODELS = {"ours": ("BasicBlock", _cifar), "torchvision": ("BasicBlock", _torchvision_blocks)}


@pytest.mark.parametrize("method", ["block", "sample"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_rate_zero_gives_the_original_model_exactly_in_training_and_evaluation(
    kind: str, method: str
) -> None:
    target, build = MODELS[kind]
    images = R.normal(R.key(1), (4, 4, 8, 8))
    for training in (True, False):
        model = build().train(training)
        rewritten = apply_stochastic_depth(model, target, method, drop_rate=0.0)
        assert any(isinstance(m, StochasticBranch) for m in rewritten.modules())
        keys = forward_keys(forward_key_names(rewritten), R.key(2))
        output = functional_call(rewritten, keys, (images,), strict=False)
        assert torch.equal(output, model(images))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), drop_rate=st.floats(0.0, 1.0), bottleneck=st.booleans())
def test_evaluation_scales_each_branch_by_its_keep_probability(
    seed: int, drop_rate: float, bottleneck: bool
) -> None:
    block = _torchvision_blocks(seed % 3)[1 if bottleneck else 0].eval()
    model = nn.Sequential(block)
    name = "ResNetBottleneck" if bottleneck else "BasicBlock"
    rewritten = apply_stochastic_depth(model, name, drop_rate=drop_rate, drop_distribution="uniform").eval()
    x = R.normal(R.key(seed), (2, 8 if bottleneck else 4, 6, 6))
    branch, shortcut = _branch_and_shortcut(block, x)
    expected = F.relu(branch * torch.tensor(1.0 - drop_rate) + shortcut)
    torch.testing.assert_close(rewritten(x), expected, rtol=1e-6, atol=1e-6)


def test_training_drops_whole_branches_per_batch_or_per_sample() -> None:
    model = _cifar().train()
    block = model.layer2[0]
    x = R.normal(R.key(0), (16, 4, 8, 8))
    with torch.no_grad():
        branch, shortcut = _branch_and_shortcut(block, x)
        kept, dropped = F.relu(branch + shortcut), F.relu(shortcut)
        for method in ("block", "sample"):
            rewritten = apply_stochastic_depth(nn.Sequential(block), "BasicBlock", method, drop_rate=0.5)
            outcomes = set()
            for step in range(12):
                keys = forward_keys(forward_key_names(rewritten), R.key(step))
                output = functional_call(rewritten, keys, (x,), strict=False)
                per_sample = [
                    0 if torch.allclose(o, k) else 1 if torch.allclose(o, d) else 2
                    for o, k, d in zip(output, kept, dropped, strict=True)
                ]
                assert 2 not in per_sample
                if method == "block":
                    assert len(set(per_sample)) == 1
                outcomes.update(per_sample)
            assert outcomes == {0, 1}


def _drop_everything(kind: str) -> nn.Module:
    target, build = MODELS[kind]
    model = build().train()
    return apply_stochastic_depth(model, target, "block", drop_rate=1.0, drop_distribution="uniform")


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, StochasticBlock)]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_dropped_block_returns_its_input_path_only(kind: str, traced: bool) -> None:
    # Composer's dropped block: the input itself through an identity shortcut, relu(shortcut(x)) through a
    # projection; not relu(x), which differs wherever the input is negative.
    model = _drop_everything(kind)
    blocks = _blocks(model)
    assert blocks and all(block.training for block in blocks)
    for index, block in enumerate(blocks):
        channels = next(block.parameters()).shape[1]
        x = R.normal(R.key(index), (3, channels, 8, 8))
        reference = copy.deepcopy(block)
        shortcut = reference.shortcut if hasattr(reference, "shortcut") else reference.downsample
        projection = shortcut is not None and not isinstance(shortcut, nn.Identity)
        expected = F.relu(shortcut(x)) if projection else x
        run = torch.compile(block, backend="aot_eager", fullgraph=True) if traced else block
        output = run(x)
        torch.testing.assert_close(output, expected, rtol=0, atol=0)
        assert projection or (x < 0).any()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_eagerly_a_dropped_block_computes_nothing_of_its_branch(kind: str) -> None:
    model = _drop_everything(kind)
    calls: list[str] = []
    for block in _blocks(model):
        for name in ("conv1", "conv2", "conv3"):
            if hasattr(block, name):
                getattr(block, name).register_forward_pre_hook(lambda module, args, name=name: calls.append(name))
    x = R.normal(R.key(0), (2, 4, 8, 8))
    model(x)
    assert calls == []
    model.eval()(x)
    assert len(calls) >= 2 * len(_blocks(model))


def test_training_every_block_dropped_leaves_the_branches_and_their_statistics_as_they_were() -> None:
    # Plain SGD without weight decay or momentum: a branch that never runs keeps its weights and statistics.
    algorithm = StochasticDepth("BasicBlock", drop_rate=1.0, drop_distribution="uniform")
    trainer = _trainer(algorithm, False, optimizer=sgd(0.1))
    # Copies: the trainer updates its own state's tensors in place.
    before = {name: t.clone() for name, t in {**trainer.state.params, **trainer.state.buffers}.items()}
    branch = [name for name in before if name.split(".")[1] in ("conv1", "bn1", "conv2", "bn2")]
    trainer.fit()
    after = {**trainer.state.params, **trainer.state.buffers}
    assert branch and all(torch.equal(after[name], before[name]) for name in branch if "forward_key" not in name)
    assert not torch.equal(after["4.weight"], before["4.weight"])


@pytest.mark.slow
def test_block_wise_training_reaches_the_same_state_eagerly_and_compiled(fresh_compiler: None) -> None:
    # Eagerly a dropped block skips its branch; compiled it selects between both outputs and restores the
    # branch's statistics: the two steps give the same run. (Plain SGD: eagerly the skipped branch gets no
    # gradient and no update, as torch.optim leaves it; compiled it gets a zero gradient, which plain SGD turns
    # into no update too, while momentum or weight decay would move it, see the module docstring.)
    algorithm = StochasticDepth("BasicBlock", drop_rate=0.5, drop_distribution="uniform")
    eager, compiled = _trainer(algorithm, False, optimizer=sgd(0.05)), _trainer(algorithm, "aot_eager", optimizer=sgd(0.05))
    eager.fit()
    compiled.fit()
    assert compiled.compiles == 1
    for kind in ("params", "buffers"):
        ours, theirs = getattr(eager.state, kind), getattr(compiled.state, kind)
        assert ours.keys() == theirs.keys()
        for name in ours:
            torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)


DRAWS = 20_000


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), drop_rate=st.floats(0.0, 1.0), method=st.sampled_from(["block", "sample"])
)
def test_the_dropped_fraction_over_many_draws_is_close_to_the_drop_rate(
    seed: int, drop_rate: float, method: str
) -> None:
    branch = StochasticBranch(nn.Identity(), drop_rate, method)
    if method == "sample":
        output = functional_call(branch, {"forward_key": R.key(seed)}, (torch.ones(DRAWS, 1),))
    else:
        # One batch-wide draw per key, for DRAWS keys at once.
        keys = R.split(R.key(seed), DRAWS)
        output = vmap(lambda key: functional_call(branch, {"forward_key": key}, (torch.ones(1),)))(keys)
    dropped = (output == 0).float().mean().item()
    assert set(output.unique().tolist()) <= {0.0, 1.0}
    # Six standard deviations of a binomial proportion, and a little more for p near 0 or 1.
    assert abs(dropped - drop_rate) <= 6 * math.sqrt(drop_rate * (1 - drop_rate) / DRAWS) + 1e-3


def test_different_steps_draw_differently_and_the_same_step_redraws_identically() -> None:
    model = apply_stochastic_depth(
        _cifar(), "BasicBlock", "sample", drop_rate=0.5, drop_distribution="uniform"
    )
    x = R.normal(R.key(0), (32, 4, 8, 8))
    names = forward_key_names(model)
    assert len(names) == 3

    def output(step: int) -> Tensor:
        keys = forward_keys(names, R.fold_in(R.key(9), step))
        return functional_call(model, keys, (x,), strict=False)

    assert torch.equal(output(0), output(0))
    assert not torch.equal(output(0), output(1))


def test_linear_rates_grow_with_depth_and_uniform_rates_are_equal() -> None:
    model = _cifar()
    linear = apply_stochastic_depth(model, "BasicBlock", drop_rate=0.3)
    uniform = apply_stochastic_depth(model, "BasicBlock", drop_rate=0.3, drop_distribution="uniform")
    names = ["layer1.0.bn2", "layer2.0.bn2", "layer3.0.bn2"]
    assert [linear.get_submodule(n).drop_rate.item() for n in names] == pytest.approx([0.1, 0.2, 0.3])
    assert [uniform.get_submodule(n).drop_rate.item() for n in names] == pytest.approx([0.3] * 3)
    assert drop_rates(0.5, 4) == (0.125, 0.25, 0.375, 0.5)


def test_apply_stochastic_depth_is_pure_and_idempotent_and_targets_only_the_named_blocks() -> None:
    model = nn.Sequential(_cifar(), _torchvision_blocks())
    before = {n: t.clone() for n, t in model.state_dict().items()}
    structure = [(n, type(m)) for n, m in model.named_modules()]
    assert StochasticDepth("BasicBlock").targets(model) == frozenset(
        {"0.layer1.0.bn2", "0.layer2.0.bn2", "0.layer3.0.bn2", "1.0.bn2"}
    )
    assert StochasticDepth("ResNetBottleneck").targets(model) == frozenset({"1.1.bn3"})
    once = apply_stochastic_depth(model, "BasicBlock", drop_rate=0.4)
    twice = apply_stochastic_depth(once, "BasicBlock", drop_rate=0.4)
    assert [(n, type(m)) for n, m in model.named_modules()] == structure
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())
    assert StochasticDepth("BasicBlock").targets(once) == frozenset()
    assert [(n, type(m)) for n, m in twice.named_modules()] == [(n, type(m)) for n, m in once.named_modules()]
    x = R.normal(R.key(0), (2, 4, 8, 8))
    for part in range(2):
        torch.testing.assert_close(twice[part].eval()(x), once[part].eval()(x), rtol=0, atol=0)


def test_it_leaves_the_convolutions_to_other_surgeries() -> None:
    model = _cifar()
    check_surgery_conflicts([BlurPool(min_channels=4), StochasticDepth("BasicBlock")], model)
    assert BlurPool(min_channels=4).targets(model) and StochasticDepth("BasicBlock").targets(model)


def test_a_model_without_the_named_blocks_is_left_alone_with_a_warning() -> None:
    model = _cifar()
    with pytest.warns(UserWarning, match="no ResNetBottleneck block"):
        unchanged = apply_stochastic_depth(model, "ResNetBottleneck")
    assert [type(m) for m in unchanged.modules()] == [type(m) for m in model.modules()]


def test_the_warm_up_factor_ramps_linearly_in_batches_or_in_fractions_of_the_run() -> None:
    run = Timestamp().with_max_duration("10ba")
    assert [warmup_factor("4ba", Timestamp(batch=b)) for b in (0, 1, 4, 9)] == [0.0, 0.25, 1.0, 1.0]
    assert [
        warmup_factor(0.2, run.advance(1)),
        warmup_factor("0.2dur", Timestamp(batch=3, max_duration=run.max_duration)),
    ] == [0.5, 1.0]
    assert warmup_factor(0.0, Timestamp()) == 1.0
    algorithm = StochasticDepth("BasicBlock", drop_warmup="2ba")
    assert [algorithm.match(Event.BATCH_START, Timestamp(batch=b)) for b in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    assert Event.BATCH_START not in StochasticDepth("BasicBlock").host_hooks()


class _Rates(Callback):
    def __init__(self) -> None:
        self.rates: list[float] = []

    def batch_start(self, view: RunView) -> None:
        self.rates.append(view.state.buffers["1.bn2.drop_rate"].item())


def _loader(seed: int) -> TensorLoader:
    images = R.normal(R.key(seed), (32, 4, 8, 8))
    labels = R.randint(R.fold_in(R.key(seed), 1), 0, 3, (32,))
    return TensorLoader((images, labels), 8, seed=seed)


def _small_resnet() -> nn.Module:
    with torch.device("meta"):
        model = nn.Sequential(
            BasicBlock(4, 4), BasicBlock(4, 8, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        model.append(nn.Linear(8, 3))
    return materialise(model, R.key(0))


def _trainer(
    algorithm: StochasticDepth,
    compile: bool | str,
    callbacks: tuple[Callback, ...] = (),
    optimizer: GradientTransformation | None = None,
) -> Trainer:
    return Trainer(
        _small_resnet(),
        _loader(0),
        max_duration="4ba",
        optimizer=optimizer or sgd(0.05, momentum=0.9),
        algorithms=[algorithm],
        compile=compile,
        callbacks=callbacks,
        progress_bar=False,
        device="cpu",
    )


def test_training_eagerly_gives_finite_losses_and_trains_every_block() -> None:
    trainer = _trainer(StochasticDepth("BasicBlock", drop_rate=0.5), compile=False)
    metrics = trainer.fit()
    assert math.isfinite(metrics["loss"])
    assert all(torch.isfinite(p).all() for p in trainer.state.params.values())
    assert "0.bn2.layer.weight" in trainer.state.params


@pytest.mark.slow
def test_the_warm_up_changes_the_rates_in_a_compiled_run_without_recompiling(fresh_compiler: None) -> None:
    rates = _Rates()
    algorithm = StochasticDepth("BasicBlock", "sample", drop_rate=0.6, drop_warmup="0.5dur")
    trainer = _trainer(algorithm, compile="aot_eager", callbacks=(rates,))
    metrics = trainer.fit()
    assert math.isfinite(metrics["loss"])
    assert rates.rates == pytest.approx([0.0, 0.3, 0.6, 0.6])  # the deeper of two blocks: the full rate
    assert trainer.compiles == 1
    assert all(torch.isfinite(p).all() for p in trainer.state.params.values())


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda: StochasticDepth("ResNetBasicBlock"),
            ValueError,
            "accepted: ResNetBottleneck, Bottleneck, BasicBlock",
        ),
        (lambda: StochasticDepth(stochastic_method="layer"), ValueError, "stochastic_method='layer'"),
        (lambda: StochasticDepth(drop_rate=1.5), ValueError, "drop_rate=1.5"),
        (lambda: StochasticDepth(drop_distribution="cosine"), ValueError, "drop_distribution='cosine'"),
        (lambda: StochasticDepth(drop_warmup="2ep"), ValueError, "drop_warmup='2ep'"),
        (lambda: StochasticDepth(drop_warmup=1.5), ValueError, "drop_warmup=1.5"),
        (lambda: StochasticDepth(drop_warmup=[1]), TypeError, r"drop_warmup=\[1\]"),
        (
            lambda: apply_stochastic_depth(_cifar(), "BasicBlock", drop_rate=-0.1),
            ValueError,
            "drop_rate=-0.1",
        ),
        (lambda: warmup_factor(0.5, Timestamp()), ValueError, "no max_duration"),
    ],
)
def test_bad_arguments_are_refused_by_name(build, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def test_a_rewritten_model_pickles_and_its_classes_are_found_by_name() -> None:
    import pickle

    from composer_fn.algorithms import stochastic_depth

    model = apply_stochastic_depth(_torchvision_blocks(), "BasicBlock", drop_rate=0.5).eval()
    restored = pickle.loads(pickle.dumps(model))
    assert [type(m) for m in restored.modules()] == [type(m) for m in model.modules()]
    x = R.normal(R.key(0), (2, 4, 8, 8))
    assert torch.equal(restored(x), model(x))
    # A new process finds each class by its module and name before any model made it.
    for name in ("StochasticBasicBlock", "StochasticTorchvisionBasicBlock", "StochasticTorchvisionBottleneck"):
        found = getattr(stochastic_depth, name)
        assert issubclass(found, StochasticBlock) and found.__qualname__ == name
