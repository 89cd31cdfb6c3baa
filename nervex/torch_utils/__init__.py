"""torch helpers: nested data conversion and batching, checkpoints, Adam with gradient clipping, network blocks."""

from .checkpoint import check_checkpoint_state, load_checkpoint, save_checkpoint
from .data_helper import collate, decollate, to_device, to_ndarray, to_tensor
from .network import MLP, conv2d_block, fc_block, get_activation
from .optimizer import Adam

__all__ = [
    "to_tensor",
    "to_ndarray",
    "to_device",
    "collate",
    "decollate",
    "Adam",
    "save_checkpoint",
    "load_checkpoint",
    "check_checkpoint_state",
    "MLP",
    "fc_block",
    "conv2d_block",
    "get_activation",
]
