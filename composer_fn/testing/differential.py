"""Differential checks against torch itself: the Trainer next to a hand-written ``torch.optim`` loop.

Both train copies of one model on the same batches in the same order: the reference with ``torch.optim``'s
optimizer (``zero_grad``, forward, cross-entropy, ``backward``, ``step``; with microbatches, each microbatch's
loss weighted by its share of the batch and the gradients accumulated before the step), ours with
``composer_fn.Trainer`` and no algorithm, along one of the training paths:

- ``"eager"``: the eager step;
- ``"compiled"``: the whole step compiled (``compile="aot_eager"``: torch's graph capture without inductor's
  kernels, so the comparison is of the graph, not of code generation);
- ``"microbatched"``: each batch cut into microbatches (``device_train_microbatch_size``), the reference
  accumulating its gradients over the same microbatches;
- ``"channels_last"``: the eager step with ``ChannelsLast()``, the reference a loop over torch's own
  channels-last model and inputs (``apply_channels_last``: ``model.to(memory_format=torch.channels_last)``,
  with the layers the CPU gets wrong in that format kept contiguous, as ChannelsLast keeps them);
- ``"bf16"``: the eager step with ``precision="bf16-mixed"``, the reference's forward and loss inside
  ``torch.autocast(dtype=torch.bfloat16)`` on the inputs' device (bf16 moves a parameter's update away from
  fp32's by far more than the allowance, so a step that dropped or misplaced autocast fails);
- ``"sharded"``: the Trainer with ``parallelism=FSDP()``, each process of a process group on its share of the
  batches; its reference is torch's own sharded loop, ``fully_shard_reference`` (``fully_shard`` and
  ``torch.optim`` on the same shares), and one process on the whole batches.

``compare`` measures, parameter by parameter, how far ours ends from the reference relative to how far the
reference moved. Rounding alone moves fp32 training off exact arithmetic by an amount that depends on the
parameter: a ReLU whose input rounds across zero, or a parameter whose gradient is zero but for rounding (a
bias before a normalization) moves by rounding noise. So each parameter's allowance is a fixed tolerance plus
a multiple of torch's own distance from exact arithmetic there: the same loop in float64 against the fp32 one.
A tensor updated in the wrong element order is off by about its whole update, orders of magnitude above both.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.optim.base import GradientTransformation
from composer_fn.optim.optimizers import adamw, sgd

__all__ = [
    "PATHS",
    "OptimizerPair",
    "SGD_MOMENTUM",
    "ADAMW",
    "ModelCase",
    "Comparison",
    "torchvision_models",
    "timm_models",
    "unused_layer_model",
    "image_batches",
    "torch_reference",
    "keyword_reference",
    "trainer_result",
    "update_errors",
    "compare",
]

PATHS: tuple[str, ...] = ("eager", "compiled", "microbatched", "channels_last", "bf16", "sharded")
"""The training paths ``trainer_result`` runs (see the module docstring)."""

TOLERANCE = 1e-3
"""The relative update error every parameter is allowed, besides its rounding allowance."""

ROUNDING_FACTOR = 10.0
"""How many times torch's own fp32-against-float64 distance a parameter may be off."""

Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class OptimizerPair:
    """One optimizer twice: ``ours()`` a ``GradientTransformation``, ``reference(parameters)`` torch's."""

    name: str
    ours: Callable[[], GradientTransformation]
    reference: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


SGD_MOMENTUM = OptimizerPair(
    "sgd",
    lambda: sgd(0.01, momentum=0.9, weight_decay=5e-4),
    lambda parameters: torch.optim.SGD(parameters, lr=0.01, momentum=0.9, weight_decay=5e-4),
)
"""SGD with momentum 0.9 and L2 weight decay 5e-4, learning rate 0.01."""

ADAMW = OptimizerPair(
    "adamw",
    lambda: adamw(1e-3, weight_decay=0.05),
    lambda parameters: torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.05),
)
"""AdamW with learning rate 1e-3 and weight decay 0.05."""


