"""Public testing tools: the algorithm contract suite and hypothesis strategies."""

from composer_fn.testing.contract import (
    CHECKS,
    Setup,
    check_checkpoint_round_trip,
    check_compiled_matches_eager,
    check_composes,
    check_determinism,
    check_dtypes,
    check_keys_matter,
    check_purity,
    check_surgery,
    make_setup,
    train_steps,
)

__all__ = [
    "CHECKS",
    "Setup",
    "check_checkpoint_round_trip",
    "check_compiled_matches_eager",
    "check_composes",
    "check_determinism",
    "check_dtypes",
    "check_keys_matter",
    "check_purity",
    "check_surgery",
    "make_setup",
    "train_steps",
]
