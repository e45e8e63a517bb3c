"""A CIFAR-size AlexNet for FedClassAvg (section 4.1: "we used a custom implementation for AlexNet
because the torchvision implementation is only valid for ImageNet datasets"; the feature extractor is
the convolutional backbone plus one fully connected layer of width 512, the classifier one Linear
512 -> C). The paper gives no layer sizes. We keep AlexNet's five convolutions with torchvision's
channel widths (64, 192, 384, 256, 256) and its three max-pools, but with 3x3 kernels, stride 1,
padding 1 and 2x2 pools so that a 32x32 image ends at 4x4; no normalisation layers (AlexNet's LRN is
dropped, as in torchvision). Shapes for 3x32x32 and 10 classes (4,354,378 parameters):

    conv1  64 x 3 x 3 x 3      ReLU; max-pool 2   32 -> 16
    conv2  192 x 64 x 3 x 3    ReLU; max-pool 2   16 -> 8
    conv3  384 x 192 x 3 x 3   ReLU
    conv4  256 x 384 x 3 x 3   ReLU
    conv5  256 x 256 x 3 x 3   ReLU; max-pool 2   8 -> 4
    dropout 0.5; fc 512 x 4096; ReLU          -> features (512-d)
    classifier 10 x 512
For 1x28x28 the pools give 14, 7, 3 and the fc takes 256 * 3 * 3 = 2304 inputs."""
import torch
from torch import nn

from hpcfl.models.common import DEFAULT_HEAD, HeadOptions, activation, classifier, flat_size, image_shape


class AlexNetCifar(nn.Module):
    Options = HeadOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, feature_dim: int = 512, dropout: float = 0.5,
                 options: HeadOptions = DEFAULT_HEAD):
        super().__init__()
        channels, _, _ = image_shape(in_shape, "alexnet_cifar")
        self.conv = nn.Sequential(
            nn.Conv2d(channels, 64, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(inplace=True),   # pool, then ReLU
            nn.Conv2d(64, 192, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(inplace=True),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(inplace=True),
            nn.Flatten(),
        )
        flat = flat_size(self.conv, in_shape, "alexnet_cifar", min_side=8)
        self.fc = nn.Sequential(nn.Dropout(dropout), nn.Linear(flat, feature_dim),
                                activation(options.preactivation, inplace=True))
        self.classifier = classifier(feature_dim, num_classes, options.preactivation)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
