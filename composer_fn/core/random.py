"""Explicit, splittable random keys and the samplers that consume them.

A key is an ``int64`` tensor whose last dimension holds two 32-bit words ``(seed, stream)``. Every sampler is
written in plain torch integer arithmetic, so the same key gives the same bits eagerly, under
``torch.compile``, and on any device. The host mirror (``host_*``) runs the same mixing function on Python
ints: ``host_fold_in(host_key(s), n)`` and ``fold_in(key(s), n)`` hold the same two words.

No function here reads or advances torch's, NumPy's or Python's global random state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from composer_fn.core.host import readable_on_host
from composer_fn.core.validate import integer, is_integer, is_real

__all__ = [
    "Key",
    "HostKey",
    "key",
    "fold_in",
    "split",
    "bits",
    "uniform",
    "normal",
    "bernoulli",
    "randint",
    "permutation",
    "host_key",
    "host_fold_in",
    "host_split",
    "host_rng",
    "host_bits",
    "to_host",
    "from_host",
    "name_to_int",
    "algorithm_key",
    "host_algorithm_key",
]

Key = Tensor
"""An ``int64`` tensor of shape ``[..., 2]``: one or more ``(seed, stream)`` word pairs."""

HostKey = tuple[int, int]
"""The host mirror of a single key."""

_MASK = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_M1 = 0x7FEB352D
_M2 = 0x846CA68B
_MANTISSA_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24}


# The multiplications are split into 16-bit halves so that no intermediate exceeds 2**49: signed int64
# overflow is undefined behaviour in the C++ that inductor emits, and this keeps every backend exact.
def _mul32(x: Tensor, c: int) -> Tensor:
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * c + ((hi * (c & 0xFFFF)) << 16)) & _MASK


def _mix32(x: Tensor) -> Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def _host_mix32(x: int) -> int:
    x &= _MASK
    x ^= x >> 16
    x = (x * _M1) & _MASK
    x ^= x >> 15
    x = (x * _M2) & _MASK
    return x ^ (x >> 16)


def key(seed: int, *, device: torch.device | str | None = None) -> Key:
    """Returns the root key of shape ``[2]`` for ``seed``, an int in ``[0, 2**64)``."""
    return torch.tensor(host_key(seed), dtype=torch.int64, device=device)


def host_key(seed: int) -> HostKey:
    """Returns the host mirror of ``key(seed)`` (``seed`` any integer, ``numpy.int64`` included, in ``[0, 2**64)``)."""
    # A Python int: NumPy's fixed-width integers would wrap (and warn) in the mixing arithmetic.
    seed = integer("seed", seed, minimum=0, maximum=2**64 - 1)
    return (_host_mix32(seed & _MASK ^ _GOLDEN), _host_mix32((seed >> 32) + _M1))


def to_host(k: Key) -> HostKey:
    """Returns the host mirror of a single device key (reads the tensor: not for traced code)."""
    if k.shape != (2,) or k.dtype != torch.int64:
        raise ValueError(f"key of shape {tuple(k.shape)} and dtype {k.dtype}: expected one int64 key of shape [2]")
    word0, word1 = k.tolist()
    return (int(word0), int(word1))


def from_host(k: HostKey, *, device: torch.device | str | None = None) -> Key:
    """Returns the device key whose words are the host key ``k``."""
    return torch.tensor(k, dtype=torch.int64, device=device)


def _fold(word0: Tensor, word1: Tensor, data: Tensor) -> tuple[Tensor, Tensor]:
    new0 = _mix32(word0 ^ _mix32((data + _GOLDEN) & _MASK))
    new1 = _mix32((word1 + _mix32(data ^ new0)) & _MASK)
    return new0, new1


def _host_readable(k: Key, data: int | Tensor) -> bool:
    if k.shape != (2,) or not readable_on_host(k):
        return False
    return isinstance(data, int) or (data.dim() == 0 and not data.is_floating_point() and readable_on_host(data))


def _check_key(k: object) -> None:
    if not (isinstance(k, Tensor) and k.dtype == torch.int64 and k.dim() >= 1 and k.shape[-1] == 2):
        shown = f"a tensor of dtype {k.dtype} and shape {tuple(k.shape)}" if isinstance(k, Tensor) else repr(k)
        raise TypeError(f"key={shown} must be a key, an int64 tensor [..., 2] such as composer_fn.random.key(seed)")


def fold_in(k: Key, data: int | Tensor) -> Key:
    """Returns a new key derived from ``k`` and the integer ``data`` (any integer, or an integer tensor).

    ``data`` is taken modulo ``2**32``. Batched keys and batched data broadcast against each other.
    """
    _check_key(k)
    if not isinstance(data, int | Tensor):
        if not is_integer(data):
            raise TypeError(f"data={data!r} must be an integer or an integer tensor, the value folded into the key")
        data = int(data)
    elif isinstance(data, Tensor) and (data.is_floating_point() or data.is_complex() or data.dtype == torch.bool):
        raise TypeError(f"data of dtype {data.dtype} must be an integer tensor, the values folded into the key")
    if _host_readable(k, data):
        # Eager on the CPU, a single key is folded on Python ints (the host mirror, the same bits) instead
        # of some forty tiny tensor operations.
        word0, word1 = k.tolist()
        return torch.tensor(host_fold_in((word0, word1), int(data)), dtype=torch.int64)
    if isinstance(data, int):
        data_t = torch.tensor(data & _MASK, dtype=torch.int64, device=k.device)
    else:
        data_t = data.to(torch.int64) & _MASK
    new0, new1 = _fold(k[..., 0], k[..., 1], data_t)
    return torch.stack((new0, new1), dim=-1)


def host_fold_in(k: HostKey, data: int) -> HostKey:
    """Returns the host mirror of ``fold_in(from_host(k), data)``."""
    word0, word1 = k
    data &= _MASK
    new0 = _host_mix32(word0 ^ _host_mix32((data + _GOLDEN) & _MASK))
    new1 = _host_mix32((word1 + _host_mix32(data ^ new0)) & _MASK)
    return (new0, new1)


def split(k: Key, n: int = 2) -> Key:
    """Returns ``n`` independent keys of shape ``[n, ..., 2]`` derived from ``k``."""
    _check_key(k)
    n = integer("n", n, minimum=1, hint="the number of keys")
    counters = _counters(n, k).reshape((n,) + (1,) * (k.dim() - 1))
    return fold_in(k.unsqueeze(0), counters)


def host_split(k: HostKey, n: int = 2) -> list[HostKey]:
    """Returns the host mirror of ``split(from_host(k), n)``."""
    n = integer("n", n, minimum=1, hint="the number of keys")
    return [host_fold_in(k, i) for i in range(n)]


def _counters(count: int, k: Key) -> Tensor:
    """Returns ``0, 1, ..., count - 1`` as int64 values, on the key's device."""
    counters = torch.arange(count, dtype=torch.int64, device=k.device)
    if torch.compiler.is_compiling() and k.numel() > 0:
        # Plus a zero read from the key (its words are below 2**32): inductor would otherwise fold the mixing
        # arithmetic into the arange's index expression, which Triton computes in int32 and in which it
        # rejects (or overflows) the 32-bit constants. With a loaded term the values are int64 data.
        counters = counters + (k.reshape(-1)[:1] >> 32)
    return counters


