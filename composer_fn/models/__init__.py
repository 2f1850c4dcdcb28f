"""Models: a small model zoo, and the keyed layer and initialisation they are built with."""

from composer_fn.models.bert import MaskedLM, mask_tokens, masked_lm_loss
from composer_fn.models.cnn import SmallCNN, TwoConvBN
from composer_fn.models.lm import CausalLM, causal_lm_loss
from composer_fn.models.mlp import MLP
from composer_fn.models.resnet import (
    BasicBlock,
    CIFARResNet,
    cifar_resnet20,
    cifar_resnet56,
    torchvision_resnet,
)
from composer_fn.nn import KeyedDropout, init_parameters

__all__ = [
    "BasicBlock",
    "CIFARResNet",
    "CausalLM",
    "KeyedDropout",
    "MLP",
    "MaskedLM",
    "SmallCNN",
    "TwoConvBN",
    "causal_lm_loss",
    "cifar_resnet20",
    "cifar_resnet56",
    "init_parameters",
    "mask_tokens",
    "masked_lm_loss",
    "torchvision_resnet",
]
