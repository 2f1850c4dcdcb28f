"""Export a trained module for inference: TorchScript, ``torch.export`` (``.pt2``) or ONNX, each checked.

``export_model(module, example, path, format=...)`` writes the module (``Trainer.model`` or ``load_model``'s)
atomically, reads the written file back, runs it on ``example`` and compares its outputs with the module's: an
export whose outputs differ by more than ``tolerance`` is refused and nothing is left at ``path``. The batch
dimension is dynamic for ``pt2`` and ``onnx`` (any batch size runs); a TorchScript trace is specialised to the
example's shapes where the module's code reads them.

- ``torchscript``: ``torch.jit.trace`` in eval mode, saved with ``torch.jit.save``; load with ``torch.jit.load``.
- ``pt2``: ``torch.export.export`` then ``torch.export.save``; load with ``torch.export.load(path).module()``.
- ``onnx``: ``torch.onnx.export(..., dynamo=True)``, which needs the optional ``onnx`` and ``onnxscript``
  packages (``pip install -e '.[export]'``); the check runs the file with ``onnxruntime`` when it is
  installed, else with ``onnx``'s reference evaluator.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.core import validate
from composer_fn.core.extras import install_command
from composer_fn.loggers._paths import file_path

__all__ = ["FORMATS", "export_model", "ExportCheck", "run_exported", "Standardized"]

FORMATS = ("torchscript", "pt2", "onnx")
"""The formats ``export_model`` writes."""

SUFFIXES = {"torchscript": ".ts", "pt2": ".pt2", "onnx": ".onnx"}
"""The file name ending each format gets when the command line chooses the name."""


class ExportCheck:
    """What ``export_model`` measured: the largest absolute difference between the exported program's outputs
    and the module's on the example and the check batches, the tolerance it was held to, how many batches were
    compared, and ``specialised``: what a TorchScript trace fixed to the example (the tracer's warnings: a
    value-dependent branch, a shape read as a constant), empty when nothing was."""

    def __init__(
        self,
        path: Path,
        format: str,
        max_difference: float,
        tolerance: float,
        batches: int = 1,
        specialised: tuple[str, ...] = (),
    ) -> None:
        self.path, self.format, self.max_difference, self.tolerance = path, format, max_difference, tolerance
        self.batches, self.specialised = batches, specialised

    def __repr__(self) -> str:
        return (
            f"ExportCheck(path={str(self.path)!r}, format={self.format!r}, "
            f"max_difference={self.max_difference:.3g}, tolerance={self.tolerance:.3g}, batches={self.batches}, "
            f"specialised={self.specialised!r})"
        )


class Standardized(nn.Module):
    """``model((images - mean) / std)``: a classifier trained on standardised images, taking images in ``[0, 1]``
    (pixels / 255) as users have them, so that an exported program carries its standardisation.

    Args:
        model: the trained module.
        mean: the per-channel means (one value per channel, or one for all).
        std: the per-channel standard deviations, likewise; each > 0.
    """

    mean: Tensor
    std: Tensor

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        if len(mean) != len(std) or not len(mean) or not all(validate.is_real(s) and s > 0 for s in std):
            raise ValueError(f"mean={list(mean)!r}, std={list(std)!r}: expected as many of each, one per channel, each std > 0")
        self.model = model
        device = next((t.device for t in model.parameters()), torch.device("cpu"))
        self.register_buffer("mean", torch.tensor([float(m) for m in mean], device=device).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor([float(v) for v in std], device=device).view(1, -1, 1, 1))

    def forward(self, images: Tensor) -> Tensor:
        """Returns the model's outputs on the standardised images."""
        outputs: Tensor = self.model((images - self.mean) / self.std)
        return outputs