def torch_reference(
    model: nn.Module,
    batches: Sequence[Batch],
    optimizer: OptimizerPair,
    *,
    microbatch_size: int | None = None,
    channels_last: bool = False,
    float64: bool = False,
    bf16: bool = False,
) -> dict[str, Tensor]:
    """Returns the parameters by name after a hand-written ``torch.optim`` loop over ``batches``, on a copy.

    With ``microbatch_size``, each batch's gradient is accumulated over microbatches of that many samples
    (the last may be smaller), each loss weighted by its samples over the batch's. With ``channels_last``, the
    model is ``apply_channels_last(model)`` and the inputs are channels-last; with ``float64``, the model and
    inputs are float64; with ``bf16``, each forward and loss run inside bf16 autocast.
    """
    from composer_fn.algorithms.channels_last import apply_channels_last

    trained = copy.deepcopy(model).train()
    if float64:
        trained = trained.double()
    if channels_last:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trained = apply_channels_last(trained)
    steps = optimizer.reference(trained.parameters())
    for inputs, targets in batches:
        inputs = inputs.double() if float64 else inputs
        inputs = inputs.contiguous(memory_format=torch.channels_last) if channels_last else inputs
        steps.zero_grad(set_to_none=True)
        size = microbatch_size or len(inputs)
        for start in range(0, len(inputs), size):
            part = slice(start, start + size)
            with torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(trained(inputs[part]), targets[part])
            (loss * (len(inputs[part]) / len(inputs))).backward()
        steps.step()
    return {name: p.detach().clone() for name, p in trained.named_parameters()}


def keyword_reference(
    model: nn.Module,
    batches: Sequence[Mapping[str, Tensor]],
    optimizer: OptimizerPair,
    *,
    seed: int | None = None,
    float64: bool = False,
) -> nn.Module:
    """Returns a copy of ``model`` trained by a hand-written ``torch.optim`` loop on mapping ``batches`` given as
    keyword arguments (a Hugging Face model and its own loss): ``zero_grad``, ``model(**batch).loss.backward()``,
    ``step``. With ``seed``, torch's generator is seeded before each step as a ``Trainer(seed=seed)`` run seeds
    it for the model's own draws (``composer_fn.trainer.randomness.model_seed``), and put back after the loop.
    The module comes back whole, ties and all, in training mode."""
    from composer_fn.trainer.randomness import model_seed

    trained = copy.deepcopy(model).train()
    trained = trained.double() if float64 else trained
    steps = optimizer.reference(trained.parameters())
    with torch.random.fork_rng(devices=[]):
        for step, batch in enumerate(batches):
            if seed is not None:
                torch.manual_seed(model_seed(seed, step))
            steps.zero_grad(set_to_none=True)
            trained(**batch).loss.backward()
            steps.step()
    return trained


