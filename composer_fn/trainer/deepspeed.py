"""The Trainer's options from a DeepSpeed JSON config, for runs that come from DeepSpeed (or Composer's DeepSpeed
integration) with a config in hand.

``deepspeed_options("ds_config.json")`` reads the config and returns a ``DeepSpeedSettings``: the sharding
(``FSDP``), the precision, the microbatch size and the gradient-clipping threshold it asks for. A key that this
project cannot honour exactly (CPU or NVMe offload, DeepSpeed's own optimizers and schedules, a static loss scale,
pipeline or tensor parallelism, an unknown key) is refused with a ValueError naming the key as a dotted path
(``zero_optimization.offload_optimizer.device``), its value and what to do instead; tuning keys that change how
fast a step runs, never what it computes, are accepted and ignored. Nothing is silently trained otherwise.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_fn.core.state import PRECISIONS, Precision
from composer_fn.core.validate import is_bool, is_integer, is_real
from composer_fn.trainer.loss_scale import DynamicLossScale
from composer_fn.trainer.options import FSDP, DTypeName

__all__ = ["DeepSpeedSettings", "deepspeed_options"]

AUTO = "auto"
"""The value Hugging Face's Trainer fills in from its own arguments."""

_RULE = DynamicLossScale()


@dataclass(frozen=True)
class DeepSpeedSettings:
    """The Trainer options a DeepSpeed config sets; None where it sets none (the run's own setting applies).

    Args:
        zero_stage: ``zero_optimization.stage`` as given (0 to 3); None when the config gives none.
        parallelism: the sharding of ``zero_stage``: None (stage 0 or none given), ``FSDP(reshard_after_forward=
            False)`` (stages 1 and 2) or ``FSDP(reshard_after_forward=True)`` (stage 3); the Trainer's
            ``parallelism``.
        precision: ``'bf16-mixed'`` or ``'fp16-mixed'`` when the config enables its bf16 or fp16 block, else None;
            the Trainer's ``precision``.
        microbatch_size: ``train_micro_batch_size_per_gpu``; ``microbatch_size_for`` gives the Trainer's
            ``device_train_microbatch_size`` for a run's batch.
        gradient_accumulation_steps: ``gradient_accumulation_steps``, checked against the run's batch.
        train_batch_size: ``train_batch_size``, the global batch, checked against the run's batch.
        gradient_clipping: the threshold of the gradients' global L2 norm (``GradientClipping(clipping_type=
            'norm', clipping_threshold=...)``); None clips nothing.
    """

    zero_stage: int | None = None
    parallelism: FSDP | None = None
    precision: Precision | None = None
    microbatch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    train_batch_size: int | None = None
    gradient_clipping: float | None = None

    def batch_size(self, world_size: int) -> int | None:
        """Returns the global batch the config implies on ``world_size`` processes: ``train_batch_size``, else
        ``train_micro_batch_size_per_gpu × gradient_accumulation_steps (1 if not given) × world_size``; None when
        it gives neither."""
        if self.train_batch_size is not None:
            return self.train_batch_size
        if self.microbatch_size is not None:
            return self.microbatch_size * (self.gradient_accumulation_steps or 1) * world_size
        return None

    def microbatch_size_for(self, batch_size: int, world_size: int) -> int | None:
        """Returns the Trainer's ``device_train_microbatch_size`` for a run whose global batch is ``batch_size``
        over ``world_size`` processes (each taking ``batch_size / world_size``): None when one microbatch is a
        process's whole batch.

        DeepSpeed's rule holds: ``train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps
        × world_size``; the keys the config leaves out follow from the others and the run's batch. Raises
        ValueError naming the keys and the values that break it.
        """
        batch = _positive("batch_size", batch_size)
        world = _positive("world_size", world_size)
        run = f"the run's global batch is {batch} ({world} process{'es' if world > 1 else ''} × {batch // world})"
        if batch % world:
            raise ValueError(f"batch_size={batch} must be a multiple of world_size={world} (each process's share)")
        per_process = batch // world
        if self.train_batch_size is not None and self.train_batch_size != batch:
            raise ValueError(f"train_batch_size={self.train_batch_size}, but {run}: expected them equal")
        micro, steps = self.microbatch_size, self.gradient_accumulation_steps
        if micro is not None and steps is not None and micro * steps != per_process:
            raise ValueError(
                f"train_micro_batch_size_per_gpu={micro} × gradient_accumulation_steps={steps} = {micro * steps}, but "
                f"{run}: expected the product to be each process's batch, {per_process}"
            )
        if micro is not None and per_process % micro:
            raise ValueError(
                f"train_micro_batch_size_per_gpu={micro} does not divide each process's batch, {per_process} ({run}): "
                "expected a divisor, as DeepSpeed accumulates whole microbatches"
            )
        if micro is None and steps is not None:
            if per_process % steps:
                raise ValueError(
                    f"gradient_accumulation_steps={steps} does not divide each process's batch, {per_process} ({run}): "
                    "expected a divisor"
                )
            micro = per_process // steps
        return None if micro is None or micro == per_process else micro


