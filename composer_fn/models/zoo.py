"""Models by name for an image-classification task: the zoo's own, and any classification model of
``torchvision.models``, fitted to the data's channels and classes.

``build_model(name, image_shape, num_classes, key=...)`` returns an untrained model for images of
``image_shape = (C, H, W)``:

- ``small_cnn``, ``two_conv_bn`` (Fashion-MNIST's "two conv + pooling + BN" network, square images whose side is a
  multiple of 4), ``mlp`` (one hidden layer of 128 on the flattened image), ``cifar_resnet20``, ``cifar_resnet56``;
- ``resnet18`` … ``resnet152``: torchvision's ResNets through ``torchvision_resnet``;
- any other name of ``torchvision.models.list_models(module=torchvision.models)`` (the classification models),
  built with ``torchvision.models.get_model(name, weights=None, num_classes=num_classes)``, its first
  convolution rebuilt for ``C`` input channels when ``C != 3``; auxiliary heads (GoogLeNet, Inception v3) are
  turned off, so the model returns one tensor of logits.

Nothing is downloaded. The parameters are drawn from the key (``key(0)`` by default; the command line passes
``key(seed)``) with PyTorch's default layer initialisation, built on the meta device, never from the global
generator; a model whose buffers that cannot fill (position tables,
for instance) is built on the CPU under a generator forked from the key and restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from composer_fn.core import random as R
from composer_fn.core.random import Key
from composer_fn.core.validate import integer
from composer_fn.nn.init import built_from_key, init_parameters, materialise

__all__ = ["ZOO", "build_model", "model_names", "torchvision_classifier"]

ZOO = ("small_cnn", "two_conv_bn", "mlp", "cifar_resnet20", "cifar_resnet56")
"""The zoo's own models, by name."""

_NO_AUXILIARY = ("googlenet", "inception_v3")


def torchvision_classifiers() -> tuple[str, ...]:
    """Returns the names of torchvision's classification models (``torchvision.models.list_models``)."""
    import torchvision

    return tuple(torchvision.models.list_models(module=torchvision.models))


def model_names() -> tuple[str, ...]:
    """Returns every name ``build_model`` accepts: the zoo's, then torchvision's classification models."""
    return (*ZOO, *torchvision_classifiers())


def build_model(
    name: str,
    image_shape: tuple[int, int, int],
    num_classes: int,
    *,
    key: Key | None = None,
    options: Mapping[str, object] | None = None,
) -> nn.Module:
    """Returns the untrained model ``name`` for images of ``image_shape`` and ``num_classes`` classes.

    ``options`` are the constructor's own arguments, as timm's ``model_kwargs``: ``SmallCNN``'s ``width``,
    ``norm``, ``dropout``; ``MLP``'s ``hidden`` (an int is one layer) and ``dropout``; for a torchvision model, its
    builder's (``dropout``, ``stochastic_depth_prob``, ``width_mult``, ...). Raises ValueError for a name that is
    neither the zoo's nor a torchvision classification model, listing the zoo and where to find the others, and
    for options the model does not take, naming them.
    """
    integer("num_classes", num_classes, minimum=1)
    if not (isinstance(image_shape, tuple) and len(image_shape) == 3 and all(isinstance(d, int) and d >= 1 for d in image_shape)):
        raise ValueError(f"image_shape={image_shape!r}: expected (channels, height, width) of positive ints")
    channels = image_shape[0]
    parameter_key = key if key is not None else R.key(0)
    given = dict(options or {})
    fixed = sorted(set(given) & {"num_classes", "in_channels", "image_size", "in_features", "key"})
    if fixed:
        raise ValueError(
            f"model options {fixed} of {name!r}: they come from the data (images of {image_shape}, {num_classes} "
            "classes) and the run's seed; leave them out of the options"
        )
    if name == "mlp" and isinstance(given.get("hidden"), int) and not isinstance(given.get("hidden"), bool):
        given["hidden"] = (given["hidden"],)  # one hidden layer
    from composer_fn.models.cnn import SmallCNN, TwoConvBN
    from composer_fn.models.mlp import MLP
    from composer_fn.models.resnet import (
        TORCHVISION_RESNETS,
        cifar_resnet20,
        cifar_resnet56,
        torchvision_resnet,
    )

    builders: dict[str, Callable[[], nn.Module]] = {
        "small_cnn": lambda: SmallCNN(in_channels=channels, num_classes=num_classes, **given),  # type: ignore[arg-type]
        "two_conv_bn": lambda: TwoConvBN(
            in_channels=channels, num_classes=num_classes, **{"image_size": image_shape[1], **given}  # type: ignore[arg-type]
        ),
        "mlp": lambda: MLP(math.prod(image_shape), num_classes, **{"hidden": (128,), **given}),  # type: ignore[arg-type]
        "cifar_resnet20": lambda: cifar_resnet20(num_classes, channels, key=parameter_key, **given),  # type: ignore[arg-type]
        "cifar_resnet56": lambda: cifar_resnet56(num_classes, channels, key=parameter_key, **given),  # type: ignore[arg-type]
    }
    if name in builders:
        try:
            model = builders[name]()
        except TypeError as error:
            raise ValueError(f"model={name!r} does not take the options {given}: {error}") from None
        if name in ("small_cnn", "two_conv_bn", "mlp"):
            # Built from key(0) by their constructors: the parameters are drawn again from the key given.
            values = init_parameters(model, parameter_key)
            with torch.no_grad():
                for parameter_name, parameter in model.named_parameters():
                    parameter.copy_(values[parameter_name])
    elif name in TORCHVISION_RESNETS and not given:
        model = torchvision_resnet(name, num_classes, channels, key=parameter_key)
    else:
        model = torchvision_classifier(name, channels, num_classes, key=parameter_key, options=given)
    _check_takes(model, name, image_shape, num_classes)
    return model