def fully_shard_reference(
    model: nn.Module,
    batches: Sequence[Any],
    optimizer: OptimizerPair,
    units: Callable[[nn.Module], Iterable[nn.Module]],
) -> dict[str, Tensor]:
    """Returns the whole parameters by name after a hand-written loop of torch's own sharded training on a copy of
    ``model``: ``fully_shard`` on each of ``units(copy)``, then on the whole, over every process of the group (a 1-D
    mesh), ``torch.optim``'s optimizer on the sharded parameters, and for each of this process's ``batches``
    ``zero_grad``, the loss, ``backward`` (which averages the gradients over the processes) and ``step``. The loss
    is cross-entropy against ``batch[1]``, or for a mapping batch the model's own (``model(**batch).loss``). Every
    process of the group calls it, on the same ``model`` and shares of one size."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    trained = copy.deepcopy(model).train()
    device = next(trained.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for unit in units(trained):
        fully_shard(unit, mesh=mesh)
    fully_shard(trained, mesh=mesh)
    steps = optimizer.reference(trained.parameters())
    for batch in batches:
        steps.zero_grad(set_to_none=True)
        if isinstance(batch, Mapping):
            loss = trained(**batch).loss
        else:
            loss = F.cross_entropy(trained(batch[0]), batch[1])
        loss.backward()
        steps.step()
    return {name: p.full_tensor().detach().clone() for name, p in trained.named_parameters()}  # type: ignore[attr-defined]


def trainer_result(
    model: nn.Module,
    batches: Sequence[Any],
    optimizer: OptimizerPair,
    path: str,
    microbatch_size: int | None = None,
) -> dict[str, Tensor]:
    """Returns the parameters by name of ``trainer.model`` after ``composer_fn.Trainer`` trains a copy of ``model``
    on ``batches`` along ``path`` (one of ``PATHS``), one step a batch, with no algorithm but ``ChannelsLast`` on
    its path; ``"sharded"``: every process of the group calls it with its share of each batch."""
    from composer_fn.algorithms import ChannelsLast
    from composer_fn.trainer.options import FSDP
    from composer_fn.trainer.trainer import Trainer

    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {', '.join(PATHS)}")
    if path == "microbatched" and microbatch_size is None:
        raise ValueError("microbatch_size=None: path='microbatched' needs a microbatch size, a positive integer")
    with warnings.catch_warnings():
        # ChannelsLast may warn about layers it keeps contiguous on this CPU; the comparison is the point here.
        warnings.simplefilter("ignore")
        trainer = Trainer(
            copy.deepcopy(model),
            list(batches),
            max_duration=f"{len(batches)}ba",
            optimizer=optimizer.ours(),
            algorithms=[ChannelsLast()] if path == "channels_last" else [],
            compile="aot_eager" if path == "compiled" else False,
            precision="bf16-mixed" if path == "bf16" else "fp32",
            device_train_microbatch_size=microbatch_size if path == "microbatched" else None,
            parallelism=FSDP() if path == "sharded" else None,
            progress_bar=False,
        )
        trainer.fit()
    # Read through the module handed back, as a user reads the trained model.
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def update_errors(
    initial: Mapping[str, Tensor], ours: Mapping[str, Tensor], reference: Mapping[str, Tensor]
) -> dict[str, float]:
    """Returns, by parameter name, ``‖ours − reference‖ / ‖reference − initial‖``: how far our parameters are
    from the reference's, relative to how far the reference moved (0 for a parameter neither moved)."""
    if ours.keys() != reference.keys():
        raise ValueError(
            f"ours and reference must name the same parameters; only ours: {sorted(ours.keys() - reference.keys())}, "
            f"only the reference: {sorted(reference.keys() - ours.keys())}"
        )
    errors = {}
    for name, expected in reference.items():
        moved = float((expected.double() - initial[name].double()).norm())
        apart = float((ours[name].double() - expected.double()).norm())
        errors[name] = apart / moved if moved > 0.0 else (0.0 if apart == 0.0 else float("inf"))
    return errors


