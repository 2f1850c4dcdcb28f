"""How well a finished Fashion-MNIST run fits its own training images: accuracy on the 60,000 training images
(as read, without the crop or flip) beside the 10,000 held-out ones, from the run's last checkpoint.

A network that scores little more on the images it trained on than on the held-out ones is short of fitting,
not of generalising: a regulariser has nothing to take back there. Each argument is a run folder of a sweep
(``runs/fashion-mnist/<sweep>/<recipe>/<length>/seed<N>``, holding ``checkpoints/latest.pt``); its model is
rebuilt from the model name, image shape, class count and options that the checkpoint records, and takes the
checkpoint's weights and batch-norm statistics. Runs whose methods change the network (squeeze-and-excitation,
BlurPool, Factorize, ...) or whose held-out figure is not of these weights (EMA, SWA) are refused.

    .venv/bin/python benchmarks/fashion_mnist_fit.py RUN_FOLDER [RUN_FOLDER ...] [--threads 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor, nn

from composer_fn.data import load_idx_task
from composer_fn.models.zoo import build_model
from composer_fn.trainer.checkpoint import read_checkpoint

UNSUPPORTED = (
    "squeeze_excite",
    "blurpool",
    "ema",
    "swa",
    "factorize",
    "gyro_dropout",
    "weight_standardization",
)


def accuracy(model: nn.Module, images: Tensor, labels: Tensor, batch: int = 1000) -> float:
    """Percent of ``images`` that ``model`` (in eval mode) labels as ``labels``."""
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), batch):
            correct += int(
                (model(images[start : start + batch]).argmax(1) == labels[start : start + batch]).sum()
            )
    return 100.0 * correct / len(images)


def trained_model(checkpoint: Path) -> nn.Module:
    """The network of a ``composer-fn train`` checkpoint with its weights and statistics, in eval mode."""
    payload = read_checkpoint(checkpoint, "cpu", argument="checkpoint")
    methods = sorted(name for name in UNSUPPORTED if f'"{name}"' in payload["algorithms"])
    if methods:
        raise SystemExit(
            f"{checkpoint}: its methods {methods} change the network or what is evaluated; "
            "expected a run without them"
        )
    metadata = payload.get("metadata") or {}
    if "model" not in metadata:
        raise SystemExit(
            f"{checkpoint}: no model recorded with it; expected a checkpoint of `composer-fn train`"
        )
    model = build_model(
        metadata["model"],
        tuple(metadata["image_shape"]),
        metadata["num_classes"],
        options=metadata["model_kwargs"],
    )
    state = {**payload["params"], **payload["buffers"]}
    model.load_state_dict({name: state[name] for name in model.state_dict()})
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (with checkpoints/latest.pt)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = load_idx_task("fashion-mnist")
    print("| run | training images | held-out images | difference |")
    print("|---|---|---|---|")
    for folder in args.runs:
        model = trained_model(folder / "checkpoints" / "latest.pt")
        train, heldout = accuracy(model, *task.train), accuracy(model, *task.heldout)
        print(f"| {folder} | {train:.2f}% | {heldout:.2f}% | {train - heldout:+.2f} points |")


if __name__ == "__main__":
    main()
