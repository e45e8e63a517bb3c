"""Model registry. Every model exposes `features(x)` (the representation) and `classifier` (the
last layer), because FedFM, FedCME, FedClassAvg and FedKA all act on one side of that split."""
from typing import Callable

import torch
from torch import nn

from hpcfl.errors import ConfigError
from hpcfl.models.cnn import FmnistCNN

MODELS: dict[str, Callable[..., nn.Module]] = {"fmnist_cnn": FmnistCNN}


def build_model(name: str, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A freshly initialised model (draws from torch's global generator: seed it first)."""
    if name not in MODELS:
        raise ConfigError(f"model.name = '{name}' is unknown; valid: {sorted(MODELS)}")
    return MODELS[name](in_shape, num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Everything that defines the model's function (parameters and buffers such as BN statistics)."""
    return dict(model.state_dict())