def export_model(
    module: nn.Module,
    example: Tensor,
    path: str | os.PathLike[str],
    *,
    format: str = "torchscript",
    tolerance: float = 1e-5,
    check_batches: Sequence[Tensor] = (),
) -> ExportCheck:
    """Returns the check of ``module`` exported to ``path`` in ``format``, its outputs compared on ``example`` and
    on each of ``check_batches``.

    ``example`` is a batch of inputs as the module takes them (``[N, C, H, W]`` images, at least two samples so
    that the batch dimension can be dynamic). ``check_batches`` are more batches (of any size) the written program
    must agree on: a program that the example specialised (a branch on a value, a shape read as a constant) gives
    other answers there. The comparison is ``max |exported - module| <= tolerance * max(1, max |module|)`` on every
    batch; a larger difference raises ``ValueError`` and removes the file. ``module`` is put in eval mode for the
    export and returned to its mode afterwards.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module of type {type(module).__name__}: expected a torch.nn.Module (Trainer.model, load_model)")
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not an export format; accepted: {', '.join(FORMATS)}")
    if not isinstance(example, Tensor) or example.dim() < 1 or example.shape[0] < 2:
        shape = tuple(example.shape) if isinstance(example, Tensor) else type(example).__name__
        raise ValueError(f"example={shape}: expected a batch tensor of at least 2 samples along dim 0, e.g. [8, 1, 28, 28]")
    if not (validate.is_real(tolerance) and math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance={tolerance!r} must be a number > 0, e.g. 1e-5")
    tolerance = float(tolerance)
    target = file_path("path", path, f"model{SUFFIXES[format]}")
    if format == "onnx":
        _require_onnx()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"path={str(path)!r}: its folder cannot be created ({error.strerror or error})") from None
    device = next((t.device for t in module.parameters()), example.device)
    example = example.to(device)
    batches = [example, *(batch.to(device) for batch in check_batches)]
    with _eval_mode(module), torch.no_grad():
        expected = []
        for index, batch in enumerate(batches):
            try:
                expected.append(module(batch))
            except (RuntimeError, ValueError, TypeError, IndexError) as error:
                where = "example" if index == 0 else f"check_batches[{index - 1}]"
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ValueError(
                    f"{where} of shape {tuple(batch.shape)} ({batch.dtype}): {type(module).__name__} fails on it ({first}); "
                    "expected a batch of the inputs the module takes, as it took them in training"
                ) from error
        if not isinstance(expected[0], Tensor):
            raise TypeError(f"module returns {type(expected[0]).__name__}; export_model exports modules returning one tensor")
        # The temporary name keeps the ending: torch.export reads and writes archives by it.
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
        os.close(handle)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", torch.jit.TracerWarning)
                _WRITERS[format](module, example, Path(temporary))
            specialised = tuple(dict.fromkeys(
                str(w.message).strip().splitlines()[0] for w in caught if issubclass(w.category, torch.jit.TracerWarning)
            ))  # fmt: skip
            difference, scale = 0.0, 1.0
            for index, (batch, wanted) in enumerate(zip(batches, expected, strict=True)):
                produced = run_exported(Path(temporary), format, batch)
                if produced.shape != wanted.shape:
                    raise ValueError(
                        f"the {format} export of {type(module).__name__} gives outputs of shape {tuple(produced.shape)} on "
                        f"{'the example' if index == 0 else f'check batch {index}'} ({len(batch)} samples), the module "
                        f"{tuple(wanted.shape)}: the example fixed a shape; nothing was written to {target}"
                    )
                gap = float((produced.to(wanted.device, wanted.dtype) - wanted).abs().max())
                allowed = max(1.0, float(wanted.abs().max()))
                if not gap <= tolerance * allowed:
                    where = "the example" if index == 0 else f"check batch {index} ({len(batch)} samples)"
                    fixed = f"; the trace fixed to the example: {specialised[0]}" if specialised else ""
                    raise ValueError(
                        f"the {format} export of {type(module).__name__} gives outputs up to {gap:.3g} away from the "
                        f"module's on {where} (tolerance {tolerance:.3g} × {allowed:.3g}){fixed}; nothing was written "
                        f"to {target}"
                    )
                difference, scale = max(difference, gap), max(scale, allowed)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    return ExportCheck(target, format, difference, tolerance * scale, len(batches), specialised)


def run_exported(path: str | os.PathLike[str], format: str, inputs: Tensor) -> Tensor:
    """Returns the outputs of the exported program at ``path`` (in ``format``) on ``inputs``, run as a user would
    load it: ``torch.jit.load``, ``torch.export.load(...).module()``, or an ONNX runtime."""
    if format == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.jit.load(str(path), map_location=inputs.device)
        with torch.no_grad():
            result: Tensor = program(inputs)
        return result
    if format == "pt2":
        loaded = torch.export.load(str(path)).module()
        with torch.no_grad():
            result = loaded(inputs)
        return result
    if format == "onnx":
        return _run_onnx(Path(path), inputs)
    raise ValueError(f"format={format!r} is not an export format; accepted: {', '.join(FORMATS)}")


@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(training)


def _write_torchscript(module: nn.Module, example: Tensor, path: Path) -> None:
    with warnings.catch_warnings():
        # torch.jit is in maintenance upstream and says so on every call; the file it writes is what we check.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        # Shape checks in the module's code become constants of the trace (the tracer warns of each; export_model
        # reports them as what the trace specialised).
        program = torch.jit.trace(module, example, check_trace=False)
        torch.jit.save(program, str(path))


def _batch_dimension(example: Tensor) -> dict[str, Any]:
    batch = torch.export.Dim("batch", min=1)
    return {"x": {0: batch}}


class _Positional(nn.Module):
    # torch.export names dynamic shapes by the forward's argument names; this gives every module one, "x".
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        result: Tensor = self.module(x)
        return result


def _exported_program(module: nn.Module, example: Tensor) -> Any:
    wrapped = _Positional(module).eval()
    try:
        return torch.export.export(wrapped, (example,), dynamic_shapes=_batch_dimension(example))
    except Exception:  # noqa: BLE001 -- a module whose code fixes the batch size still exports, at that size
        return torch.export.export(wrapped, (example,))


def _write_pt2(module: nn.Module, example: Tensor, path: Path) -> None:
    torch.export.save(_exported_program(module, example), str(path))


def _write_onnx(module: nn.Module, example: Tensor, path: Path) -> None:
    wrapped = _Positional(module).eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                wrapped,
                (example,),
                dynamo=True,
                dynamic_shapes=_batch_dimension(example),
                input_names=["input"],
                output_names=["logits"],
            )
        except Exception:  # noqa: BLE001 -- as for pt2: a fixed batch size rather than no export
            program = torch.onnx.export(wrapped, (example,), dynamo=True, input_names=["input"], output_names=["logits"])
        assert program is not None
        program.save(str(path))


_WRITERS = {"torchscript": _write_torchscript, "pt2": _write_pt2, "onnx": _write_onnx}


def _require_onnx() -> None:
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"format='onnx' needs the packages {', '.join(missing)}, which are not installed: "
            f"{install_command('export')} (onnx, onnxscript, onnxruntime)"
        )


def _run_onnx(path: Path, inputs: Tensor) -> Tensor:
    array = inputs.detach().cpu().numpy()
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return torch.from_numpy(session.run(None, {name: array})[0])
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(str(path))
    name = evaluator.input_names[0]
    outputs: Any = evaluator.run(None, {name: array})
    return torch.from_numpy(outputs[0])
