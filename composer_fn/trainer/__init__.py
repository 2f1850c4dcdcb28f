"""The imperative shell: the training loop, the step builders and checkpoint files."""

from composer_fn.trainer.checkpoint import load_checkpoint, save_checkpoint
from composer_fn.trainer.deepspeed import DeepSpeedSettings, deepspeed_options
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.model import load_model
from composer_fn.trainer.options import FSDP, BatchLayout, Checkpointing, Execution, Reporting, Resume
from composer_fn.trainer.step import cross_entropy_loss, make_eval_step, make_train_step
from composer_fn.trainer.trainer import Trainer

__all__ = [
    "FSDP",
    "BatchLayout",
    "Checkpointing",
    "DeepSpeedSettings",
    "Evaluator",
    "Execution",
    "Reporting",
    "Resume",
    "Trainer",
    "cross_entropy_loss",
    "deepspeed_options",
    "load_checkpoint",
    "load_model",
    "make_eval_step",
    "make_train_step",
    "save_checkpoint",
]
