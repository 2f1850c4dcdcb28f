"""The per-image transform base for data-loader workers, whose draws come from a key, an index or a counter."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from composer_fn.algorithms._augment.inputs import on_pil_or_tensor
from composer_fn.algorithms._keys import check_key
from composer_fn.core import random as R


class KeyedTransform:
    """A per-image transform for data-loader workers whose draws come from a key, an index or a call counter."""

    def __init__(self, seed: int) -> None:
        root = R.host_key(seed)
        self._indexed = R.host_fold_in(root, 0)
        self._counted = R.host_fold_in(root, 1)
        self._calls = 0

    def _key(self, index: int | None, key: R.Key | None) -> R.Key:
        if key is not None:
            return key
        if index is not None:
            return R.from_host(R.host_fold_in(self._indexed, index))
        info = torch.utils.data.get_worker_info()
        stream = R.host_fold_in(self._counted, 0 if info is None else info.id)
        self._calls += 1
        return R.from_host(R.host_fold_in(stream, self._calls - 1))

    def __call__(self, img: Any, index: int | None = None, *, key: R.Key | None = None) -> Any:
        """Returns the augmented image, of the kind given.

        Each call draws from, in order of precedence: the ``key`` given; ``fold_in(fold_in(key(seed), 0), index)``
        when an ``index`` is given (e.g. ``epoch * len(dataset) + i``, so that every epoch differs); otherwise
        ``fold_in(fold_in(fold_in(key(seed), 1), worker), n)`` where ``worker`` is the data-loader worker's id
        (0 outside workers) and ``n`` counts this copy's calls. The counter makes a plain ``transform(img)`` (as
        ``torchvision.transforms.Compose`` calls it) deterministic for a given loader order; note that workers
        that are not persistent start each epoch from the transform's counter as it was in the main process, so
        they replay the same draws every epoch: pass ``index`` or use ``persistent_workers=True``.

        Accepts a ``[C, H, W]`` tensor (``uint8`` or float in ``[0, 1]``) or a PIL image in mode ``L`` or ``RGB``,
        and returns the same kind.
        """
        if key is not None:
            check_key(key)
        draw_key = self._key(index, key)

        def augment(image: Tensor) -> Tensor:
            if image.dim() != 3:
                raise ValueError(f"img of shape {tuple(image.shape)}: expected one [C, H, W] image")
            return self._augment(image.unsqueeze(0), draw_key)[0]

        return on_pil_or_tensor(img, augment)

    def _augment(self, batch: Tensor, key: R.Key) -> Tensor:
        """Returns the augmented ``[1, C, H, W]`` batch (each transform defines it)."""
        raise NotImplementedError
