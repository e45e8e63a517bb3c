"""Model registry. Every model exposes `features(x)` (the representation) and `classifier` (the
last layer), because FedFM, FedCME, FedClassAvg and FedKA all act on one side of that split."""
from functools import partial
from typing import Callable

import torch
from torch import nn

from hpcfl.errors import ConfigError
from hpcfl.models.alexnet import AlexNetCifar
from hpcfl.models.cnn import FmnistCNN
from hpcfl.models.fedma import VGG9, CharLSTM, LeNet
from hpcfl.models.tcnn import TCNN
from hpcfl.models.vision import GoogLeNet, ResNet18, ResNet50, ShuffleNetV2

# name -> Model(in_shape, num_classes); width of features(x) in the comment
MODELS: dict[str, Callable[..., nn.Module]] = {
    "fmnist_cnn": FmnistCNN,        # FedCME, 128
    # FedProto's heterogeneous clients: the same two-conv CNN with other channel counts, 128
    "fmnist_cnn_narrow": partial(FmnistCNN, width=8),
    "fmnist_cnn_wide": partial(FmnistCNN, width=32),
    "tcnn": TCNN,                   # FedKA appendix A.1, 512
    "lenet": LeNet,                 # FedMA (MNIST), 500
    "vgg9": VGG9,                   # FedMA Table 4, no BatchNorm, 512
    "char_lstm": CharLSTM,          # FedMA Table 5 (Shakespeare), in_shape = (seq_len,), 256
    "resnet18": ResNet18,           # CIFAR stem, 512
    "resnet50": ResNet50,           # CIFAR stem, 2048
    "shufflenetv2": ShuffleNetV2,   # FedClassAvg, 512
    "googlenet": GoogLeNet,         # FedClassAvg, 512
    "alexnet_cifar": AlexNetCifar,  # FedClassAvg, 512
}


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


def load_state(model: nn.Module, state) -> None:
    """Copy `state` (any dtype/device) into the model's own tensors."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])
