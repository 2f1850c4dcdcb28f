"""Low-rank factorizations of a layer's weight: the truncated SVD, and Composer's data-driven solvers that refit
the two factors by least squares on the layer's inputs and outputs."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core import validate

__all__ = [
    "LowRankSolution",
    "check_latent",
    "conv_weight_to_matrix",
    "factorize_conv2d",
    "factorize_matrix",
    "matrix_to_conv_weight",
    "svd_factors",
]


class LowRankSolution(NamedTuple):
    """A rank-``rank`` factorization ``Y ≈ (X @ Wa) @ Wb + bias`` and its normalised mean squared error.

    For matrices ``Wa`` is ``[D, rank]`` and ``Wb`` ``[rank, M]``; for convolutions ``Wa`` is the ``k×k``
    weight ``[rank, in, k_h, k_w]`` and ``Wb`` the ``1×1`` weight ``[out, rank, 1, 1]``. When the rank asked
    for leaves nothing to save (it reaches ``D`` or ``M``) there is no second factor: ``Wb`` is None, ``Wa`` is
    the single least-squares map ``[D, M]`` (for convolutions ``[out, in, k_h, k_w]``) and ``rank`` is -1, as
    in Composer. ``nmse`` is the mean squared error of the fit divided by the variance of the outputs (0:
    exact; 1: no better than their mean).
    """

    Wa: Tensor
    Wb: Tensor | None
    bias: Tensor | None
    rank: int
    nmse: float


def check_latent(name: str, latent: Any) -> None:
    """Raises ValueError unless ``latent`` is a width (an int >= 1) or a fraction of a width (a float in (0, 1))."""
    width = validate.is_integer(latent) and latent >= 1
    fraction = validate.is_real(latent) and not validate.is_integer(latent) and 0.0 < latent < 1.0
    if not width and not fraction:
        raise ValueError(
            f"{name}={latent!r} must be an int >= 1 or a float in (0, 1) (a fraction of the width)"
        )


def svd_factors(matrix: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Returns ``(A [D, rank], B [rank, M])`` with ``A @ B`` the best rank-``rank`` approximation of ``matrix``."""
    # Float64 keeps a full-rank factorization within rounding of the original in float32.
    u, s, vh = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    root = s[:rank].sqrt()
    # Equal scaling of both factors keeps their magnitudes alike, which gradient descent prefers.
    first = u[:, :rank] * root
    second = root[:, None] * vh[:rank]
    return first.to(matrix.dtype), second.to(matrix.dtype)


def conv_weight_to_matrix(weight: Tensor) -> Tensor:
    """Returns the convolution weight ``[out, in, k_h, k_w]`` as the matrix ``[in · k_h · k_w, out]``."""
    return weight.reshape(weight.shape[0], -1).T


def matrix_to_conv_weight(matrix: Tensor, kernel: tuple[int, ...]) -> Tensor:
    """Returns the matrix ``[in · k_h · k_w, out]`` as a contiguous convolution weight ``[out, in, k_h, k_w]``."""
    weight = matrix.T
    return weight.reshape(weight.shape[0], -1, *kernel).contiguous()


def _check_finite_floats(**tensors: Tensor | None) -> None:
    """Raises TypeError naming the first tensor that is not floating point, ValueError the first non-finite one."""
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} of type {type(tensor).__name__}: expected a tensor")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} of dtype {tensor.dtype}: expected a floating-point tensor")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"{name} of shape {tuple(tensor.shape)} holds non-finite values (NaN or infinity): a least-squares "
                "fit needs finite inputs, outputs and weights"
            )


def _lstsq(a: Tensor, b: Tensor) -> Tensor:
    return torch.linalg.lstsq(a, b).solution