def _shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) or is_integer(shape) else tuple(shape)
    if any(not isinstance(d, int) for d in dims):
        # NumPy's integers (and any other integer) count as the ints they hold.
        dims = tuple(int(d) if is_integer(d) else d for d in dims)
    if any((not isinstance(d, int)) or d < 0 for d in dims):
        raise ValueError(f"shape={shape!r} must hold non-negative ints")
    return dims


def bits(k: Key, shape: Sequence[int] | int) -> Tensor:
    """Returns uniformly distributed 32-bit words (``int64`` values in ``[0, 2**32)``).

    The result has shape ``k.shape[:-1] + shape``: a batch of keys gives one independent draw of ``shape``
    per key.
    """
    _check_key(k)
    dims = _shape(shape)
    if readable_on_host(k):
        return _bits_numpy(k, dims)
    return _bits_tensor(k, dims)


def _bits_tensor(k: Key, dims: tuple[int, ...]) -> Tensor:
    count = math.prod(dims)
    counter = _counters(count, k).reshape(dims)
    batch = k.shape[:-1] + (1,) * len(dims)
    word0, word1 = k[..., 0].reshape(batch), k[..., 1].reshape(batch)
    x = _mix32((counter * _GOLDEN + word1) & _MASK)
    x = _mix32(x ^ word0)
    x = _mix32((x + word1) & _MASK)
    return x


