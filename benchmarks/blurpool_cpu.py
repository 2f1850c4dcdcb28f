"""BlurPool's strided blur on the CPU in 16-bit floats: torch's depthwise kernel against ``blur_2d``.

``blur_2d`` at a stride above 1, in bfloat16 or float16 on the CPU (16-bit images, or autocast), sums the same
16-bit values in fp32 and rounds the result back, because the 16-bit CPU kernel of a strided depthwise
convolution has a backward many times slower than the fp32 one. Two measurements, each in one process run:

- **the op**: ``blurmax_pool2d`` forward and backward (an upstream gradient of the output's shape), at the two
  max poolings of the Fashion-MNIST baseline (``two_conv_bn`` width 16, batch 128), against the same max
  pooling and blur written with the 16-bit ``F.conv2d`` (what Composer's ``blur_2d`` calls);
- **the step**: a training step of that network in bf16 autocast (forward, cross-entropy, backward, SGD),
  without BlurPool, with ``apply_blurpool``, and with the same surgery whose blur is the 16-bit ``F.conv2d``.

Rounds alternate the contenders; the figures are medians over rounds of the mean time per call.

    .venv/bin/python benchmarks/blurpool_cpu.py [--threads 2] [--rounds 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms.blurpool import BlurMaxPool2d, apply_blurpool, blurmax_pool2d, default_blur_filter
from composer_fn.core import random as R
from composer_fn.models.zoo import build_model


def torch_blurmax_pool2d(input: Tensor, kernel_size: int, stride: int) -> Tensor:
    """The max at stride 1, then the 3×3 binomial blur as torch's depthwise ``F.conv2d`` in the input's dtype."""
    maxima = F.max_pool2d(input, kernel_size=kernel_size, stride=1)
    channels = input.shape[1]
    filter = default_blur_filter().to(input.dtype).expand(channels, 1, 3, 3)
    return F.conv2d(maxima, filter, stride=stride, padding=1, groups=channels)


class TorchBlurMaxPool2d(nn.Module):
    """``BlurMaxPool2d`` whose blur is torch's depthwise kernel, 16-bit under autocast."""

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:
        return torch_blurmax_pool2d(input, self.kernel_size, self.stride)


def timed(call: Callable[[], object], repeats: int) -> float:
    """Mean seconds per call over ``repeats`` calls, after two warm-up calls."""
    for _ in range(2):
        call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def median_rounds(contenders: dict[str, Callable[[], object]], rounds: int, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, call in contenders.items():
            times[name].append(timed(call, repeats))
    return {name: statistics.median(values) for name, values in times.items()}


def op_contenders(shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    images = R.normal(R.key(0), shape).to(dtype).requires_grad_()
    upstream = R.normal(R.key(1), blurmax_pool2d(images, 2).shape).to(dtype)

    def torch_kernel() -> object:
        return torch.autograd.grad(torch_blurmax_pool2d(images, 2, 2), images, upstream)

    def ours() -> object:
        return torch.autograd.grad(blurmax_pool2d(images, 2), images, upstream)

    return {"torch 16-bit kernel": torch_kernel, "composer_fn blur_2d": ours}


def step_contenders(batch: int) -> dict[str, Callable[[], object]]:
    images = R.normal(R.key(2), (batch, 1, 28, 28))
    labels = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(0))

    def model(blur: str) -> nn.Module:
        network = build_model("two_conv_bn", (1, 28, 28), 10, key=R.key(0), options={"width": 16, "hidden": 256})
        if blur == "none":
            return network
        network = apply_blurpool(network)
        if blur == "torch":
            for name, module in list(network.named_modules()):
                if isinstance(module, BlurMaxPool2d):
                    parent = network.get_submodule(name.rpartition(".")[0])
                    setattr(parent, name.rpartition(".")[2], TorchBlurMaxPool2d(2, 2))
        return network

    def step_of(network: nn.Module) -> Callable[[], object]:
        optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)

        def step() -> object:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(network(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        return step

    return {
        "no BlurPool": step_of(model("none")),
        "BlurPool, torch 16-bit blur": step_of(model("torch")),
        "BlurPool, composer_fn": step_of(model("ours")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="calls a round times, per contender")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.threads} threads")
    print("\nblurmax_pool2d forward + backward (kernel 2, stride 2), ms a call:")
    for dtype in (torch.bfloat16, torch.float16):
        for shape in ((128, 16, 28, 28), (128, 32, 14, 14)):
            times = median_rounds(op_contenders(shape, dtype), args.rounds, args.steps)
            torch_ms, ours_ms = (1e3 * t for t in times.values())
            print(
                f"  {str(dtype):15} {str(shape):18} torch {torch_ms:7.2f}  ours {ours_ms:7.2f}  "
                f"ours/torch {ours_ms / torch_ms:.3f}"
            )
    print("\ntwo_conv_bn (width 16, hidden 256) training step, batch 128, bf16 autocast, ms a step:")
    times = median_rounds(step_contenders(128), args.rounds, args.steps)
    plain = times["no BlurPool"]
    for name, seconds in times.items():
        print(f"  {name:28} {1e3 * seconds:7.2f}  {seconds / plain:.2f}× no BlurPool")
    ratio = times["BlurPool, composer_fn"] / times["BlurPool, torch 16-bit blur"]
    print(f"  BlurPool's step, composer_fn / torch 16-bit blur: {ratio:.3f}")


if __name__ == "__main__":
    main()
