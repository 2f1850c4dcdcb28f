"""Models: a small model zoo and keyed parameter initialisation."""

from composer_fn.models.bert import MaskedLM, mask_tokens, masked_lm_loss
from composer_fn.models.cnn import SmallCNN
from composer_fn.models.init import init_parameters
from composer_fn.models.keyed import KeyedDropout
from composer_fn.models.lm import CausalLM, causal_lm_loss
from composer_fn.models.mlp import MLP
from composer_fn.models.resnet import (
    BasicBlock,
    CIFARResNet,
    cifar_resnet20,
    cifar_resnet56,
    torchvision_resnet,
)

__all__ = [
    "BasicBlock",
    "CIFARResNet",
    "cifar_resnet20",
    "cifar_resnet56",
    "torchvision_resnet",
    "CausalLM",
    "KeyedDropout",
    "MLP",
    "MaskedLM",
    "SmallCNN",
    "causal_lm_loss",
    "init_parameters",
    "mask_tokens",
    "masked_lm_loss",
]