def _mix32_numpy(x: np.ndarray) -> np.ndarray:
    x ^= x >> np.uint32(16)
    x *= np.uint32(_M1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(_M2)
    x ^= x >> np.uint32(16)
    return x


def _bits_numpy(k: Key, dims: tuple[int, ...]) -> Tensor:
    # The same words as _bits_tensor: NumPy's uint32 arithmetic wraps modulo 2**32 by definition, so each step
    # is one vectorized op instead of the dozen int64 ops that keep the tensor form exact on every backend;
    # eager on the CPU that is several times faster.
    # Arrays of at least one dimension throughout: NumPy warns on overflow in scalar arithmetic, never in arrays.
    words = k.detach().numpy().astype(np.uint32)
    word0, word1 = words[..., 0:1], words[..., 1:2]
    counter = np.arange(math.prod(dims), dtype=np.uint32)
    x = _mix32_numpy(counter * np.uint32(_GOLDEN) + word1)
    x = _mix32_numpy(x ^ word0)
    x = _mix32_numpy(x + word1)
    return torch.from_numpy(x.astype(np.int64).reshape(k.shape[:-1] + dims))


def host_bits(k: HostKey, count: int, *, start: int = 0) -> list[int]:
    """Returns ``bits(from_host(k), (start + count,))[start:]`` as Python ints, computed on the host.

    For host-side draws that must equal the words a traced step draws from the same key (no tensor op runs).
    """
    count = integer("count", count, minimum=0)
    start = integer("start", start, minimum=0)
    word0, word1 = k
    words = []
    for counter in range(start, start + count):
        x = _host_mix32((counter * _GOLDEN + word1) & _MASK)
        x = _host_mix32(x ^ word0)
        words.append(_host_mix32((x + word1) & _MASK))
    return words


def uniform(
    k: Key,
    shape: Sequence[int] | int,
    *,
    dtype: torch.dtype = torch.float32,
    low: float | Tensor = 0.0,
    high: float | Tensor = 1.0,
) -> Tensor:
    """Returns samples from ``Uniform[low, high)`` of ``shape`` and ``dtype``.

    Each value is a multiple of ``2**-p`` in ``[0, 1)`` with ``p`` the dtype's mantissa precision, so it is
    exact in that dtype and never rounds up to ``high`` when ``low == 0, high == 1``.
    """
    if dtype == torch.float64:
        dims = _shape(shape)
        pair = bits(k, dims + (2,))
        hi, lo = pair[..., 0] >> 6, pair[..., 1] >> 5
        unit = (hi.to(torch.float64) * 2.0**27 + lo.to(torch.float64)) * 2.0**-53
    elif dtype in _MANTISSA_BITS:
        precision = _MANTISSA_BITS[dtype]
        unit = ((bits(k, shape) >> (32 - precision)).to(torch.float32) * 2.0**-precision).to(dtype)
    else:
        raise ValueError(f"dtype={dtype} must be a floating dtype: float16, bfloat16, float32 or float64")
    if isinstance(low, float) and isinstance(high, float) and low == 0.0 and high == 1.0:
        return unit
    return unit * (high - low) + low


def normal(k: Key, shape: Sequence[int] | int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """Returns standard normal samples of ``shape`` (Box-Muller from float32 uniforms, cast to ``dtype``).

    The transcendental functions run in float64 and the result is rounded once to ``dtype``: float32
    ``log``/``cos`` are vectorised differently by compilers, float64 results rounded to float32 agree.
    """
    dims = _shape(shape)
    pair = uniform(k, dims + (2,), dtype=torch.float32).to(torch.float64)
    radius = torch.sqrt(-2.0 * torch.log1p(-pair[..., 0]))
    return (radius * torch.cos((2.0 * math.pi) * pair[..., 1])).to(dtype)


def bernoulli(k: Key, p: float | Tensor, shape: Sequence[int] | int) -> Tensor:
    """Returns a bool tensor of ``shape`` whose entries are True with probability ``p``."""
    if not isinstance(p, Tensor):
        if not (is_real(p) and 0.0 <= p <= 1.0):
            raise ValueError(f"p={p!r} must be a probability in [0, 1]")
        p = float(p)
    return uniform(k, shape) < p


def randint(k: Key, low: int, high: int, shape: Sequence[int] | int) -> Tensor:
    """Returns ``int64`` samples uniform over ``[low, high)`` of ``shape`` (``high - low <= 2**24``)."""
    low, high = integer("low", low), integer("high", high)
    span = high - low
    if not 0 < span <= 2**24:
        raise ValueError(f"low={low!r}, high={high!r}: expected low < high with high - low <= 2**24")
    return ((bits(k, shape) * span) >> 32) + low


def permutation(k: Key, n: int) -> Tensor:
    """Returns a uniformly random permutation of ``range(n)`` as ``int64``; ties break by index.

    A batch of keys ``[..., 2]`` gives one permutation per key, of shape ``[..., n]``.
    """
    n = integer("n", n, minimum=0, hint="the length of the permutation")
    return torch.argsort(bits(k, (n,)), dim=-1, stable=True)


def host_rng(k: HostKey) -> np.random.Generator:
    """Returns a NumPy Philox generator seeded by the host key, for host-side draws (Beta, Gamma, ...)."""
    word0, word1 = k
    return np.random.Generator(np.random.Philox(key=[word0 << 32 | word1, 0]))


def name_to_int(name: str) -> int:
    """Returns a stable 32-bit integer for ``name``, to fold a name into a key."""
    if not isinstance(name, str):
        raise TypeError(f"name={name!r} must be a str")
    value = 0x811C9DC5
    for byte in name.encode():
        value = ((value ^ byte) * 0x01000193) & _MASK
    return value


# A pure function of a constant string: traced code takes its value instead of tracing the loop over bytes,
# which some dynamo versions (2.11 among them) cannot iterate. This is the mark that
# ``torch.compiler.assume_constant_result`` sets (torch 2.5 to 2.14); the decorator itself would import
# torch._dynamo, a second and a half, with every ``import composer_fn``.
name_to_int._dynamo_marked_constant = True  # type: ignore[attr-defined]


def algorithm_key(k: Key, name: str) -> Key:
    """Returns the key an algorithm named ``name`` draws from in the step whose key is ``k``."""
    return fold_in(k, name_to_int(name))


def host_algorithm_key(k: HostKey, name: str) -> HostKey:
    """Returns the host mirror of ``algorithm_key(from_host(k), name)``."""
    return host_fold_in(k, name_to_int(name))