def _check_takes(model: nn.Module, name: str, image_shape: tuple[int, int, int], num_classes: int) -> None:
    # One forward of two blank images in eval mode: a model that cannot take the images (too small for its
    # downsampling, a fixed input size) is refused here, in one line, not at the first training step.
    training = model.training
    try:
        with torch.no_grad():
            outputs = model.eval()(torch.zeros(2, *image_shape))
    except (RuntimeError, ValueError, AssertionError, IndexError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"model={name!r} does not take {'x'.join(map(str, image_shape))} images ({reason}); pick a model for "
            "images this size (small_cnn, cifar_resnet20, resnet18, efficientnet_b0, mobilenet_v3_small, ...) or "
            "give larger images"
        ) from None
    finally:
        model.train(training)
    if not isinstance(outputs, torch.Tensor) or tuple(outputs.shape) != (2, num_classes):
        found = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise ValueError(f"model={name!r} returns {found} for 2 images; expected logits of shape (2, {num_classes})")


def torchvision_classifier(
    name: str,
    in_channels: int,
    num_classes: int,
    *,
    key: Key | None = None,
    options: Mapping[str, object] | None = None,
) -> nn.Module:
    """Returns torchvision's classification model ``name``, untrained, for ``in_channels`` and ``num_classes``;
    ``options`` go to its builder."""
    import torchvision

    known = torchvision_classifiers()
    if name not in known:
        raise ValueError(
            f"model={name!r} is not a model we build; accepted: {', '.join(ZOO)}, or a classification model of "
            f"torchvision.models ({len(known)} names, e.g. resnet18, convnext_tiny, efficientnet_b0, "
            "mobilenet_v3_small; torchvision.models.list_models(module=torchvision.models) lists them)"
        )
    arguments: dict[str, object] = {"weights": None, "num_classes": num_classes}
    if name in _NO_AUXILIARY:
        arguments.update(aux_logits=False, init_weights=False)
    arguments.update(options or {})
    parameter_key = key if key is not None else R.key(0)

    def build() -> nn.Module:
        try:
            model: nn.Module = torchvision.models.get_model(name, **arguments)
        except TypeError as error:
            raise ValueError(f"model={name!r} does not take the options {dict(options or {})}: {error}") from None
        if in_channels != 3:
            _fit_stem(model, name, in_channels)
        return model

    try:
        with torch.device("meta"):
            model = build()
        return materialise(model, parameter_key)
    except ValueError:
        raise
    except (TypeError, NotImplementedError, RuntimeError):
        # Buffers materialise cannot fill, or a constructor that reads values: build for real, under a generator
        # seeded from the key and restored afterwards.
        return built_from_key(parameter_key, build)


def _fit_stem(model: nn.Module, name: str, in_channels: int) -> None:
    # The first convolution that takes the image's three channels is rebuilt to take in_channels.
    for path, conv in model.named_modules():
        if isinstance(conv, nn.Conv2d) and conv.in_channels == 3:
            owner_path, _, leaf = path.rpartition(".")
            owner = model.get_submodule(owner_path) if owner_path else model
            fitted = nn.Conv2d(
                in_channels,
                conv.out_channels,
                conv.kernel_size,  # type: ignore[arg-type]
                stride=conv.stride,  # type: ignore[arg-type]
                padding=conv.padding,  # type: ignore[arg-type]
                dilation=conv.dilation,  # type: ignore[arg-type]
                groups=1,
                bias=conv.bias is not None,
                padding_mode=conv.padding_mode,
                device=conv.weight.device,
            )
            setattr(owner, leaf, fitted)
            return
    raise ValueError(f"model={name!r} has no convolution taking 3 channels to fit to in_channels={in_channels}")
