"""torchvision backbones adapted to 32x32 (and 28x28) images, split into `features` and
`classifier`. Each wraps the unmodified torchvision model as `backbone`, swaps its ImageNet stem for a
CIFAR one (ResNet: unless stem = "imagenet") and its `fc` for nn.Identity, so `backbone(x)` is the
globally pooled representation; `classifier` is a fresh Linear. All stems take in_shape[0] channels,
and with CIFAR stems every net here ends at 4x4 before global pooling for a 32x32 input (layer4 /
stage4 / inception5 run at 4x4).

- ResNet-18 / ResNet-50 (FedFM, FedKA, FedClassAvg): CIFAR stem = 3x3 conv, stride 1, padding 1,
  64 filters, no max-pool. features = the pooled layer4 output, 512-d for ResNet-18 (FedFM: "ResNet18
  without the last fully-connected layer", d = 512) and 2048-d for ResNet-50 (kept at 2048, no
  projection: FedKA only "modif[ies] the output projector of ResNet-50" and FedFM uses it unchanged).
  Options ([model] params): `stem = "imagenet"` keeps torchvision's stem (7x7 conv stride 2, padding
  3, then 3x3 max-pool stride 2: a 32x32 image reaches layer4 at 1x1; a fresh 7x7 conv for other
  channel counts), which FedFM's authors use on CIFAR (rui-ye/FedFM `resnet18_7`, and the paper's
  "standard ResNet") and FedClassAvg's too (hukla/FedClassAvg `define_model`);
  `feature_layer = k` adds Linear(width, k) + ReLU after the pooling, so features are k-d
  (FedClassAvg section 4.1 and code: ResNet-18's extractor ends with Linear(512, 512), no activation:
  add `preactivation = true`, which needs the extra layer, since the pooled features have no hidden
  Linear of their own).
- ShuffleNetV2 x1.0 and GoogLeNet (FedClassAvg section 4.1: backbone + one fully connected layer of
  width 512 as the feature extractor, then a Linear 512 -> C classifier): the pooled 1024-d backbone
  output goes through Linear(1024, 512) + ReLU (the ReLU is our choice; the paper names no activation;
  it keeps the features non-negative like ResNet-18's pooled ones, which FedClassAvg mixes them with;
  `preactivation = true` moves it into the classifier, as FedClassAvg's code has it).
  ShuffleNetV2 stem: 3x3 conv stride 1 (torchvision: stride 2) and no max-pool. GoogLeNet: no aux
  heads, no input transform, conv1 = 3x3 stride 1 (torchvision: 7x7 stride 2) and no maxpool1; the
  rest (maxpool2..4, inception blocks, dropout 0.2 before the head) is torchvision's.
Replaced stem convolutions are initialised the way torchvision initialises that model.
torchvision is imported when one of these models is built, not when the registry is imported (it
adds about a second to every rank's start-up)."""
from dataclasses import dataclass

import torch
from torch import nn

from hpcfl.models.common import DEFAULT_HEAD, HeadOptions, activation, classifier, image_shape


class _Split(nn.Module):
    """features(x) = head(backbone(x)); forward = classifier(features(x))."""

    backbone: nn.Module
    head: nn.Module
    classifier: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@dataclass(frozen=True)
class ResNetOptions:
    preactivation: bool = False     # features stop before the extra layer's ReLU (needs feature_layer > 0)
    feature_layer: int = 0          # width of an extra Linear + ReLU after the pooling; 0: none
    stem: str = "cifar"             # cifar: 3x3 stride 1, no max-pool; imagenet: torchvision's 7x7 stride 2 + max-pool

    def __post_init__(self):
        if self.stem not in ("cifar", "imagenet"):
            raise ValueError(f"stem = {self.stem!r}; choose 'cifar' or 'imagenet'")
        if self.feature_layer < 0:
            raise ValueError(f"feature_layer = {self.feature_layer} must be >= 0 (0: no extra layer)")
        if self.preactivation and not self.feature_layer:
            raise ValueError("preactivation = true needs feature_layer > 0: the pooled features have no hidden Linear "
                             "to stop before (FedClassAvg: feature_layer = 512)")


class ResNet(_Split):
    Options = ResNetOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, depth: int,
                 options: ResNetOptions = ResNetOptions()):
        super().__init__()
        channels, _, _ = image_shape(in_shape, f"resnet{depth}")
        from torchvision import models as tvm
        constructors = {18: tvm.resnet18, 50: tvm.resnet50}
        self.backbone = constructors[depth](weights=None)
        if options.stem == "cifar" or channels != 3:      # torchvision's own conv1 is the 3-channel ImageNet one
            kernel, stride, padding = (3, 1, 1) if options.stem == "cifar" else (7, 2, 3)
            self.backbone.conv1 = nn.Conv2d(channels, 64, kernel, stride, padding, bias=False)
            nn.init.kaiming_normal_(self.backbone.conv1.weight, mode="fan_out", nonlinearity="relu")
        if options.stem == "cifar":
            self.backbone.maxpool = nn.Identity()
        width = self.backbone.fc.in_features     # 512 (BasicBlock) or 2048 (Bottleneck)
        self.backbone.fc = nn.Identity()
        self.head = nn.Identity()
        if options.feature_layer:
            self.head = nn.Sequential(nn.Linear(width, options.feature_layer), activation(options.preactivation))
            width = options.feature_layer
        self.classifier = classifier(width, num_classes, options.preactivation)


class ResNet18(ResNet):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, options: ResNetOptions = ResNetOptions()):
        super().__init__(in_shape, num_classes, depth=18, options=options)


class ResNet50(ResNet):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, options: ResNetOptions = ResNetOptions()):
        super().__init__(in_shape, num_classes, depth=50, options=options)


class ShuffleNetV2(_Split):
    Options = HeadOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, feature_dim: int = 512,
                 options: HeadOptions = DEFAULT_HEAD):
        super().__init__()
        channels, _, _ = image_shape(in_shape, "shufflenetv2")
        from torchvision import models as tvm
        self.backbone = tvm.shufflenet_v2_x1_0(weights=None)
        stem = self.backbone.conv1[0]
        self.backbone.conv1[0] = nn.Conv2d(channels, stem.out_channels, 3, stride=1, padding=1, bias=False)
        self.backbone.maxpool = nn.Identity()
        width = self.backbone.fc.in_features     # 1024
        self.backbone.fc = nn.Identity()
        self.head = nn.Sequential(nn.Linear(width, feature_dim), activation(options.preactivation, inplace=True))
        self.classifier = classifier(feature_dim, num_classes, options.preactivation)


class GoogLeNet(_Split):
    Options = HeadOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, feature_dim: int = 512,
                 options: HeadOptions = DEFAULT_HEAD):
        super().__init__()
        channels, _, _ = image_shape(in_shape, "googlenet")
        from torchvision import models as tvm
        from torchvision.models.googlenet import BasicConv2d
        self.backbone = tvm.googlenet(weights=None, aux_logits=False, transform_input=False, init_weights=True)
        self.backbone.conv1 = BasicConv2d(channels, 64, kernel_size=3, stride=1, padding=1)
        nn.init.trunc_normal_(self.backbone.conv1.conv.weight, mean=0.0, std=0.01, a=-2, b=2)
        self.backbone.maxpool1 = nn.Identity()
        width = self.backbone.fc.in_features     # 1024
        self.backbone.fc = nn.Identity()
        self.head = nn.Sequential(nn.Linear(width, feature_dim), activation(options.preactivation, inplace=True))
        self.classifier = classifier(feature_dim, num_classes, options.preactivation)
