"""Helpers shared by the model definitions: input-shape checks that fail with a ConfigError
(not a raw shape error deep inside a forward pass), the flattened size of a conv stack, and the
`preactivation` option of every model whose features end with a hidden Linear layer + ReLU.

`preactivation = true` moves that ReLU into the classifier: features(x) is then the output of the
last hidden Linear (which can be negative) and the classifier computes Linear(ReLU(features)).
FedClassAvg's code (hukla/FedClassAvg, `define_model`) builds its models so: the extractor ends with
a Linear with no activation and the classifier is Sequential(ReLU, Linear); its SupCon reads those
unnormalised features. The model computes the same function either way and draws the same weights.
The classifier stays one `nn.Linear` (a subclass whose forward applies the ReLU first), so its
parameters are still `classifier.weight` / `classifier.bias` and `classifier.in_features` is the
feature width: what FedClassAvg shares, FedCME swaps, FedMA matches and Setup reads is unchanged.

Pooling before ReLU: where a paper's net applies ReLU and then a 2x2 max-pool, the built-in models
pool first. Max and ReLU commute (the largest of four values, clipped at zero, is the largest of the
four clipped values, and the gradient reaches the same element or none), so the outputs and the
gradients are the same bit for bit, and the ReLU and its backward pass touch a quarter of the
elements: 31–39 % off a training step of `fmnist_cnn` on the CPU, 3–18 % off the other CNNs
(`bench/pool_order.py`; `tests/models/test_models.py` checks the equality against the papers' order)."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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


@dataclass(frozen=True)
class HeadOptions:
    """[model] params of a model whose features end with a hidden Linear + ReLU."""
    preactivation: bool = False     # features(x) stops before the last hidden ReLU, which starts the classifier


DEFAULT_HEAD = HeadOptions()        # the constructors' default (frozen, so one instance serves them all)


@dataclass(frozen=True)
class NoOptions:
    """[model] params of a model without options."""


class ReluLinear(nn.Linear):
    """Linear(ReLU(x)): the classifier of a model built with preactivation = true."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.relu(x))


def classifier(width: int, num_classes: int, preactivation: bool) -> nn.Linear:
    return (ReluLinear if preactivation else nn.Linear)(width, num_classes)


def activation(preactivation: bool, inplace: bool = False) -> nn.Module:
    """The last hidden layer's ReLU, or Identity when the classifier applies it (same state_dict keys)."""
    return nn.Identity() if preactivation else nn.ReLU(inplace=inplace)
