"""The batched augmentation primitives: torchvision/PIL semantics per sample, identities, dtypes, purity, sets."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from composer_fn.algorithms import _augment as ops
from composer_fn.algorithms._augment import host
from composer_fn.core import random as R

seeds = st.integers(0, 2**32 - 1)
batches = st.integers(1, 4)
sides = st.integers(1, 7)
channels = st.sampled_from([1, 3])
DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)
GEOMETRIC = {"rotate": ops.ROTATE, "shear_x": ops.SHEAR_X, "shear_y": ops.SHEAR_Y}
GEOMETRIC |= {"translate_x": ops.TRANSLATE_X, "translate_y": ops.TRANSLATE_Y}


def _images(seed: int, shape: tuple[int, ...], dtype: torch.dtype, levels: int = 256) -> torch.Tensor:
    """Keyed images; few ``levels`` give flat channels and sparse histograms (equalize's special cases)."""
    values = R.randint(R.fold_in(R.key(seed), 0), 0, levels, shape) * (255 // max(levels - 1, 1))
    if dtype == torch.uint8:
        return values.to(torch.uint8)
    return (values.to(torch.float32) / 255.0).to(dtype)


def _per_image(images: torch.Tensor, function, values=None) -> torch.Tensor:
    outs = [
        function(image) if values is None else function(image, value)
        for image, value in zip(images, values if values is not None else [None] * len(images), strict=True)
    ]
    return torch.stack(outs)


def _draw(seed: int, batch: int, low: float, high: float) -> torch.Tensor:
    return R.uniform(R.fold_in(R.key(seed), 1), (batch,), low=low, high=high)


tone_cases = st.tuples(seeds, batches, channels, sides, sides, st.sampled_from([2, 3, 256]))


@given(tone_cases, st.sampled_from([torch.uint8, torch.float32]))
def test_autocontrast_and_equalize_equal_torchvision_bit_for_bit(case, dtype) -> None:
    seed, batch, c, h, w, levels = case
    x = _images(seed, (batch, c, h, w), dtype, levels)
    assert torch.equal(ops.autocontrast(x), _per_image(x, TF.autocontrast))
    assert torch.equal(ops.equalize(x), _per_image(x, TF.equalize))


@given(tone_cases, st.sampled_from([torch.uint8, torch.float32]))
def test_posterize_and_solarize_with_per_sample_arguments_equal_torchvision(case, dtype) -> None:
    seed, batch, c, h, w, levels = case
    x = _images(seed, (batch, c, h, w), dtype, levels)
    bits = R.randint(R.fold_in(R.key(seed), 2), 0, 9, (batch,))
    expected = _per_image(x, lambda image, b: TF.posterize(image, int(b)), bits)
    assert torch.equal(ops.posterize(x, bits), expected)
    scale = 255.0 if dtype == torch.uint8 else 1.0
    threshold = R.randint(R.fold_in(R.key(seed), 3), 0, 256, (batch,)).float() * (scale / 255.0)
    expected = _per_image(x, lambda image, t: TF.solarize(image, float(t)), threshold)
    assert torch.equal(ops.solarize(x, threshold), expected)


@given(
    seeds,
    batches,
    channels,
    st.integers(1, 6),
    st.integers(1, 6),
    st.sampled_from([torch.uint8, torch.float32]),
)
def test_colour_ops_agree_with_torchvision_per_sample(seed, batch, c, h, w, dtype) -> None:
    x = _images(seed, (batch, c, h, w), dtype)
    factor = _draw(seed, batch, 0.0, 2.0)
    references = {
        "color": TF.adjust_saturation,
        "contrast": TF.adjust_contrast,
        "brightness": TF.adjust_brightness,
        "sharpness": TF.adjust_sharpness,
    }
    for name, reference in references.items():
        ours = getattr(ops, name)(x, factor).float()
        expected = _per_image(x, lambda image, f, r=reference: r(image, float(f)), factor).float()
        # The same formulas up to float rounding; uint8 truncation may then differ by one level.
        tolerance = 1.0 if dtype == torch.uint8 else 1e-5
        assert (ours - expected).abs().max() <= tolerance, name


def _pil_matrix(name: str, argument: float, height: int, width: int) -> tuple[float, ...]:
    """Returns PIL's affine coefficients for an op, as Composer calls PIL (rotate: Image.rotate's own)."""
    if name == "rotate":
        angle = -math.radians(argument)
        a, b = math.cos(angle), math.sin(angle)
        d, e = -math.sin(angle), math.cos(angle)
        cx, cy = width / 2.0, height / 2.0
        return (a, b, cx - a * cx - b * cy, d, e, cy - d * cx - e * cy)
    return {
        "shear_x": (1.0, argument, 0.0, 0.0, 1.0, 0.0),
        "shear_y": (1.0, 0.0, 0.0, argument, 1.0, 0.0),
        "translate_x": (1.0, 0.0, argument, 0.0, 1.0, 0.0),
        "translate_y": (1.0, 0.0, 0.0, 0.0, 1.0, argument),
    }[name]


def _reference_affine(
    image: np.ndarray, matrix: tuple[float, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns PIL's bilinear affine resampling pixel by pixel, where the 2x2 neighbours are all inside, and
    where the source point is clear of the image's edge (float rounding cannot move it across).

    A target pixel whose source point lies outside the image is 0; inside, the neighbours are clamped to it.
    """
    a, b, c, d, e, f = matrix
    channels, height, width = image.shape
    out = np.zeros_like(image, dtype=np.float64)
    interior = np.zeros((height, width), dtype=bool)
    clear = np.zeros((height, width), dtype=bool)
    for y in range(height):
        for x in range(width):
            source_x = a * (x + 0.5) + b * (y + 0.5) + c
            source_y = d * (x + 0.5) + e * (y + 0.5) + f
            edges = (source_x, source_x - width, source_y, source_y - height)
            clear[y, x] = min(abs(distance) for distance in edges) > 1e-4
            if not (0 <= source_x < width and 0 <= source_y < height):
                continue
            column, row = source_x - 0.5, source_y - 0.5
            left, top = math.floor(column), math.floor(row)
            for yy, wy in ((top, 1 - (row - top)), (top + 1, row - top)):
                for xx, wx in ((left, 1 - (column - left)), (left + 1, column - left)):
                    out[:, y, x] += (
                        wy * wx * image[:, min(max(yy, 0), height - 1), min(max(xx, 0), width - 1)]
                    )
            interior[y, x] = 0 <= left and left + 1 < width and 0 <= top and top + 1 < height
    return out, interior, clear


geometric_arguments = {
    "rotate": st.floats(-30.0, 30.0),
    "shear_x": st.floats(-0.3, 0.3),
    "shear_y": st.floats(-0.3, 0.3),
    "translate_x": st.integers(-3, 3).map(float),
    "translate_y": st.integers(-3, 3).map(float),
}


@given(seeds, batches, channels, sides, sides, st.sampled_from(sorted(GEOMETRIC)), st.data())
def test_geometric_ops_equal_a_pixel_by_pixel_bilinear_reference(seed, batch, c, h, w, name, data) -> None:
    x = _images(seed, (batch, c, h, w), torch.float32)
    arguments = [data.draw(geometric_arguments[name]) for _ in range(batch)]
    ours = getattr(ops, name)(x, torch.tensor(arguments))
    ours_uint8 = getattr(ops, name)((x * 255).round().to(torch.uint8), torch.tensor(arguments))
    for image, argument, out, out_uint8 in zip(x, arguments, ours, ours_uint8, strict=True):
        matrix = _pil_matrix(name, argument, h, w)
        expected, _, clear = _reference_affine(image.double().numpy(), matrix)
        np.testing.assert_allclose((out.double().numpy() - expected)[:, clear], 0.0, atol=1e-4)
        expected_uint8 = _reference_affine(image.double().numpy() * 255, matrix)[0]
        assert np.abs(out_uint8.double().numpy() - expected_uint8)[:, clear].max(initial=0.0) <= 0.5 + 1e-3


@given(seeds, st.integers(3, 9), st.integers(3, 9), st.sampled_from(sorted(GEOMETRIC)), st.data())
def test_geometric_ops_match_pil_away_from_the_fill(seed, h, w, name, data) -> None:
    x = _images(seed, (1, 3, h, w), torch.uint8)
    argument = data.draw(geometric_arguments[name])
    pil = Image.fromarray(x[0].permute(1, 2, 0).numpy())
    matrix = _pil_matrix(name, argument, h, w)
    if name == "rotate":
        expected_image = pil.rotate(argument, resample=Image.Resampling.BILINEAR)
    else:
        expected_image = pil.transform(
            pil.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.BILINEAR
        )
    expected = torch.from_numpy(np.array(expected_image)).permute(2, 0, 1).int()
    ours = getattr(ops, name)(x, argument)[0].int()
    _, interior, _ = _reference_affine(x[0].double().numpy(), matrix)
    inside = torch.from_numpy(interior).expand_as(ours)
    assert bool(((ours - expected).abs() <= 1)[inside].all())


identity_arguments = {
    "rotate": 0.0,
    "shear_x": 0.0,
    "shear_y": 0.0,
    "translate_x": 0.0,
    "translate_y": 0.0,
    "color": 1.0,
    "contrast": 1.0,
    "brightness": 1.0,
    "sharpness": 1.0,
}


@given(seeds, batches, channels, sides, sides, st.sampled_from(DTYPES))
def test_neutral_arguments_give_the_images_back(seed, batch, c, h, w, dtype) -> None:
    x = _images(seed, (batch, c, h, w), dtype)
    for name, argument in identity_arguments.items():
        out = getattr(ops, name)(x, argument)
        if name in GEOMETRIC and dtype != torch.uint8:
            # grid_sample's normalized coordinates round-trip to within float rounding of the pixel centres.
            torch.testing.assert_close(out, x, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-2)
        else:
            assert torch.equal(out, x), name
    threshold = 256.0 if dtype == torch.uint8 else 256.0 / 255.0
    assert torch.equal(ops.solarize(x, threshold), x)
    if dtype == torch.uint8:
        # Floats posterize to multiples of 2**-bits (torchvision's), so 8 bits keeps only uint8 unchanged.
        assert torch.equal(ops.posterize(x, 8.0), x)
    op = torch.full((batch,), ops.IDENTITY)
    out = ops.apply_op(x, op, torch.zeros(batch))
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ops.PRIMITIVES)
def test_every_primitive_keeps_shape_and_dtype_and_leaves_its_input_alone(name, dtype) -> None:
    x = _images(5, (3, 3, 6, 5), dtype)
    copy, version = x.clone(), x._version
    arguments = () if name in ("autocontrast", "equalize") else (torch.tensor([0.5, 2.0, 3.0]),)
    out = getattr(ops, name)(x, *arguments)
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(x, copy) and x._version == version


@given(seeds, st.integers(1, 12), channels, sides, sides, st.sampled_from(DTYPES))
def test_a_mixed_batch_equals_each_sample_on_its_own(seed, batch, c, h, w, dtype) -> None:
    x = _images(seed, (batch, c, h, w), dtype)
    op = R.randint(R.fold_in(R.key(seed), 4), -1, len(ops.PRIMITIVES), (batch,))
    value = _draw(seed, batch, 0.0, 3.0)
    together = ops.apply_op(x, op, value)
    for i in range(batch):
        assert torch.equal(together[i : i + 1], ops.apply_op(x[i : i + 1], op[i : i + 1], value[i : i + 1]))


@given(seeds, batches, channels, st.integers(1, 6), st.integers(1, 6))
def test_normalized_images_outside_the_unit_range_never_give_nan(seed, batch, c, h, w) -> None:
    x = R.normal(R.key(seed), (batch, c, h, w)) * 3
    for op_id in range(len(ops.PRIMITIVES)):
        value = torch.full((batch,), 2.0 if op_id != ops.POSTERIZE else 3.0)
        out = ops.apply_op(x, torch.full((batch,), op_id), value)
        assert bool(torch.isfinite(out).all()), ops.PRIMITIVES[op_id]



@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bfloat16], ids=str)
def test_compiled_apply_op_equals_eager_bitwise(fresh_compiler, dtype) -> None:
    compiled = torch.compile(ops.apply_op, backend="aot_eager", fullgraph=True, dynamic=False)
    x = _images(3, (30, 3, 7, 6), dtype)
    for seed in (0, 1):
        op = R.randint(R.fold_in(R.key(seed), 4), -1, len(ops.PRIMITIVES), (30,))
        value = _draw(seed, 30, 0.0, 3.0)
        assert torch.equal(compiled(x, op, value), ops.apply_op(x, op, value))


def test_augmentation_sets_hold_composers_members() -> None:
    assert ops.augmentation_sets["all"] == ops.PRIMITIVES
    assert set(ops.augmentation_sets["safe"]) == set(ops.PRIMITIVES) - {
        "color",
        "contrast",
        "brightness",
        "sharpness",
    }
    original = ops.augmentation_sets["original"]
    assert original[:9] == ops.PRIMITIVES[:9]
    assert original[9:] == (
        "color_original",
        "contrast_original",
        "brightness_original",
        "sharpness_original",
    )


def _composer_argument(name: str, severity: float, u: list[float]) -> tuple[float, float, bool]:
    """Returns Composer's argument for ``name`` when its np.random draws are ``u``: (value, pre-floor, integral)."""
    level = 0.1 + (severity - 0.1) * u[0]
    if u[2] > 0.5:
        symmetric = 1.0 + (severity - 1.0) * u[3]
    else:
        symmetric = (1.0 - 0.09 * severity) + 0.09 * severity * u[3]
    if name in ("autocontrast", "equalize"):
        return 0.0, 0.5, False
    integral = {
        "posterize": (level * 4 / 10, 4, -1),
        "rotate": (level * 30 / 10, 0, 1),
        "solarize": (level * 256 / 10, 256, -1),
    }
    if name in integral:
        raw, offset, slope = integral[name]
        return offset + slope * math.floor(raw), raw, True
    if name.startswith("translate"):
        return level / 30, 0.5, False
    if name.startswith("shear"):
        return level * 0.3 / 10, 0.5, False
    if name.endswith("_original"):
        return level * 1.8 / 10 + 0.1, 0.5, False
    if name == "brightness" and symmetric > 1:
        return symmetric * 0.75, 0.5, False
    return symmetric, 0.5, False


@given(st.floats(0.0, 10.0), st.sampled_from(sorted(ops.augmentation_sets)), st.data())
def test_strengths_follow_composers_severity_mapping(severity, set_name, data) -> None:
    names = ops.augmentation_sets[set_name]
    u = [data.draw(st.floats(0.0, 1.0, exclude_max=True)) for _ in range(4)]
    choice = data.draw(st.integers(0, len(names) - 1))
    uniforms = torch.tensor([[u]], dtype=torch.float32)
    op, magnitude, sign = ops.draw_ops(uniforms, torch.tensor([[choice]]), severity, set_name)
    name = names[choice]
    assert ops.PRIMITIVES[int(op)] == name.removesuffix("_original")
    expected, raw, integral = _composer_argument(name, severity, [float(v) for v in uniforms.flatten()])
    near_step = integral and abs(raw - round(raw)) < 1e-4
    assert near_step or abs(float(magnitude) - expected) <= 1e-4 * max(1.0, abs(expected))
    flips = (
        name in ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
        and float(uniforms[0, 0, 1]) > 0.5
    )
    assert float(sign) == (-1.0 if flips else 1.0)


def test_bad_inputs_name_the_argument_and_value() -> None:
    with pytest.raises(TypeError, match="int32"):
        ops.equalize(torch.zeros(1, 3, 2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(1, 2, 2, 2\)"):
        ops.equalize(torch.zeros(1, 2, 2, 2))
    with pytest.raises(ValueError, match="factor of shape"):
        ops.color(torch.zeros(2, 3, 2, 2), torch.ones(3))
    with pytest.raises(ValueError, match="op holds"):
        ops.apply_op(torch.zeros(1, 3, 2, 2), torch.tensor([13]), torch.zeros(1))
    with pytest.raises(ValueError, match="severity=11"):
        ops.check_severity(11, "all")
    with pytest.raises(ValueError, match="augmentation_set='most'"):
        ops.check_severity(3, "most")


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so that -0.0 and 0.0 differ)."""
    if not x.is_floating_point():
        return x
    return x.view({2: torch.int16, 4: torch.int32}[x.element_size()])


def _tensor_forms():
    """Runs the ops as on a GPU or under tracing: their tensor forms instead of the eager CPU NumPy ones."""
    return mock.patch.object(host, "readable_on_host", lambda values: False)


@given(seeds, st.integers(1, 12), channels, st.integers(1, 9), st.integers(1, 9), st.sampled_from(DTYPES))
def test_the_eager_cpu_numpy_forms_equal_the_tensor_forms_bit_for_bit(seed, batch, c, h, w, dtype) -> None:
    x = _images(seed, (batch, c, h, w), dtype)
    if dtype != torch.uint8:
        x = (x.to(torch.float32) * 2.0 - 0.5).to(dtype)  # negative values too: shifted-out zeros keep their sign bit
    op = R.randint(R.fold_in(R.key(seed), 4), -1, len(ops.PRIMITIVES), (batch,))
    value = _draw(seed, batch, -4.0, 4.0).round() * torch.tensor([1.0, 0.37])[seed % 2]
    eager = ops.apply_op(x, op, value)
    with _tensor_forms():
        tensor = ops.apply_op(x, op, value)
    assert torch.equal(_bits(eager), _bits(tensor))


@given(st.floats(0.0, 10.0), st.sampled_from(sorted(ops.augmentation_sets)), seeds)
def test_the_eager_cpu_draws_equal_the_tensor_draws_bit_for_bit(severity, set_name, seed) -> None:
    uniforms = R.uniform(R.key(seed), (40, 2, 4))
    choice = R.randint(R.fold_in(R.key(seed), 1), 0, len(ops.augmentation_sets[set_name]), (40, 2))
    eager = ops.draw_ops(uniforms, choice, severity, set_name)
    with _tensor_forms():
        tensor = ops.draw_ops(uniforms, choice, severity, set_name)
    for mine, reference in zip(eager, tensor, strict=True):
        assert mine.dtype == reference.dtype and torch.equal(_bits(mine), _bits(reference))
