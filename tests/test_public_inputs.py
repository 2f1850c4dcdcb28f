"""Bad arguments to the models, data and losses a user builds by hand: each is refused naming the argument, the
value and what is accepted, before any data is touched (not deep inside torch, and never accepted silently)."""

from __future__ import annotations

import pytest
import torch

from composer_fn import Trainer, optim
from composer_fn.data import TensorLoader, load_digits_task, synthetic_images
from composer_fn.models import MLP, CausalLM, causal_lm_loss, masked_lm_loss
from composer_fn.trainer.step import cross_entropy_loss, cross_entropy_per_sample_loss

ROWS = (torch.zeros(10, 2), torch.zeros(10, dtype=torch.long))


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: MLP(6, 2, hidden=64), ValueError, r"hidden=64 must be a sequence of ints >= 1"),
        (lambda: CausalLM(10)(torch.full((1, 4), 10)), ValueError, r"token 10, outside the model's vocabulary of 10"),
        (lambda: CausalLM(10)(torch.full((1, 4), -1)), ValueError, r"token -1, outside the model's vocabulary"),
        (lambda: CausalLM(10)(torch.zeros(1, 4)), TypeError, r"input_ids of dtype torch.float32: expected integer"),
        (lambda: causal_lm_loss(1.5), TypeError, r"target_key=1.5 must be a position \(int\) or a key \(str\)"),
        (lambda: masked_lm_loss(None), TypeError, r"target_key=None must be a position"),
        (lambda: cross_entropy_loss(True), TypeError, r"target_key=True must be a position"),
        (lambda: cross_entropy_per_sample_loss([1]), TypeError, r"target_key=\[1\] must be a position"),
        (
            lambda: Trainer(MLP(2, 2), TensorLoader(ROWS, 5), max_duration="1ba", optimizer=optim.sgd(0.1), input_key=0.0),
            TypeError,
            r"input_key=0.0 must be a position",
        ),
        (lambda: TensorLoader(ROWS, 4, shuffle="no"), TypeError, r"shuffle='no' must be True or False"),
        (lambda: TensorLoader(ROWS, 4, drop_last=1), TypeError, r"drop_last=1 must be True or False"),
        (
            lambda: Trainer(MLP(2, 2), TensorLoader(ROWS, 16, drop_last=True), max_duration="1ba", optimizer=optim.sgd(0.1)),
            ValueError,
            r"train_dataloader has length 0: it yields no batch \(drop_last=True with a batch_size larger",
        ),
        (lambda: load_digits_task(standardize="yes"), TypeError, r"standardize='yes' must be True or False"),
        (lambda: synthetic_images(0, 4), ValueError, r"key=0 must be one key"),
    ],
)
def test_a_bad_argument_is_refused_naming_it(build, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()