def factorize_matrix(
    X: Tensor,
    Y: Tensor,
    Wa: Tensor,
    Wb: Tensor | None = None,
    bias: Tensor | None = None,
    rank: int | float = 0.25,
    n_iters: int = 3,
) -> LowRankSolution:
    """Returns the rank-``rank`` factorization ``(Wa', Wb', bias')`` that fits ``Y`` from ``X`` in least squares.

    ``X [N, D]`` are inputs, ``Y [N, M]`` the layer's outputs on them; the layer is ``Wa [D, M]`` (or an
    earlier factorization ``Wa [D, d] @ Wb [d, M]``) plus ``bias [M]``. The factors start from the truncated SVD
    of ``Wa (@ Wb)`` and then alternate ``n_iters`` least-squares updates of ``Wb'`` and ``Wa'`` (Composer's
    solver); ``bias'`` absorbs the mean residual. ``rank`` is an int, or a float in (0, 1): a fraction of ``D``
    (capped at the current rank). As in Composer, a rank that reaches ``D`` or ``M`` gives the plain
    least-squares regression of ``Y`` on ``X`` (``Wb'`` None, ``rank`` -1), and a rank that reaches the latent
    width ``d`` of an earlier factorization keeps its two factors (``rank`` ``d``).
    """
    _check_finite_floats(X=X, Y=Y, Wa=Wa, Wb=Wb, bias=bias)
    if X.dim() != 2 or Y.dim() != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"X {tuple(X.shape)} and Y {tuple(Y.shape)} must be matrices with the same number of rows"
        )
    if X.shape[0] == 0 or X.shape[1] == 0 or Y.shape[1] == 0:
        raise ValueError(f"X {tuple(X.shape)} and Y {tuple(Y.shape)} hold no data: expected at least one row and column")
    validate.integer("n_iters", n_iters, minimum=0)
    if Wb is not None and (Wa.dim() != 2 or Wb.dim() != 2 or Wa.shape[1] != Wb.shape[0]):
        raise ValueError(f"Wa {tuple(Wa.shape)} and Wb {tuple(Wb.shape)} must be matrices [D, d] and [d, M]")
    weight = Wa.detach() if Wb is None else Wa.detach() @ Wb.detach()
    if weight.shape != (X.shape[1], Y.shape[1]):
        raise ValueError(
            f"Wa {tuple(Wa.shape)}{'' if Wb is None else f' @ Wb {tuple(Wb.shape)}'} must map X's "
            f"{X.shape[1]} columns to Y's {Y.shape[1]}"
        )
    if bias is not None and tuple(bias.shape) != (Y.shape[1],):
        raise ValueError(f"bias {tuple(bias.shape)} must hold one value per column of Y: ({Y.shape[1]},)")
    check_latent("rank", rank)
    current = Wa.shape[1] if Wb is not None else min(weight.shape)
    k = int(rank) if validate.is_integer(rank) else max(min(int(rank * X.shape[1]), current), 1)
    dtype = X.dtype
    x, y = X.detach().to(torch.float64), Y.detach().to(torch.float64)
    target = y - bias.detach().to(torch.float64) if bias is not None else y
    first: Tensor
    second: Tensor | None
    if k >= min(weight.shape):
        # Two factors this wide take more multiply-adds than one map: the regression is the whole answer.
        first, second, k = _lstsq(x, target), None, -1
    elif Wb is not None and k >= Wb.shape[0]:
        first, second, k = Wa.detach().to(torch.float64), Wb.detach().to(torch.float64), Wb.shape[0]
    else:
        first, second = svd_factors(weight.to(torch.float64), k)
        # Least squares of the outputs on the inputs, solved once: the targets of every Wa update.
        coefficients = _lstsq(x, target)
        for _ in range(n_iters):
            second = _lstsq(x @ first, target)
            first = _lstsq(second.T, coefficients.T).T
    fitted = x @ first if second is None else (x @ first) @ second
    new_bias = (target - fitted).mean(dim=0)
    if bias is not None:
        new_bias = new_bias + bias.detach().to(torch.float64)
    residual = y - (fitted + new_bias)
    error, variance = float((residual * residual).mean()), float(y.var()) if y.numel() > 1 else 0.0
    nmse = error / variance if variance > 0 else error
    factor = None if second is None else second.to(dtype)
    return LowRankSolution(first.to(dtype), factor, new_bias.to(dtype), k, nmse)


