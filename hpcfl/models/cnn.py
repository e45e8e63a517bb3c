"""The FedCME paper's Fashion-MNIST CNN (section V-A: "two convolutional layers and two linear
layers"; the last linear layer is the classifier). The paper gives no widths: we use the classic
5x5 conv 16 -> 32 with 2x2 max-pooling and a 128-d feature layer (~80 k parameters), which trains in
seconds per round on a CPU core. Works for any square single- or multi-channel input >= 12 px."""
import torch
from torch import nn

from hpcfl.models.common import image_shape


class FmnistCNN(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, width: int = 16, feature_dim: int = 128):
        super().__init__()
        channels, _, side = image_shape(in_shape, "fmnist_cnn")
        pad = 2 if side < 20 else 0           # keep small inputs (8x8 digits) from vanishing
        self.conv = nn.Sequential(
            nn.Conv2d(channels, width, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, *in_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, feature_dim), nn.ReLU())
        self.classifier = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
