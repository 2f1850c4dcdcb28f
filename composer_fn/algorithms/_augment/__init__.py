"""Composer's 13 image augmentation primitives as batched tensor ops, and its augmentation sets.

Every primitive maps ``[B, C, H, W]`` images (``C`` is 1 or 3) to images of the same shape and dtype, with one
argument per sample (a ``[B]`` tensor), so that a batch can hold a different strength for every image:

- ``uint8`` images hold levels ``0..255`` and come back as ``uint8``, quantized after every op as PIL does
  (truncation after the colour blends and autocontrast; resampling is rounded where PIL truncates, so that
  exact maps such as a rotation by 0 degrees stay exact).
- floating images (``float32``, ``float16``, ``bfloat16``) are taken to lie in ``[0, 1]``; the work is done
  in ``float32`` and cast back. Ops that need the range clamp their output to ``[0, 1]`` (autocontrast,
  equalize, posterize and the four colour blends, as torchvision does); solarize inverts about 1 without
  clamping, and the geometric ops resample without clamping. Finite values outside ``[0, 1]`` (normalized
  images) give finite results, never NaN.

Arguments are in the images' own units: ``solarize`` thresholds are ``0..256`` for ``uint8`` and ``0..1`` for
floats, ``translate_*`` take whole pixels, ``rotate`` degrees (counter-clockwise about the image centre), the
shears a factor (about the top-left corner, as PIL's affine transform in Composer), the colour ops an enhance
factor (1 leaves the image unchanged). The geometric ops follow PIL's bilinear affine transform: a target
pixel whose source point falls outside the image is 0, one inside is interpolated from its clamped neighbours.
The tone ops equal torchvision's bit for bit on ``uint8`` and ``float32``; the colour blends use torchvision's
formulas.

The modules: ``primitives`` (op ids, groups, sets), ``levels`` (shared element arithmetic), ``tone``,
``blends`` and ``geometry`` (the tensor forms of the ops), ``strength`` (Composer's severity mapping and
draws), ``dispatch`` (a different op per image: eager groups or the traced whole-batch form), ``host`` (the
eager CPU NumPy twins, consulted by ``dispatch`` only), ``functional`` (one primitive at a time) and
``transform`` (the data-loader transform base).
"""

from composer_fn.algorithms._augment.dispatch import apply_op, draw_ops
from composer_fn.algorithms._augment.functional import (
    autocontrast,
    brightness,
    color,
    contrast,
    equalize,
    posterize,
    rotate,
    sharpness,
    shear_x,
    shear_y,
    solarize,
    translate_x,
    translate_y,
)
from composer_fn.algorithms._augment.inputs import augment_batch, on_image_or_batch, on_pil_or_tensor
from composer_fn.algorithms._augment.levels import to_levels
from composer_fn.algorithms._augment.primitives import (
    AUTOCONTRAST,
    BRIGHTNESS,
    COLOR,
    CONTRAST,
    EQUALIZE,
    IDENTITY,
    POSTERIZE,
    PRIMITIVES,
    ROTATE,
    SHARPNESS,
    SHEAR_X,
    SHEAR_Y,
    SOLARIZE,
    TRANSLATE_X,
    TRANSLATE_Y,
    augmentation_sets,
    check_images,
)
from composer_fn.algorithms._augment.strength import check_severity, op_arguments
from composer_fn.algorithms._augment.transform import KeyedTransform

__all__ = [
    "AUTOCONTRAST",
    "BRIGHTNESS",
    "COLOR",
    "CONTRAST",
    "EQUALIZE",
    "IDENTITY",
    "POSTERIZE",
    "PRIMITIVES",
    "ROTATE",
    "SHARPNESS",
    "SHEAR_X",
    "SHEAR_Y",
    "SOLARIZE",
    "TRANSLATE_X",
    "TRANSLATE_Y",
    "KeyedTransform",
    "apply_op",
    "augment_batch",
    "augmentation_sets",
    "autocontrast",
    "brightness",
    "check_images",
    "check_severity",
    "color",
    "contrast",
    "draw_ops",
    "equalize",
    "on_image_or_batch",
    "on_pil_or_tensor",
    "op_arguments",
    "posterize",
    "rotate",
    "sharpness",
    "shear_x",
    "shear_y",
    "solarize",
    "to_levels",
    "translate_x",
    "translate_y",
]
