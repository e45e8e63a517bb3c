"""FedKA's t-CNN (Chen, Zhu & Zheng, ACM MM 2023, appendix A.1): "two convolutional layers with 32 and 64 filters,
respectively, followed by ReLU activation functions and max-pooling operations. The kernel size of the
max-pooling layer is 2. The output is then flattened and fed into a fully connected layer with 512
neurons followed by the ReLU activation. The final layer is also a linear layer with the number of
neurons corresponding to the specified number of classes."

The paper gives no convolution kernel size or padding: we use 5x5 kernels, stride 1, no padding (the
FedAvg-style CNN this description matches). Shapes for 3x32x32 and 10 classes (878,538 parameters):

    conv1.weight       32 x 3 x 5 x 5     ReLU; max-pool 2      32 -> 28 -> 14
    conv2.weight       64 x 32 x 5 x 5    ReLU; max-pool 2      14 -> 10 -> 5
    fc1.weight         512 x 1600         ReLU -> features (512-d)
    classifier.weight  10 x 512
(plus biases). For 1x28x28, conv1 takes 1 channel and fc1 takes 64 * 4 * 4 = 1024 inputs."""
import torch
from torch import nn
from torch.nn import functional as F

from hpcfl.models.common import DEFAULT_HEAD, HeadOptions, classifier, flat_size, image_shape


class TCNN(nn.Module):
    """Two conv + one hidden FC + classifier; FedMA's LeNet is the same net with other widths."""

    Options = HeadOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, kernel_size: int = 5, feature_dim: int = 512,
                 widths: tuple[int, int] = (32, 64), name: str = "tcnn", options: HeadOptions = DEFAULT_HEAD):
        super().__init__()
        self.preactivation = options.preactivation
        channels, _, _ = image_shape(in_shape, name)
        self.conv1 = nn.Conv2d(channels, widths[0], kernel_size)
        self.conv2 = nn.Conv2d(widths[0], widths[1], kernel_size)
        min_side = 3 * kernel_size + 1                  # smallest side that leaves >= 1 px after both pools
        flat = flat_size(nn.Sequential(self.conv1, nn.MaxPool2d(2), self.conv2, nn.MaxPool2d(2)),
                         in_shape, name, min_side=min_side)
        self.fc1 = nn.Linear(flat, feature_dim)
        self.classifier = classifier(feature_dim, num_classes, options.preactivation)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))           # pool, then ReLU (hpcfl.models.common)
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = self.fc1(x.flatten(1))
        return x if self.preactivation else F.relu(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
