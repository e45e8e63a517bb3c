"""Model registry. Every model exposes `features(x)` (the representation) and `classifier` (the
last layer), because FedFM, FedCME, FedClassAvg and FedKA all act on one side of that split.

A model's options (`[model] params`) are the fields of its constructor's `Options` dataclass, passed
as `options=`; a constructor without `Options` (a plug-in's, say) takes none. Image models whose
features end with a hidden Linear + ReLU take `preactivation` (hpcfl.models.common); ResNets take
`preactivation`, `feature_layer` and `stem` (hpcfl.models.vision)."""
import inspect
from functools import partial
from typing import Any

import torch
from torch import nn

from hpcfl.errors import ConfigError
from hpcfl.models.alexnet import AlexNetCifar
from hpcfl.models.cnn import FmnistCNN
from hpcfl.models.common import NoOptions
from hpcfl.models.fedma import VGG9, CharLSTM, LeNet
from hpcfl.models.tcnn import TCNN
from hpcfl.models.vision import GoogLeNet, ResNet18, ResNet50, ShuffleNetV2
from hpcfl.plugins import Registry, callable_check

# model.name -> Model(in_shape, num_classes[, options=Model.Options(...)]); width of features(x) in the
# comment. Or a plug-in's "package.module:Model" (hpcfl.plugins).
MODELS = Registry("model.name", callable_check("a model constructor"), {
    "fmnist_cnn": FmnistCNN,        # FedCME, 128
    # FedProto's heterogeneous clients: the same two-conv CNN with other channel counts, 128
    "fmnist_cnn_narrow": partial(FmnistCNN, width=8, name="fmnist_cnn_narrow"),
    "fmnist_cnn_wide": partial(FmnistCNN, width=32, name="fmnist_cnn_wide"),
    # BatchNorm after each conv and the 128-d layer, 128
    "fmnist_cnn_bn": partial(FmnistCNN, batchnorm=True, name="fmnist_cnn_bn"),
    "tcnn": TCNN,                   # FedKA appendix A.1, 512
    "lenet": LeNet,                 # FedMA (MNIST), 500
    "vgg9": VGG9,                   # FedMA Table 4, no BatchNorm, 512
    "char_lstm": CharLSTM,          # FedMA Table 5 (Shakespeare), in_shape = (seq_len,), 256
    "resnet18": ResNet18,           # CIFAR stem (or stem = "imagenet"), 512 (or feature_layer)
    "resnet50": ResNet50,           # CIFAR stem (or stem = "imagenet"), 2048 (or feature_layer)
    "shufflenetv2": ShuffleNetV2,   # FedClassAvg, 512
    "googlenet": GoogLeNet,         # FedClassAvg, 512
    "alexnet_cifar": AlexNetCifar,  # FedClassAvg, 512
})


def model_options(name: str) -> type:
    """The dataclass of model `name`'s options ([model] params)."""
    constructor = MODELS[name]
    return getattr(getattr(constructor, "func", constructor), "Options", NoOptions)    # func: a partial's class


def build_model(name: str, in_shape: tuple[int, ...], num_classes: int, options: Any = None) -> nn.Module:
    """A freshly initialised model (draws from torch's global generator: seed it first). `options`:
    an instance of model_options(name) (hpcfl.params.model_params builds them from a job's [model]
    params); None: the defaults."""
    constructor = MODELS[name]
    keywords = {} if model_options(name) is NoOptions else {"options": options or model_options(name)()}
    try:                                    # a plug-in's signature, checked before it runs
        inspect.signature(constructor).bind(in_shape, num_classes, **keywords)
    except ValueError:                      # no signature to read (a builtin): its call will tell
        pass
    except TypeError as err:
        raise ConfigError(f"model.name = {name!r} cannot be called as {name}(in_shape, num_classes"
                          f"{', options=...' if keywords else ''}) ({err}): a model plug-in is a class or function "
                          "taking those (docs: add a data set or model)") from None
    model = constructor(in_shape, num_classes, **keywords)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.name = {name!r} returned a {type(model).__name__}, not a torch.nn.Module "
                          "(docs: add a data set or model)")
    if not (callable(getattr(model, "features", None)) and isinstance(getattr(model, "classifier", None), nn.Linear)):
        raise ConfigError(f"model.name = {name!r} built {type(model).__name__}, which lacks a features(x) method or "
                          "an nn.Linear `classifier` (forward(x) == classifier(features(x))), which local training "
                          "and the algorithms use (docs: add a data set or model)")
    return model


def lay_out(model: nn.Module, layout: torch.memory_format) -> nn.Module:
    """Put `model`'s 2-d convolution weights in `layout`, in place; every other tensor stays as built
    (Module.to(memory_format=...) would convert any 4-d tensor and refuse a 5-d one). `to` restrides a
    weight with one input channel too, which `contiguous` leaves as it is: the first convolution's
    strides decide the layout every later activation runs in."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.weight.data = module.weight.data.to(memory_format=layout)
    return model


def layout_of(weight: torch.Tensor) -> torch.memory_format:
    """channels_last when a 4-d weight is strided so (its channels adjacent), else contiguous; a weight
    with one input channel is contiguous both ways, and only its strides tell which."""
    if weight.dim() == 4 and weight.stride(1) == 1 and weight.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_state(model: nn.Module, state) -> None:
    """Copy `state` (any dtype/device) into the model's own tensors."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])
