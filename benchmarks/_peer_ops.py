"""Peer side of benchmarks/ops.py: run by the peer interpreter (Composer, timm), never imported by our code."""

import time

import composer.functional as cf
import numpy as np
import torch
from PIL import Image
from timm.data import Mixup
from timm.data.auto_augment import augment_and_mix_transform, rand_augment_transform
from timm.data.random_erasing import RandomErasing

_DATA = {}


def setup():
    torch.set_num_threads(globals().get("THREADS", 1))
    import composer
    import timm
    return {"composer": composer.__version__, "timm": timm.__version__, "torch": torch.__version__}


def _data(batch, size):
    key = (batch, size)
    if key not in _DATA:
        g = torch.Generator().manual_seed(0)
        x = torch.rand(batch, 3, size, size, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        pil = [Image.fromarray((x[i].permute(1, 2, 0).numpy() * 255).astype(np.uint8)) for i in range(min(batch, 64))]
        _DATA[key] = (x, y, pil)
    return _DATA[key]


def _timed(fn, reps):
    fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return sorted(out)[len(out) // 2]


def measure(op, batch, size, reps):
    """Returns the median seconds of one call of ``op`` on a batch (per-image ops: per image)."""
    x, y, pil = _data(batch, size)
    torch.manual_seed(0)
    np.random.seed(0)
    if op == "composer.mixup_batch":
        return _timed(lambda: cf.mixup_batch(x, y, alpha=0.2), reps)
    if op == "composer.cutmix_batch":
        return _timed(lambda: cf.cutmix_batch(x, y, alpha=1.0), reps)
    if op == "composer.cutout_batch":
        return _timed(lambda: cf.cutout_batch(x, num_holes=1, length=0.5), reps)
    if op == "composer.colout_batch":
        return _timed(lambda: cf.colout_batch(x, p_row=0.15, p_col=0.15), reps)
    if op == "composer.resize_batch":
        return _timed(lambda: cf.resize_batch(x, y, scale_factor=0.5, mode="resize"), reps)
    if op == "composer.smooth_labels":
        logits = torch.zeros(batch, 10)
        return _timed(lambda: cf.smooth_labels(logits, y, smoothing=0.1), reps)
    if op.startswith("timm."):
        clone = _timed(lambda: x.clone(), reps)
        if op in ("timm.mixup", "timm.mixup_elem", "timm.cutmix", "timm.cutmix_elem"):
            mode = "elem" if op.endswith("_elem") else "batch"
            cut = op.startswith("timm.cutmix")
            mix = Mixup(mixup_alpha=0.0 if cut else 1.0, cutmix_alpha=1.0 if cut else 0.0, mode=mode,
                        label_smoothing=0.0, num_classes=10)
            # timm mixes in place: each call gets a fresh copy, whose cost is subtracted.
            return max(_timed(lambda: mix(x.clone(), y), reps) - clone, 0.0)
        if op == "timm.random_erasing":
            erase = RandomErasing(probability=1.0, mode="const", max_count=1, device="cpu")
            return max(_timed(lambda: erase(x.clone()), reps) - clone, 0.0)
    hparams = {"translate_const": int(size * 0.45), "img_mean": (124, 116, 104)}
    per_image = {
        "composer.randaugment_image": lambda im: cf.randaugment_image(im, severity=9, depth=2),
        "composer.augmix_image": lambda im: cf.augmix_image(im, severity=3, depth=-1, width=3, alpha=1.0),
        "timm.rand_augment": rand_augment_transform("rand-m9-n2", hparams),
        "timm.augmix": augment_and_mix_transform("augmix-m3-w3", hparams),
    }
    if op in per_image:
        transform = per_image[op]
        return _timed(lambda: [transform(im) for im in pil], reps) / len(pil)
    if op.startswith("tv."):
        raise KeyError(f"{op} is timed on our side")
    raise KeyError(op)