def _positive(argument: str, value: object) -> int:
    if not is_integer(value) or value < 1:
        raise ValueError(f"{argument}={value!r} must be an int >= 1")
    return int(value)


def deepspeed_options(config: Mapping[str, Any] | str | os.PathLike[str], *, precision: str | None = None) -> DeepSpeedSettings:
    """Returns the Trainer options of a DeepSpeed config: a mapping, or the path of its JSON file.

    Args:
        config: the config, as DeepSpeed reads it (``deepspeed.initialize(config=...)``).
        precision: the run's own precision, which a bf16 or fp16 block's ``"enabled": "auto"`` follows (as Hugging
            Face's Trainer fills it from its arguments); None: such a block is off.

    The keys it maps:

    - ``zero_optimization.stage``: 0 shards nothing; 1 and 2 shard the gradients and the optimizer state and keep
      each unit's gathered parameters from its forward to its backward (``FSDP(reshard_after_forward=False)``;
      stage 1, which shards the optimizer state only, is served by stage 2's sharding, which holds no more
      memory); 3 shards the parameters too (``FSDP(reshard_after_forward=True)``).
    - ``communication_data_type``: the dtype sharded gradients are reduced in (``FSDP.reduce_dtype``; fp32 by
      default).
    - ``bf16.enabled`` / ``fp16.enabled``: precision ``'bf16-mixed'`` / ``'fp16-mixed'`` (autocast; fp16 with
      dynamic loss scaling, ``composer_fn.trainer.loss_scale``); both enabled is an error. The fp16 block's
      rule must be the project's, ``torch.amp.GradScaler``'s: ``loss_scale`` 0 (dynamic), ``initial_scale_power``
      16, ``loss_scale_window`` 2000, ``hysteresis`` 1; ``min_loss_scale`` is refused (the scale has no floor).
      Left out, they take that rule, not DeepSpeed's defaults (window 1000, hysteresis 2, floor 1).
    - ``gradient_clipping``: > 0 clips the gradients' global L2 norm to it; 0 clips nothing.
    - ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``train_batch_size``: the microbatch
      size and the checks of ``DeepSpeedSettings.microbatch_size_for`` (DeepSpeed's rule, ``train_batch_size =
      micro batch × accumulation steps × processes``, against the run's batch); given all three,
      ``train_batch_size`` must already be a multiple of the other two's product.

    ``"auto"`` (Hugging Face's Trainer's placeholder): the batch keys' ``"auto"`` is as if the key were left out
    (the run's batch decides); ``"enabled": "auto"`` follows ``precision``; the tuning keys below take it; any
    other key's ``"auto"`` is refused.

    Accepted and ignored, as they change speed or memory but not what a step computes:
    ``zero_optimization``'s ``allgather_partitions``, ``allgather_bucket_size``, ``overlap_comm``,
    ``reduce_scatter``, ``reduce_bucket_size``, ``contiguous_gradients``, ``round_robin_gradients``,
    ``sub_group_size``, ``stage3_max_live_parameters``, ``stage3_max_reuse_distance``,
    ``stage3_prefetch_bucket_size``, ``stage3_param_persistence_threshold``,
    ``stage3_gather_16bit_weights_on_model_save`` (and its old name with ``fp16``), ``ignore_unused_parameters``,
    ``memory_efficient_linear``, ``elastic_checkpoint``, ``log_trace_cache_warnings``, and
    ``offload_optimizer``/``offload_param`` with ``"device": "none"`` (their other keys then do nothing); the
    reporting keys ``steps_per_print``, ``wall_clock_breakdown``, ``memory_breakdown``, ``dump_state``,
    ``zero_allow_untested_optimizer``, ``zero_force_ds_cpu_optimizer``; the blocks ``tensorboard``, ``wandb``,
    ``csv_monitor``, ``comet``, ``flops_profiler``, ``comms_logger`` and ``amp`` when not enabled; and
    ``activation_checkpointing`` when every key of it is off. Accepted at their defaults only:
    ``prescale_gradients`` false, ``gradient_predivide_factor`` 1, ``sparse_gradients`` false,
    ``zero_optimization.load_from_fp32_weights`` true, ``zero_quantized_weights`` and
    ``zero_quantized_gradients`` false, ``zero_hpz_partition_size`` 1, ``mics_shard_size`` -1, ``cpu_offload``
    false.

    Refused, naming the key: ``optimizer`` and ``scheduler`` (give the Trainer its optimizer and schedule),
    offload to ``"cpu"`` or ``"nvme"``, ``activation_checkpointing`` turned on (DeepSpeed's checkpoint function is
    called by the model's own code; here ``FSDP(activation_checkpointing=True)`` recomputes each unit),
    ``pipeline``, ``tensor_parallel``, an enabled monitor or ``amp`` block, and any key not listed here.

    Raises:
        ValueError: a file that cannot be read, is not JSON or holds no JSON object (naming the path), or a key
            refused as above (naming the key, its value and what is expected).
        TypeError: ``config`` is neither a mapping nor a path.
    """
    data, source = _read(config)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {', '.join(PRECISIONS)} or None")
    reader = _Reader(source)
    reader.known(data, "", (*_MAPPED, *_TOP_LEVEL))
    for key, value in data.items():
        if key in _TOP_LEVEL:
            _TOP_LEVEL[key](reader, key, value)
    stage, parallelism = _zero(reader, data.get("zero_optimization"), data.get("communication_data_type"))
    batch = {key: reader.count(key, data.get(key), minimum=1) for key in _BATCH_KEYS}
    micro, steps, train = (batch[key] for key in _BATCH_KEYS)
    if micro is not None and steps is not None and train is not None and train % (micro * steps):
        raise reader.error(
            "train_batch_size",
            train,
            f"a multiple of train_micro_batch_size_per_gpu={micro} × gradient_accumulation_steps={steps} = "
            f"{micro * steps} (DeepSpeed's rule: train_batch_size = micro batch × accumulation steps × processes)",
        )
    clipping = data.get("gradient_clipping")
    if clipping is not None:
        clipping = reader.real("gradient_clipping", clipping, "a finite number >= 0 (0: no clipping)", minimum=0.0)
    return DeepSpeedSettings(
        zero_stage=stage,
        parallelism=parallelism,
        precision=_precision(reader, data, precision),
        microbatch_size=micro,
        gradient_accumulation_steps=steps,
        train_batch_size=train,
        gradient_clipping=clipping or None,
    )


