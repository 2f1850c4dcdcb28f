"""How the contract suite checks each algorithm: the settings registry.

An algorithm record holds what training needs; what checking it needs lives here, keyed by its registered
name: the hyperparameters that make every hook act within a three-batch run, the kind of batch it works on,
a model that has the layers it rewrites, and whether its effect depends on the random key.
``tests/algorithms/test_contract.py`` refuses a registered algorithm without settings, so no method goes
unchecked. Register your own algorithm's settings with ``register_settings`` to check it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from composer_fn import algorithms as A
from composer_fn.core.algorithm import REGISTRY, Algorithm
from composer_fn.models import CIFARResNet, SmallCNN

__all__ = ["CheckSettings", "SETTINGS", "register_settings", "settings_for", "example", "modality_of"]

Modality = Literal["image", "tokens"]
MODALITIES: tuple[str, ...] = ("image", "tokens")


def _never(algorithm: Any) -> bool:
    return False


def _always(algorithm: Any) -> bool:
    return True


@dataclass(frozen=True)
class CheckSettings:
    """How to check one algorithm.

    Attributes:
        example: an instance whose hooks all act within a three-batch run; None for the defaults.
        modality: ``"image"`` (``[B, 3, 8, 8]`` inputs, 4 classes, a small CNN) or ``"tokens"`` (token rows,
            a one-block causal LM).
        model: builds the model to check on, for a surgery on layers the modality's model lacks.
        stochastic: whether the given instance's effect depends on the random key.
    """

    example: Algorithm | None = None
    modality: Modality = "image"
    model: Callable[[], nn.Module] | None = None
    stochastic: Callable[[Any], bool] = _never

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"modality={self.modality!r} must be one of {', '.join(MODALITIES)}")


SETTINGS: dict[str, CheckSettings] = {
    "alibi": CheckSettings(modality="tokens"),
    "augmix": CheckSettings(stochastic=_always),
    "blurpool": CheckSettings(A.BlurPool(min_channels=8)),
    "channels_last": CheckSettings(),
    "colout": CheckSettings(stochastic=lambda a: a.p_row > 0 or a.p_col > 0),
    "cutmix": CheckSettings(stochastic=_always),
    "cutout": CheckSettings(stochastic=lambda a: a.num_holes > 0 and a.length > 0),
    "random_crop_flip": CheckSettings(stochastic=lambda a: a.padding > 0 or 0 < a.flip_p < 1),
    "early_stopper": CheckSettings(),
    "ema": CheckSettings(),
    "factorize": CheckSettings(A.Factorize(min_channels=8, min_features=4, latent_features=0.25)),
    # The new layers' initial values come from the key.
    "gated_linear_units": CheckSettings(modality="tokens", stochastic=_always),
    "ghost_batchnorm": CheckSettings(A.GhostBatchNorm(ghost_batch_size=3)),
    "gradient_clipping": CheckSettings(),
    "gyro_dropout": CheckSettings(model=lambda: SmallCNN(3, 4, width=8, dropout=0.5), stochastic=_always),
    "label_smoothing": CheckSettings(),
    "layer_freezing": CheckSettings(A.LayerFreezing(freeze_start=0.0, freeze_level=1.0)),
    "low_precision_groupnorm": CheckSettings(model=lambda: SmallCNN(3, 4, width=8, norm="group")),
    "low_precision_layernorm": CheckSettings(modality="tokens"),
    "mixup": CheckSettings(stochastic=lambda a: a.alpha > 0),
    "progressive_resizing": CheckSettings(stochastic=lambda a: a.mode == "crop" and a.initial_scale < 1),
    "randaugment": CheckSettings(stochastic=lambda a: a.depth > 0),
    "sam": CheckSettings(),
    "selective_backprop": CheckSettings(stochastic=lambda a: a.keep < 1),
    "seq_length_warmup": CheckSettings(modality="tokens"),
    # Smaller than the defaults, so the suite's narrow model has layers to rewrite; the new layers draw keys.
    "squeeze_excite": CheckSettings(A.SqueezeExcite(latent_channels=4, min_channels=8), stochastic=_always),
    "stochastic_depth": CheckSettings(
        A.StochasticDepth("BasicBlock", "sample", drop_rate=0.5, drop_warmup="2ba"),
        model=lambda: CIFARResNet(8, num_classes=4, in_channels=3, width=4),
        stochastic=lambda a: a.drop_rate > 0,
    ),
    # Updates and ends within the three batches.
    "swa": CheckSettings(
        A.SWA(swa_start="0.3dur", swa_end="1.0dur", update_interval="1ba", schedule_swa_lr=True, swa_lr=0.5)
    ),
    "threshold_stopper": CheckSettings(),
    "weight_standardization": CheckSettings(),
}
"""Check settings by registered algorithm name."""

_DEFAULT = CheckSettings()


def register_settings(name: str, settings: CheckSettings) -> CheckSettings:
    """Returns ``settings`` after recording them for the algorithm registered as ``name``."""
    if not isinstance(settings, CheckSettings):
        raise TypeError(f"settings={settings!r}: expected a CheckSettings")
    SETTINGS[name] = settings
    return settings


def settings_for(algorithm: Algorithm | str) -> CheckSettings:
    """Returns the check settings of an algorithm (or a registered name); the defaults when none are recorded."""
    name = algorithm if isinstance(algorithm, str) else algorithm.name
    return SETTINGS.get(name, _DEFAULT)


def example(name: str) -> Algorithm:
    """Returns the instance the contract suite checks the algorithm registered as ``name`` with."""
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(sorted(REGISTRY))}")
    given = settings_for(name).example
    return given if given is not None else REGISTRY[name]()


def modality_of(algorithms: Sequence[Algorithm]) -> Modality:
    """Returns the one kind of batch the algorithms work on (images when there are none)."""
    kinds = sorted({settings_for(a).modality for a in algorithms})
    if len(kinds) > 1:
        raise ValueError(
            f"algorithms {[a.name for a in algorithms]} work on different batches ({', '.join(kinds)}); "
            "a set-up holds one kind"
        )
    return kinds[0] if kinds else "image"  # type: ignore[return-value]
