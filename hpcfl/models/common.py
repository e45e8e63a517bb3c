"""Helpers shared by the model definitions: input-shape checks that fail with a ConfigError
(not a raw shape error deep inside a forward pass) and the flattened size of a conv stack."""
import torch
from torch import nn

from hpcfl.errors import ConfigError


def image_shape(in_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    """`in_shape` as (channels, height, width), or a ConfigError naming the model."""
    if len(in_shape) != 3 or min(in_shape) < 1:
        raise ConfigError(f"model '{model}' takes images: in_shape must be (channels, height, width), "
                          f"got {tuple(in_shape)}; pick a sequence model for 1-d data")
    return int(in_shape[0]), int(in_shape[1]), int(in_shape[2])


def require_side(in_shape: tuple[int, ...], model: str, min_side: int) -> None:
    """A ConfigError unless both image sides are at least `min_side` pixels."""
    if min(in_shape[1:]) < min_side:
        raise ConfigError(f"model '{model}' needs images at least {min_side}x{min_side} px, got "
                          f"{tuple(in_shape)}; use a larger dataset or a model for small inputs")


def flat_size(stack: nn.Module, in_shape: tuple[int, ...], model: str, min_side: int) -> int:
    """Width of `stack(x).flatten(1)` for one input of `in_shape`. The probe runs in eval mode under
    no_grad, so it neither draws from torch's generator (dropout) nor touches BatchNorm statistics."""
    require_side(in_shape, model, min_side)
    was_training = stack.training
    stack.eval()
    try:
        with torch.no_grad():
            return int(stack(torch.zeros(1, *in_shape)).flatten(1).shape[1])
    finally:
        stack.train(was_training)