def _read(config: object) -> tuple[Mapping[str, Any], str]:
    """Returns the config's keys and how errors name it."""
    if isinstance(config, Mapping):
        return config, "DeepSpeed config"
    if not isinstance(config, str | os.PathLike):
        raise TypeError(f"config={config!r}: expected a mapping of DeepSpeed keys or the path of a DeepSpeed JSON file")
    path = Path(config)
    named = f"DeepSpeed config {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as failure:
        raise ValueError(f"{named}: cannot be read ({failure.strerror or failure}); expected a DeepSpeed JSON file") from None
    except UnicodeDecodeError:
        raise ValueError(f"{named}: is not text (not UTF-8); expected a DeepSpeed JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as failure:
        raise ValueError(
            f"{named}: not JSON ({failure.msg} at line {failure.lineno}, column {failure.colno}); expected a JSON "
            'object such as {"zero_optimization": {"stage": 2}}'
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{named}: holds a JSON {type(data).__name__}, not an object; expected an object of DeepSpeed keys such as "
            '{"zero_optimization": {"stage": 2}}'
        )
    return data, named


def _shown(value: object) -> str:
    # JSON's spelling (true, null, "cpu") for what a JSON file holds, shortened for a whole block.
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Reader:
    """Checks a config's values, each error naming the config, the key's dotted path, its value and what is
    expected."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, value: object, expected: str) -> ValueError:
        placeholder = (
            "; \"auto\" is Hugging Face's Trainer's placeholder, filled in from its own arguments: give the value"
            if value == AUTO
            else ""
        )
        return ValueError(f"{self.source}: {key}={_shown(value)}: expected {expected}{placeholder}")

    def known(self, block: object, prefix: str, keys: Mapping[str, object] | tuple[str, ...]) -> Mapping[str, Any]:
        """Returns ``block`` if it is a mapping whose keys are all among ``keys``; raises naming the first other."""
        if not isinstance(block, Mapping):
            raise self.error(prefix.rstrip("."), block, "an object of DeepSpeed keys")
        for key in block:
            if key not in keys:
                near = difflib.get_close_matches(str(key), list(keys), n=1)
                raise ValueError(
                    f"{self.source}: {prefix}{key}={_shown(block[key])}: not a DeepSpeed key this project maps"
                    + (f" (did you mean {prefix}{near[0]}?)" if near else "")
                    + f"; accepted{f' in {prefix[:-1]}' if prefix else ''}: {', '.join(keys)}"
                )
        return block

    def flag(self, key: str, value: object) -> bool:
        if not is_bool(value):
            raise self.error(key, value, "true or false")
        return bool(value)

    def count(self, key: str, value: object, *, minimum: int = 0) -> int | None:
        """Returns an int >= ``minimum``; None for None or ``"auto"``."""
        if value is None or value == AUTO:
            return None
        if not is_integer(value) or value < minimum:
            raise self.error(key, value, f'a whole number >= {minimum}, or "auto"')
        return int(value)

    def real(self, key: str, value: object, expected: str, *, minimum: float) -> float:
        if not is_real(value) or is_bool(value) or not math.isfinite(float(value)) or float(value) < minimum:
            raise self.error(key, value, expected)
        return float(value)

    def size(self, key: str, value: object) -> None:
        """Checks a tuning size: a number >= 0 (``5e8`` as JSON writes it) or ``"auto"``."""
        if value != AUTO:
            self.real(key, value, 'a number >= 0, or "auto"', minimum=0.0)

    def pinned(self, key: str, value: object, default: object, why: str) -> None:
        """Checks that ``value`` is ``default``, the one value this project honours."""
        same = is_bool(value) == is_bool(default) and (value == default if not is_bool(value) else bool(value) is default)
        if not same:
            raise self.error(key, value, f"{_shown(default)} ({why}), or leave the key out")

    def disabled(self, key: str, value: object, instead: str) -> None:
        """Checks a block that this project accepts only when its ``enabled`` is false."""
        # Its other keys do nothing while it is off.
        if not isinstance(value, Mapping):
            raise self.error(key, value, 'an object such as {"enabled": false}')
        enabled = value.get("enabled", False)
        if enabled is not False:
            raise self.error(f"{key}.enabled", enabled, f"false: this project does not run DeepSpeed's {key}; {instead}")


Check = Callable[[_Reader, str, Any], None]


def _ignored(kind: str) -> Check:
    """Returns the check of a key accepted and ignored: its value's form only (``kind``: flag, size or count)."""

    def check(reader: _Reader, key: str, value: Any) -> None:
        if kind == "flag":
            reader.flag(key, value)
        elif kind == "size":
            reader.size(key, value)
        else:
            reader.count(key, value)

    return check


def _pinned(default: object, why: str) -> Check:
    return lambda reader, key, value: reader.pinned(key, value, default, why)


def _refused(instead: str) -> Check:
    def check(reader: _Reader, key: str, value: Any) -> None:
        raise reader.error(key, value, f"no {key} key: {instead}")

    return check


def _monitor(instead: str) -> Check:
    return lambda reader, key, value: reader.disabled(key, value, instead)


_LOGGERS = "report with the Trainer's loggers= (composer_fn.loggers; a recipe's [loggers] table)"
_ONE_PATH = "this project trains data-parallel, sharded over every process by FSDP; leave the key out"
_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
_MAPPED = (*_BATCH_KEYS, "gradient_clipping", "zero_optimization", "communication_data_type", "bf16", "fp16")
"""The top-level keys that set an option (read together, as they depend on each other)."""

_TOP_LEVEL: Mapping[str, Check] = {
    "activation_checkpointing": lambda reader, key, value: _activation_checkpointing(reader, value),
    "steps_per_print": _ignored("count"),
    "wall_clock_breakdown": _ignored("flag"),
    "memory_breakdown": _ignored("flag"),
    "dump_state": _ignored("flag"),
    "zero_allow_untested_optimizer": _ignored("flag"),
    "zero_force_ds_cpu_optimizer": _ignored("flag"),
    "prescale_gradients": _pinned(False, "gradients are averaged after their reduction"),
    "gradient_predivide_factor": _pinned(1.0, "gradients are averaged after their reduction"),
    "sparse_gradients": _pinned(False, "gradients are reduced dense"),
    "optimizer": _refused(
        "give the optimizer to the Trainer (optimizer=composer_fn.optim.adamw(...)), or to composer-fn train "
        "(--optimizer, a recipe's [optimizer] table)"
    ),
    "scheduler": _refused(
        "give the schedule to the Trainer (schedule=composer_fn.optim.schedules.CosineAnnealingWithWarmupScheduler("
        "...)), or to composer-fn train (a recipe's [schedule] table)"
    ),
    "pipeline": _refused(_ONE_PATH),
    "tensor_parallel": _refused(_ONE_PATH),
    "amp": _monitor("set the precision instead (Trainer precision='bf16-mixed' or 'fp16-mixed', --precision)"),
    "tensorboard": _monitor(_LOGGERS),
    "wandb": _monitor(_LOGGERS),
    "csv_monitor": _monitor(_LOGGERS),
    "comet": _monitor(_LOGGERS),
    "comms_logger": _monitor(_LOGGERS),
    "flops_profiler": _monitor("profile with composer_fn.profiler.Profiler (composer-fn profile)"),
}
"""Each other top-level key this project accepts, with its check (it sets nothing)."""

_OFFLOAD_KEYS = (
    "device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory", "pipeline", "pipeline_read",
    "pipeline_write", "fast_init", "ratio",
)  # fmt: skip

_ZERO: Mapping[str, Check] = {
    "allgather_partitions": _ignored("flag"),
    "allgather_bucket_size": _ignored("size"),
    "overlap_comm": _ignored("flag"),
    "reduce_scatter": _ignored("flag"),
    "reduce_bucket_size": _ignored("size"),
    "contiguous_gradients": _ignored("flag"),
    "round_robin_gradients": _ignored("flag"),
    "sub_group_size": _ignored("size"),
    "stage3_max_live_parameters": _ignored("size"),
    "stage3_max_reuse_distance": _ignored("size"),
    "stage3_prefetch_bucket_size": _ignored("size"),
    "stage3_param_persistence_threshold": _ignored("size"),
    "stage3_gather_16bit_weights_on_model_save": _ignored("flag"),
    "stage3_gather_fp16_weights_on_model_save": _ignored("flag"),
    "ignore_unused_parameters": _ignored("flag"),
    "memory_efficient_linear": _ignored("flag"),
    "elastic_checkpoint": _ignored("flag"),
    "log_trace_cache_warnings": _ignored("flag"),
    "load_from_fp32_weights": _pinned(True, "the parameters are kept and checkpointed in fp32"),
    "zero_quantized_weights": _pinned(False, "parameters are gathered unquantized"),
    "zero_quantized_gradients": _pinned(False, "gradients are reduced unquantized"),
    "zero_hpz_partition_size": _pinned(1, "for groups that shard among themselves, use FSDP(replicate=...) (HSDP)"),
    "mics_shard_size": _pinned(-1, "for groups that shard among themselves, use FSDP(replicate=...) (HSDP)"),
    "cpu_offload": _pinned(False, "CPU offload is not supported: the optimizer state stays on the device"),
}
"""Each key of ``zero_optimization`` but ``stage`` and the offload blocks, with its check (it sets nothing)."""

_STAGES = {0: None, 1: FSDP(reshard_after_forward=False), 2: FSDP(reshard_after_forward=False), 3: FSDP()}
_REDUCE_DTYPES: dict[str, DTypeName] = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def _zero(reader: _Reader, block: object, communication: object) -> tuple[int | None, FSDP | None]:
    """Returns the ZeRO stage given and its sharding, with gradients reduced in ``communication_data_type``."""
    stage = None
    if block is not None:
        zero = reader.known(block, "zero_optimization.", ("stage", "offload_optimizer", "offload_param", *_ZERO))
        for key, value in zero.items():
            if key in _ZERO:
                _ZERO[key](reader, f"zero_optimization.{key}", value)
        for part in ("offload_optimizer", "offload_param"):
            if part in zero:
                _offload(reader, f"zero_optimization.{part}", zero[part])
        if "stage" in zero:
            stage = zero["stage"]
            if not is_integer(stage) or stage not in _STAGES:
                raise reader.error("zero_optimization.stage", stage, "0, 1, 2 or 3 (ZeRO's stage)")
            stage = int(stage)
    sharding = _STAGES[stage] if stage is not None else None
    if communication is None or communication == "fp32":
        return stage, sharding
    if communication not in _REDUCE_DTYPES:
        raise reader.error("communication_data_type", communication, '"fp32", "bf16", "fp16" or null')
    if sharding is None:
        raise reader.error(
            "communication_data_type",
            communication,
            '"fp32" or null: an unsharded run (no zero_optimization.stage >= 1) reduces the gradients in fp32, their '
            "own dtype",
        )
    return stage, FSDP(reshard_after_forward=sharding.reshard_after_forward, reduce_dtype=_REDUCE_DTYPES[communication])


def _offload(reader: _Reader, key: str, block: object) -> None:
    offload = reader.known(block, f"{key}.", _OFFLOAD_KEYS)
    device = offload.get("device", "none")
    if device in ("cpu", "nvme"):
        raise reader.error(
            f"{key}.device",
            device,
            f'"none": offload to {device.upper() if device == "cpu" else "NVMe"} is not supported (FSDP keeps the '
            f"parameters, gradients and optimizer state on the device); shard over more processes (zero_optimization."
            f"stage 3) to hold less each, or leave {key} out",
        )
    if device is not None and device != "none":
        raise reader.error(f"{key}.device", device, '"none" (offload is not supported)')


_ACTIVATION_CHECKPOINTING = (
    "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization", "number_checkpoints",
    "synchronize_checkpoint_boundary", "profile",
)  # fmt: skip


def _activation_checkpointing(reader: _Reader, block: object) -> None:
    # DeepSpeed's block configures deepspeed.checkpointing.checkpoint, which a model's own code calls; it chooses
    # nothing to recompute, so only a block with every option off means the same here.
    given = reader.known(block, "activation_checkpointing.", _ACTIVATION_CHECKPOINTING)
    for key, value in given.items():
        if value is not None and value is not False:
            raise reader.error(
                f"activation_checkpointing.{key}",
                value,
                "false: DeepSpeed's activation checkpointing is called by the model's own code (with CPU offload "
                "and partitioning over model-parallel ranks, which this project does not do); here "
                "FSDP(activation_checkpointing=True) recomputes each sharded unit's activations in the backward",
            )


_FP16: Mapping[str, tuple[object, str]] = {
    "loss_scale": (0, "dynamic loss scaling; a static scale is not supported"),
    "initial_scale_power": (
        round(math.log2(_RULE.init_scale)),
        f"the dynamic loss scale starts at 2**{round(math.log2(_RULE.init_scale))}, torch.amp.GradScaler's",
    ),
    "loss_scale_window": (
        _RULE.growth_interval,
        f"the scale doubles after {_RULE.growth_interval} finite steps in a row, torch.amp.GradScaler's rule",
    ),
    "hysteresis": (1, "the scale halves at every overflowing step, torch.amp.GradScaler's rule"),
}
"""Each fp16 loss-scaling key with the one value the project's rule (``DynamicLossScale()``) has, and why."""


def _precision(reader: _Reader, data: Mapping[str, Any], run: str | None) -> Precision | None:
    """Returns the precision the bf16 and fp16 blocks enable; ``run`` is the run's own, which ``"auto"`` follows."""
    enabled: dict[str, bool] = {}
    for block, name in (("bf16", "bf16-mixed"), ("fp16", "fp16-mixed")):
        if block not in data:
            continue
        keys = ("enabled", *_FP16, "consecutive_hysteresis", "min_loss_scale") if block == "fp16" else ("enabled",)
        given = reader.known(data[block], f"{block}.", keys)
        switch = given.get("enabled", False)
        if switch == AUTO:
            enabled[block] = run == name
        else:
            enabled[block] = reader.flag(f"{block}.enabled", switch)
        if block == "fp16" and enabled[block]:
            _fp16_rule(reader, given)
    if enabled.get("bf16") and enabled.get("fp16"):
        raise reader.error(
            "fp16.enabled", data["fp16"]["enabled"], "false when bf16.enabled is true: one mixed precision a run"
        )
    if enabled.get("bf16"):
        return "bf16-mixed"
    return "fp16-mixed" if enabled.get("fp16") else None


def _fp16_rule(reader: _Reader, block: Mapping[str, Any]) -> None:
    for key, (value, why) in _FP16.items():
        if key in block:
            reader.pinned(f"fp16.{key}", block[key], value, why)
    if "consecutive_hysteresis" in block:
        reader.flag("fp16.consecutive_hysteresis", block["consecutive_hysteresis"])
    if "min_loss_scale" in block:
        raise reader.error(
            "fp16.min_loss_scale",
            block["min_loss_scale"],
            "no min_loss_scale: the dynamic loss scale has no floor (it halves at every overflowing step, "
            "torch.amp.GradScaler's rule); leave the key out",
        )
