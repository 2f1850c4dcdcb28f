"""Every method on the models users bring: does it train and change the model, or say why it does not?

Usage: python benchmarks/method_matrix.py [--models a,b] [--methods x,y] [--steps 2] [--json PATH]
       [--markdown PATH] [--render JSON]

``--markdown`` writes the matrix as a page (methods by models, then why each cell warned or was refused);
``--render JSON`` writes that page from an earlier run's ``--json`` without training.

Rows: the torchvision and timm models of ``composer_fn.testing.models.VISION_MODELS`` (64×64 images, ViTs at
32×32) and the Hugging Face GPT-2, BERT (masked LM and classification) and Llama of ``LANGUAGE_MODELS``
(right-padded 16-token batches with their ``attention_mask``); then ``MORE_ROWS``, library models whose
structure trips methods up: auxiliary heads (GoogLeNet, Inception v3), one resolution only (LeViT, MaxViT)
and a parent reading its layer's weight (Swin v2), each at the smallest size its library accepts. Columns: every registered method, built with its
defaults as a new user would. Each cell trains 2 epochs of ``--steps`` batches of 2 through the Trainer (SGD,
seed 0; two epochs, so that methods acting at an epoch's end act) and is compared with the same run without the
method:

- ``changes``: the trained model (``Trainer.model``: its modules, its parameters' memory layout, or its outputs on
  a probe batch) differs;
- ``warned: …``: the method said it changes nothing (or why), and the model is the baseline's;
- ``refused: …``: a ValueError or TypeError raised by composer_fn before or during training, naming why;
- ``SILENT``: nothing changed and nothing was said — a defect;
- ``DEEP ERROR``: an exception raised inside torch or a model's library — a defect.

The run ends with the defects counted; it exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

import composer_fn.algorithms  # noqa: F401  (registers every method)
from composer_fn import optim
from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing.models import (
    LANGUAGE_MODELS,
    VISION_MODELS,
    language_model,
    token_batches,
    vision_model,
)
from composer_fn.trainer import Trainer

STOPPERS = {"early_stopper", "threshold_stopper"}
METHODS = sorted(set(REGISTRY) - STOPPERS)
MORE_ROWS = {
    "torchvision/googlenet": 64,
    "torchvision/inception_v3": 299,
    "torchvision/maxvit_t": 224,
    "torchvision/swin_v2_t": 64,
    "timm/levit_128s": 224,
}
"""Library models at full width whose structure trips methods up, with the image size each is trained at."""
ROWS = [*VISION_MODELS, *(f"hf/{name}" for name in LANGUAGE_MODELS), *MORE_ROWS]


def _batches(row: str, steps: int) -> tuple[list[Any], Any]:
    # Training batches and a probe batch the models are compared on.
    generator = torch.Generator().manual_seed(0)
    if row.startswith("hf/"):
        kind = {"hf/gpt2": "causal", "hf/llama": "causal", "hf/bert-mlm": "masked"}.get(row, "classification")
        batches = token_batches(steps + 1, batch_size=2, length=16, kind=kind)
        return batches[:steps], batches[steps]
    size = MORE_ROWS.get(row, 32 if "vit" in row else 64)
    images = torch.rand(steps + 1, 2, 3, size, size, generator=generator)
    labels = torch.randint(0, 10, (steps + 1, 2), generator=generator)
    batches = [(images[i], labels[i]) for i in range(steps + 1)]
    return batches[:steps], batches[steps]


def _model(row: str) -> nn.Module:
    if row.startswith("hf/"):
        return language_model(row[3:])  # type: ignore[no-any-return]
    if row in MORE_ROWS:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            library, _, architecture = row.partition("/")
            if library == "timm":
                import timm

                return timm.create_model(architecture, pretrained=False, num_classes=10)  # type: ignore[no-any-return]
            import torchvision

            # GoogLeNet and Inception v3 with their auxiliary heads, as torchvision builds them to train.
            extra = {"aux_logits": True, "init_weights": False} if "googlenet" in row or "inception" in row else {}
            return torchvision.models.get_model(architecture, weights=None, num_classes=10, **extra)  # type: ignore[no-any-return]
    return vision_model(row)


def _run(row: str, method: str | None, steps: int, epochs: int = 2) -> tuple[nn.Module, Any]:
    batches, probe = _batches(row, steps)
    algorithms = [REGISTRY[method]()] if method is not None else []
    trainer = Trainer(
        _model(row), batches, max_duration=f"{epochs}ep", algorithms=algorithms, seed=0,
        optimizer=optim.sgd(learning_rate=0.01), progress_bar=False,
    )  # fmt: skip
    trainer.fit()
    model = trainer.model
    with torch.no_grad():
        if isinstance(probe, dict):
            inputs = {k: v for k, v in probe.items() if k != "labels"}
            output = model(**inputs).logits
        else:
            output = model(probe[0])
    # A model with auxiliary heads answers with a record in training; the probe reads its main logits.
    return model, getattr(output, "logits", output)


def _structure(model: nn.Module) -> list[tuple[str, Any]]:
    # The modules' classes and the parameters' memory layouts (ChannelsLast changes only those).
    modules = [(name, type(m).__name__) for name, m in model.named_modules()]
    return modules + [(name, p.stride()) for name, p in model.named_parameters()]


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    return frames[-1].filename if frames else ""


def _cell(row: str, method: str, steps: int, baseline: tuple[nn.Module, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model, output = _run(row, method, steps)
        except (ValueError, TypeError) as error:
            raised_in = _where(error)
            ours = "composer_fn" in raised_in
            return {
                "outcome": "refused" if ours else "DEEP ERROR",
                "message": f"{type(error).__name__}: {error}".splitlines()[0],
                "where": raised_in,
                "seconds": time.perf_counter() - start,
            }
        except Exception as error:  # noqa: BLE001 (every other exception is a defect to report)
            return {
                "outcome": "DEEP ERROR",
                "message": f"{type(error).__name__}: {error}".splitlines()[0],
                "where": _where(error),
                "seconds": time.perf_counter() - start,
            }
    said = [
        str(w.message)
        for w in caught
        if issubclass(w.category, UserWarning) and "no optimizer given" not in str(w.message)
    ]
    base_model, base_output = baseline
    changed = _structure(model) != _structure(base_model) or output.shape != base_output.shape
    changed = changed or not torch.equal(output, base_output)
    outcome = "changes" if changed else ("warned" if said else "SILENT")
    return {
        "outcome": outcome,
        "message": said[0].splitlines()[0]
        if said and not changed
        else (said[0].splitlines()[0] if said else ""),
        "seconds": time.perf_counter() - start,
    }


SHORT = {
    "torchvision/resnet18": "tv r18", "torchvision/resnet50": "tv r50", "torchvision/mobilenet_v3_small": "tv mnv3",
    "torchvision/efficientnet_b0": "tv effb0", "torchvision/convnext_tiny": "tv cnx-t", "torchvision/vit_b_16": "tv vit",
    "timm/resnet18": "timm r18", "timm/efficientnet_b0": "timm effb0", "timm/convnext_atto": "timm cnx-a",
    "timm/vit_tiny_patch16_224": "timm vit", "hf/gpt2": "GPT-2", "hf/bert-mlm": "BERT-MLM",
    "hf/bert-classification": "BERT-cls", "hf/llama": "Llama", "torchvision/googlenet": "tv googlenet",
    "torchvision/inception_v3": "tv incep3", "torchvision/maxvit_t": "tv maxvit", "torchvision/swin_v2_t": "tv swin2",
    "timm/levit_128s": "timm levit",
}  # fmt: skip
MARKS = {"changes": "✓", "warned": "W", "refused": "R", "SILENT": "**SILENT**", "DEEP ERROR": "**ERROR**"}


def render(results: dict[str, dict[str, Any]]) -> str:
    """Returns the matrix as Markdown: methods by models, then the reasons of the warned and refused cells."""
    rows = list(results)
    methods = sorted({m for cells in results.values() for m in cells})
    lines = [
        "| method | " + " | ".join(SHORT.get(r, r) for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for method in methods:
        cells = [MARKS[results[r][method]["outcome"]] if method in results[r] else "" for r in rows]
        lines.append(f"| `{method}` | " + " | ".join(cells) + " |")
    reasons: list[str] = []
    for method in methods:
        said: dict[str, list[str]] = {}
        for row in rows:
            cell = results[row].get(method)
            if cell is not None and cell["outcome"] in ("warned", "refused") and cell["message"]:
                text = cell["message"].replace("|", "\\|")
                said.setdefault(f"{MARKS[cell['outcome']]}: {text}", []).append(SHORT.get(row, row))
        for text, where in said.items():
            reasons.append(f"- `{method}` on {', '.join(where)} — {text}")
    return "\n".join(lines) + "\n\n" + "\n".join(reasons) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ROWS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--render", type=Path, default=None)
    args = parser.parse_args()
    if args.render is not None:
        page = render(json.loads(args.render.read_text()))
        if args.markdown is not None:
            args.markdown.write_text(page)
        else:
            print(page)
        return
    rows, methods = args.models.split(","), args.methods.split(",")
    results: dict[str, dict[str, Any]] = {}
    for row in rows:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            baseline = _run(row, None, args.steps)
        results[row] = {}
        for method in methods:
            cell = _cell(row, method, args.steps, baseline)
            results[row][method] = cell
            print(f"{row:32s} {method:24s} {cell['outcome']:10s} {cell['message'][:150]}", flush=True)
    defects = [(r, m, c) for r, cells in results.items() for m, c in cells.items() if c["outcome"].isupper()]
    counts: dict[str, int] = {}
    for cells in results.values():
        for cell in cells.values():
            counts[cell["outcome"]] = counts.get(cell["outcome"], 0) + 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    for row, method, cell in defects:
        print(f"DEFECT {row} × {method}: {cell['outcome']} {cell['message']} ({cell.get('where', '')})")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(render(results))
    sys.exit(1 if defects else 0)


if __name__ == "__main__":
    main()
