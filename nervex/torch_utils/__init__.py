"""torch helpers: nested data conversion and batching, checkpoints, Adam with gradient clipping, network blocks."""

from .checkpoint import CheckpointError, check_checkpoint_state, load_checkpoint, save_checkpoint
from .data_helper import collate, decollate, to_device, to_ndarray, to_tensor
from .distribution import CategoricalDist, GaussianDist, SquashBounds, TanhGaussianDist, squash_bounds
from .network import MLP, conv2d_block, fc_block, get_activation
from .normalizer import ReturnNormalizer, RunningMeanStd
from .optimizer import Adam, clip_grad_norm, trained_tensors

__all__ = [
    "to_tensor",
    "to_ndarray",
    "to_device",
    "collate",
    "decollate",
    "Adam",
    "clip_grad_norm",
    "trained_tensors",
    "save_checkpoint",
    "load_checkpoint",
    "check_checkpoint_state",
    "CheckpointError",
    "MLP",
    "fc_block",
    "conv2d_block",
    "get_activation",
    "CategoricalDist",
    "GaussianDist",
    "SquashBounds",
    "TanhGaussianDist",
    "squash_bounds",
    "RunningMeanStd",
    "ReturnNormalizer",
]
