"""The FedCME paper's Fashion-MNIST CNN (section V-A: "two convolutional layers and two linear
layers"; the last linear layer is the classifier). The paper gives no widths: we use the classic
5x5 conv 16 -> 32 with 2x2 max-pooling and a 128-d feature layer (~80 k parameters), which trains in
seconds per round on a CPU core. Works for any square single- or multi-channel input >= 4 px.

`fmnist_cnn_bn` (our choice) is the same net with BatchNorm after each convolution and after the
128-d layer (before each ReLU): 2 * (16 + 32 + 128) = 352 more parameters, 80,554 for 1x28x28 and
10 classes. FedFM's lambda = 50, tau = 0.1 with SGD momentum 0.9 (the paper's setting, on the
authors' ResNet, which has BatchNorm) makes `fmnist_cnn` diverge in the first feature-matching round
and trains stably with BatchNorm.

Each block pools before its ReLU: the same values and gradients, bit for bit, as ReLU then pool (max
and ReLU commute), on a quarter of the elements (see `hpcfl.models.common`)."""
import torch
from torch import nn

from hpcfl.models.common import DEFAULT_HEAD, HeadOptions, activation, classifier, flat_size, image_shape


class FmnistCNN(nn.Module):
    Options = HeadOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, width: int = 16, feature_dim: int = 128,
                 batchnorm: bool = False, name: str = "fmnist_cnn", options: HeadOptions = DEFAULT_HEAD):
        super().__init__()
        channels, *sides = image_shape(in_shape, name)
        pad = 2 if min(sides) < 20 else 0           # keep small inputs (8x8 digits) from vanishing

        def norm(kind, n):
            return [kind(n)] if batchnorm else []

        self.conv = nn.Sequential(
            nn.Conv2d(channels, width, 5, padding=pad), *norm(nn.BatchNorm2d, width), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 5, padding=pad), *norm(nn.BatchNorm2d, 2 * width), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
        )
        flat = flat_size(self.conv, in_shape, name, min_side=4)
        self.fc = nn.Sequential(nn.Linear(flat, feature_dim), *norm(nn.BatchNorm1d, feature_dim),
                                activation(options.preactivation))
        self.classifier = classifier(feature_dim, num_classes, options.preactivation)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