@dataclass(frozen=True)
class ModelCase:
    """A third-party architecture at a small size: ``build()`` a fresh model (from torch's global generator)
    taking ``image_size``×``image_size`` images of ``channels`` channels (RGB unless given) to ``num_classes``
    logits."""

    name: str
    build: Callable[[], nn.Module]
    image_size: int
    num_classes: int = 10
    channels: int = 3

    def build_seeded(self, seed: int = 0) -> nn.Module:
        """A fresh model built under ``seed`` of torch's global generator, whose state is restored afterwards
        (torchvision and timm initialize from it)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.build()


def torchvision_models() -> dict[str, ModelCase]:
    """Returns torchvision's architectures at small sizes, by the name of the builder each one shrinks.

    Each is torchvision's own class with its own blocks (``BasicBlock``, ``Bottleneck``, ``InvertedResidual``
    with squeeze-excitation, ``MBConv``, ``CNBlock`` with ``LayerNorm2d``, ViT's encoder, Swin's shifted
    windows and ``PatchMerging``), with fewer and narrower stages; dropout and stochastic depth are off, so
    training is deterministic.
    """
    from torchvision.models import resnet
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig
    from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3
    from torchvision.models.swin_transformer import SwinTransformer
    from torchvision.models.vision_transformer import VisionTransformer

    def mobilenet() -> nn.Module:
        setting = [
            InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 0.5),
            InvertedResidualConfig(16, 3, 72, 24, False, "RE", 2, 1, 0.5),
            InvertedResidualConfig(24, 5, 96, 40, True, "HS", 2, 1, 0.5),
        ]
        return MobileNetV3(setting, last_channel=64, num_classes=10, dropout=0.0)

    def efficientnet() -> nn.Module:
        setting = [
            MBConvConfig(1, 3, 1, 32, 16, 1, width_mult=0.25),
            MBConvConfig(6, 3, 2, 16, 24, 1, width_mult=0.25),
            MBConvConfig(6, 5, 2, 24, 40, 1, width_mult=0.25),
        ]
        return EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=64)

    cases = [
        ModelCase("resnet18", lambda: resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10), 64),
        ModelCase(
            "resnet50",
            lambda: resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16),
            64,
        ),
        ModelCase("mobilenet_v3_small", mobilenet, 32),
        ModelCase("efficientnet_b0", efficientnet, 32),
        ModelCase(
            "convnext_tiny",
            lambda: ConvNeXt(
                [CNBlockConfig(8, 16, 1), CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10
            ),
            32,
        ),
        ModelCase(
            "vit_b_16",
            lambda: VisionTransformer(16, 4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=10),
            16,
        ),
        ModelCase(
            "swin_t",
            lambda: SwinTransformer(
                [2, 2], 8, depths=[1, 1], num_heads=[1, 2], window_size=[2, 2], stochastic_depth_prob=0.0,
                num_classes=10,
            ),  # fmt: skip
            16,
        ),
    ]
    return {case.name: case for case in cases}


def timm_models() -> dict[str, ModelCase]:
    """Returns timm's architectures at small sizes, by the name of the model each one shrinks.

    Each is timm's own class with its own layers: ``ResNet`` with timm's ``BasicBlock``, ``EfficientNet`` with
    ``BatchNormAct2d`` and squeeze-excitation, ``ConvNeXt`` with timm's ``LayerNorm2d``, and
    ``VisionTransformer``; dropout and drop-path are off.
    """
    from timm.models.convnext import ConvNeXt
    from timm.models.efficientnet import _gen_efficientnet
    from timm.models.resnet import BasicBlock, ResNet
    from timm.models.vision_transformer import VisionTransformer

    cases = [
        # timm annotates the block as an instance; a class is what it takes.
        ModelCase("resnet18", lambda: ResNet(BasicBlock, (1, 1, 1, 1), num_classes=10), 32),  # type: ignore[arg-type]
        ModelCase(
            "efficientnet_b0",
            lambda: _gen_efficientnet(
                "efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.25, num_classes=10, pretrained=False
            ),
            32,
        ),
        ModelCase("convnext_atto", lambda: ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 32, 64), num_classes=10), 32),
        ModelCase(
            "vit_tiny",
            lambda: VisionTransformer(
                img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=10
            ),
            16,
        ),
    ]
    return {case.name: case for case in cases}


def unused_layer_model() -> ModelCase:
    """Returns torchvision's ResNet at a small size carrying a head its forward never calls (one left over from
    another task, as models brought from elsewhere often carry): ``torch.optim`` skips that head's parameters,
    whose ``.grad`` stays None, so a step that decays or moves them is caught."""
    from torchvision.models import resnet

    def build() -> nn.Module:
        model = resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)
        model.add_module("old_head", nn.Linear(512, 5))
        return model

    return ModelCase("resnet18_unused_head", build, 32)


def image_batches(case: ModelCase, steps: int, batch_size: int, seed: int = 0) -> list[Batch]:
    """Returns ``steps`` batches of ``batch_size`` random images for ``case`` and random class targets, drawn
    from a generator of ``seed`` (not torch's global one)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch_size, case.channels, case.image_size, case.image_size)
    return [
        (torch.randn(shape, generator=generator), torch.randint(0, case.num_classes, (batch_size,), generator=generator))
        for _ in range(steps)
    ]


@dataclass(frozen=True)
class Comparison:
    """Our parameters against the reference's after one path: each parameter's relative update error and
    what it is allowed (``TOLERANCE`` plus ``ROUNDING_FACTOR`` times torch's own fp32-against-float64 error)."""

    model: str
    optimizer: str
    path: str
    errors: Mapping[str, float]
    rounding: Mapping[str, float]
    """Torch's own relative update error in fp32 against float64, by parameter."""

    @property
    def allowed(self) -> dict[str, float]:
        """Returns each parameter's allowance: ``TOLERANCE + ROUNDING_FACTOR · rounding``."""
        return {name: TOLERANCE + ROUNDING_FACTOR * r for name, r in self.rounding.items()}

    @property
    def worst(self) -> tuple[str, float]:
        """Returns the parameter with the largest relative update error, and that error."""
        name = max(self.errors, key=lambda n: self.errors[n])
        return name, self.errors[name]

    def worst_determined(self, limit: float = 1e-3) -> tuple[str, float]:
        """Returns the largest relative update error among the parameters torch's fp32 loop computes within
        ``limit`` of float64 (those whose update is not rounding noise), with its parameter; ``("", nan)`` when
        there is none."""
        determined = {n: e for n, e in self.errors.items() if self.rounding[n] < limit}
        if not determined:
            return "", float("nan")
        name = max(determined, key=lambda n: determined[n])
        return name, determined[name]

    @property
    def failures(self) -> dict[str, tuple[float, float]]:
        """Returns ``{name: (error, allowed)}`` for every parameter off by more than it is allowed."""
        allowed = self.allowed
        return {n: (e, allowed[n]) for n, e in self.errors.items() if not e <= allowed[n]}

    def describe(self) -> str:
        """Returns one line: the case, the worst error, and any failures."""
        name, error = self.worst
        text = f"{self.model} {self.optimizer} {self.path}: worst relative update error {error:.2g} ({name})"
        failures = self.failures
        if failures:
            listed = ", ".join(f"{n} {e:.2g} > {a:.2g}" for n, (e, a) in sorted(failures.items())[:8])
            text += f"; {len(failures)} parameter(s) over their allowance: {listed}"
        return text


def compare(
    case: ModelCase,
    optimizer: OptimizerPair,
    paths: Sequence[str] = PATHS,
    *,
    steps: int = 3,
    batch_size: int = 8,
    microbatch_size: int = 4,
) -> list[Comparison]:
    """Returns the comparison of each path in ``paths`` with its torch reference, for ``steps`` steps on keyed
    random batches of ``batch_size`` (``microbatch_size`` for the microbatched path) from one model built
    under seed 0 of torch's global generator, whose state is restored afterwards."""
    model = case.build_seeded()
    batches = image_batches(case, steps, batch_size)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    references: dict[tuple[int | None, bool, bool, bool], dict[str, Tensor]] = {}

    def reference(
        micro: int | None, channels_last: bool = False, float64: bool = False, bf16: bool = False
    ) -> dict[str, Tensor]:
        key = (micro, channels_last, float64, bf16)
        if key not in references:
            references[key] = torch_reference(
                model, batches, optimizer, microbatch_size=micro, channels_last=channels_last, float64=float64,
                bf16=bf16,
            )  # fmt: skip
        return references[key]

    results = []
    for path in paths:
        micro = microbatch_size if path == "microbatched" else None
        rounding = update_errors(initial, reference(micro), reference(micro, float64=True))
        ours = trainer_result(model, batches, optimizer, path, microbatch_size=microbatch_size)
        errors = update_errors(
            initial, ours, reference(micro, channels_last=path == "channels_last", bf16=path == "bf16")
        )
        results.append(Comparison(case.name, optimizer.name, path, errors, rounding))
    return results
