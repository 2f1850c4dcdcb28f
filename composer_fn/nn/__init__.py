"""What algorithms, the trainer and the models share: keyed layers, keyed initialisation, the block protocol, copies
that share a module's tensors."""

from composer_fn.nn.blocks import has_protocol_blocks, protocol_attribute, protocol_blocks
from composer_fn.nn.init import init_parameters, materialise, require_key
from composer_fn.nn.keyed import (
    FORWARD_KEY,
    KeyedDropout,
    forward_key_names,
    forward_keys,
    register_forward_key,
)
from composer_fn.nn.sharing import shared_copy

__all__ = [
    "FORWARD_KEY",
    "KeyedDropout",
    "forward_key_names",
    "forward_keys",
    "init_parameters",
    "materialise",
    "has_protocol_blocks",
    "protocol_attribute",
    "protocol_blocks",
    "register_forward_key",
    "require_key",
    "shared_copy",
]