def factorize_conv2d(
    X: Tensor,
    Wa: Tensor,
    Wb: Tensor | None = None,
    rank: int | float = 0.25,
    biasA: Tensor | None = None,
    biasB: Tensor | None = None,
    n_iters: int = 3,
    **conv2d_kwargs: Any,
) -> LowRankSolution:
    """Returns the ``k×k`` then ``1×1`` factorization of a convolution fitted on inputs ``X [N, in, H, W]``.

    The convolution is ``Wa [out, in, k_h, k_w]`` plus ``biasA [out]``, or an earlier factorization ``Wa [d,
    in, k_h, k_w]`` (+ ``biasA [d]``) followed by ``Wb [out, d, 1, 1]`` (+ ``biasB [out]``). Every ``k×k``
    input patch is a row of the least-squares problem of ``factorize_matrix``. ``conv2d_kwargs`` are the
    convolution's ``padding``, ``dilation``, ``padding_mode`` and ``groups`` (1 only); its ``stride`` is
    accepted and ignored, as in Composer: every position supplies a row. ``rank`` as a fraction is of
    ``in · k_h · k_w``. The solution holds ``Wa [rank, in, k_h, k_w]``, ``Wb [out, rank, 1, 1]`` and the bias;
    at a rank that reaches ``in · k_h · k_w`` or ``out`` it holds the single regressed convolution
    ``Wa [out, in, k_h, k_w]`` and no ``Wb`` (see ``factorize_matrix``).
    """
    unknown = set(conv2d_kwargs) - {"padding", "dilation", "padding_mode", "groups", "stride"}
    if unknown:
        raise TypeError(f"factorize_conv2d got unknown convolution arguments {sorted(unknown)}")
    if conv2d_kwargs.get("groups", 1) != 1:
        raise ValueError(f"groups={conv2d_kwargs['groups']!r}: grouped convolutions cannot be factorized")
    if biasB is not None and Wb is None:
        raise ValueError("biasB was given without Wb: a second bias needs a second convolution")
    _check_finite_floats(X=X, Wa=Wa, Wb=Wb, biasA=biasA, biasB=biasB)
    if X.dim() != 4 or Wa.dim() != 4 or X.shape[1] != Wa.shape[1]:
        raise ValueError(
            f"X {tuple(X.shape)} and Wa {tuple(Wa.shape)} must be [N, in, H, W] and [out, in, k_h, k_w]"
        )
    if biasA is not None and tuple(biasA.shape) != (Wa.shape[0],):
        raise ValueError(f"biasA {tuple(biasA.shape)} must hold one value per output of Wa: ({Wa.shape[0]},)")
    if Wb is not None and (Wb.dim() != 4 or Wb.shape[1] != Wa.shape[0] or tuple(Wb.shape[2:]) != (1, 1)):
        raise ValueError(
            f"Wb {tuple(Wb.shape)} must be a 1x1 convolution from Wa's {Wa.shape[0]} outputs: [out, {Wa.shape[0]}, 1, 1]"
        )
    if biasB is not None and Wb is not None and tuple(biasB.shape) != (Wb.shape[0],):
        raise ValueError(f"biasB {tuple(biasB.shape)} must hold one value per output of Wb: ({Wb.shape[0]},)")
    kernel = tuple(Wa.shape[2:])
    patches = _patches(
        X.detach(), kernel, **{k: v for k, v in conv2d_kwargs.items() if k not in ("groups", "stride")}
    )
    first = conv_weight_to_matrix(Wa.detach())
    first_bias = None if biasA is None else biasA.detach()
    outputs = _plus(patches @ first, first_bias)
    # The constant the layer adds to every output: it is taken out before the fit, so a full-rank
    # factorization reproduces the outputs exactly.
    bias = first_bias
    second = None
    if Wb is not None:
        second = conv_weight_to_matrix(Wb.detach())
        second_bias = None if biasB is None else biasB.detach()
        outputs = _plus(outputs @ second, second_bias)
        bias = second_bias if first_bias is None else _plus(first_bias @ second, second_bias)
    solution = factorize_matrix(patches, outputs, first, second, bias, rank, n_iters)
    factor = None if solution.Wb is None else matrix_to_conv_weight(solution.Wb, (1, 1))
    return solution._replace(Wa=matrix_to_conv_weight(solution.Wa, kernel), Wb=factor)


def _plus(a: Tensor, b: Tensor | None) -> Tensor:
    """Returns ``a + b``, or ``a`` without ``b``."""
    return a if b is None else a + b


def _pixels(argument: str, value: object, minimum: int) -> tuple[int, int]:
    """Returns ``value`` (an int, or a pair of ints, each >= ``minimum``) as a pair of Python ints."""
    pair = (value, value) if validate.is_integer(value) else tuple(value) if isinstance(value, tuple | list) else ()
    if len(pair) != 2 or not all(validate.is_integer(v) and v >= minimum for v in pair):  # type: ignore[operator]
        raise ValueError(f"{argument}={value!r} must be an int >= {minimum} or a pair of them (height, width)")
    return int(pair[0]), int(pair[1])  # type: ignore[call-overload]


def _patches(
    images: Tensor,
    kernel: tuple[int, ...],
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    padding_mode: str = "zeros",
) -> Tensor:
    """Returns every ``k×k`` input patch (at stride 1) as a row ``[N · positions, in · k_h · k_w]``."""
    if isinstance(padding, str):
        raise ValueError(f"padding={padding!r}: give the padding in pixels (an int or a pair)")
    pad = _pixels("padding", padding, 0)
    spread = _pixels("dilation", dilation, 1)
    validate.choice("padding_mode", padding_mode, ("zeros", "reflect", "replicate", "circular"))
    for axis, size, k, p, d in zip(("height", "width"), images.shape[-2:], kernel, pad, spread, strict=True):
        if d * (k - 1) + 1 > size + 2 * p:
            raise ValueError(
                f"X of shape {tuple(images.shape)} is smaller than the kernel {tuple(kernel)} (dilation "
                f"{dilation!r}, padding {padding!r}) along its {axis}: no patch fits"
            )
    if padding_mode != "zeros" and any(pad):
        images = F.pad(images, (pad[1], pad[1], pad[0], pad[0]), mode=padding_mode)
        pad = (0, 0)
    unfolded = F.unfold(images, kernel_size=kernel, dilation=spread, padding=pad)
    return unfolded.transpose(1, 2).reshape(-1, unfolded.shape[1])
