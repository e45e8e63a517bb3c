"""The three FedMA models (Wang et al., ICLR 2020): LeNet on MNIST, VGG-9 on CIFAR-10 and the
1-layer character LSTM on Shakespeare. None has BatchNorm (FedMA: "we ignore all batch normalization
layers in the VGG architecture"). Every non-linearity is ReLU. Layers carry the paper's names
(conv1 ... fc8, encoder, lstm) except the last one, which is `classifier` as everywhere in hpcfl
(Table 4's `layer9.fc9`, Table 5's `decoder`)."""
import torch
from torch import nn
from torch.nn import functional as F

from hpcfl.errors import ConfigError
from hpcfl.models.common import DEFAULT_HEAD, HeadOptions, classifier, image_shape, require_side
from hpcfl.models.tcnn import TCNN


class LeNet(TCNN):
    """FedMA's MNIST LeNet. The paper gives no LeNet table (Table 4 is VGG-9 only); it says "LeNet
    (LeCun et al., 1998) (4 layers)" and Table 3 gives 431k parameters. The classic 4-layer LeNet
    with 20 and 50 5x5 filters and a 500-unit hidden layer has exactly 431,080 on MNIST:

        parameter          shape (PyTorch layout)   notes
        conv1.weight       20 x 1 x 5 x 5           stride 1, no padding; ReLU; max-pool 2x2
        conv1.bias         20
        conv2.weight       50 x 20 x 5 x 5          stride 1, no padding; ReLU; max-pool 2x2
        conv2.bias         50
        fc1.weight         500 x 800                ReLU  -> features (500-d)
        fc1.bias           500
        classifier.weight  10 x 500
        classifier.bias    10

    For other inputs conv1 takes in_shape[0] channels and fc1 takes the flattened size
    (800 for 1x28x28, 1250 for 3x32x32)."""

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, options: HeadOptions = DEFAULT_HEAD):
        super().__init__(in_shape, num_classes, feature_dim=500, widths=(20, 50), name="lenet", options=options)


class VGG9(nn.Module):
    """FedMA's VGG-9 for CIFAR-10, Table 4 (appendix D.1), without BatchNorm. The table writes conv
    weights as (C_in, C_out, c, c) and fc weights as (in, out); PyTorch stores the transposes:

        table parameter      table shape          here                 layer hyper-parameters
        layer1.conv1.weight  3 x 32 x 3 x 3       conv1.weight         stride 1, padding 1; ReLU
        layer1.conv1.bias    32                   conv1.bias
        layer2.conv2.weight  32 x 64 x 3 x 3      conv2.weight         stride 1, padding 1; ReLU
        layer2.conv2.bias    64                   conv2.bias
        pooling.max                                                    kernel 2, stride 2
        layer3.conv3.weight  64 x 128 x 3 x 3     conv3.weight         stride 1, padding 1; ReLU
        layer3.conv3.bias    128                  conv3.bias
        layer4.conv4.weight  128 x 128 x 3 x 3    conv4.weight         stride 1, padding 1; ReLU
        layer4.conv4.bias    128                  conv4.bias
        pooling.max                                                    kernel 2, stride 2
        dropout                                                        p = 5%
        layer5.conv5.weight  128 x 256 x 3 x 3    conv5.weight         stride 1, padding 1; ReLU
        layer5.conv5.bias    256                  conv5.bias
        layer6.conv6.weight  256 x 256 x 3 x 3    conv6.weight         stride 1, padding 1; ReLU
        layer6.conv6.bias    256                  conv6.bias
        pooling.max                                                    kernel 2, stride 2
        dropout                                                        p = 10%
        layer7.fc7.weight    4096 x 512           fc7.weight           ReLU
        layer7.fc7.bias      512                  fc7.bias
        layer8.fc8.weight    512 x 512            fc8.weight           ReLU
        layer8.fc8.bias      512                  fc8.bias
        dropout                                                        p = 10%  -> features (512-d)
        layer9.fc9.weight    512 x 10             classifier.weight
        layer9.fc9.bias      10                   classifier.bias

    3,491,530 parameters for 3x32x32 and 10 classes (Table 7's "original" count). For other inputs
    conv1 takes in_shape[0] channels and fc7 takes the flattened size (256 * 3 * 3 = 2304 for 1x28x28)."""

    Options = HeadOptions

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, options: HeadOptions = DEFAULT_HEAD):
        super().__init__()
        self.preactivation = options.preactivation
        channels, height, width = image_shape(in_shape, "vgg9")
        require_side(in_shape, "vgg9", 8)
        self.conv1 = nn.Conv2d(channels, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.conv4 = nn.Conv2d(128, 128, 3, padding=1)
        self.conv5 = nn.Conv2d(128, 256, 3, padding=1)
        self.conv6 = nn.Conv2d(256, 256, 3, padding=1)
        self.drop5 = nn.Dropout(0.05)
        self.drop6 = nn.Dropout(0.10)
        self.drop8 = nn.Dropout(0.10)
        self.fc7 = nn.Linear(256 * (height // 8) * (width // 8), 512)  # size-preserving convs, 3 pools
        self.fc8 = nn.Linear(512, 512)
        self.classifier = classifier(512, num_classes, options.preactivation)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv2(F.relu(self.conv1(x))), 2))  # pool, then ReLU (hpcfl.models.common)
        x = self.drop5(F.relu(F.max_pool2d(self.conv4(F.relu(self.conv3(x))), 2)))
        x = self.drop6(F.relu(F.max_pool2d(self.conv6(F.relu(self.conv5(x))), 2)))
        x = self.fc8(F.relu(self.fc7(x.flatten(1))))
        return self.drop8(x if self.preactivation else F.relu(x))     # dropout and ReLU commute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CharLSTM(nn.Module):
    """FedMA's Shakespeare model, Table 5 (vocabulary 80, 293,584 parameters):

        table parameter     shape         here
        encoder.weight      80 x 8        encoder.weight      (nn.Embedding)
        lstm.weight.ih.l0   1024 x 8      lstm.weight_ih_l0   (1 layer, hidden 256; 4 gates x 256)
        lstm.weight.hh.l0   1024 x 256    lstm.weight_hh_l0
        lstm.bias.ih.l0     1024          lstm.bias_ih_l0
        lstm.bias.hh.l0     1024          lstm.bias_hh_l0
        decoder.weight      80 x 256      classifier.weight
        decoder.bias        80            classifier.bias

    `in_shape = (seq_len,)`; inputs are int64 character indices of shape (N, seq_len) in
    [0, num_classes); `num_classes` is the vocabulary size (the model predicts the next character).
    features(x) is the LSTM's hidden state after the last character (N x 256)."""

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, embed_dim: int = 8, hidden: int = 256):
        super().__init__()
        if len(in_shape) != 1 or in_shape[0] < 1:
            raise ConfigError(f"model 'char_lstm' takes character sequences: in_shape must be (seq_len,), "
                              f"got {tuple(in_shape)}; pick an image model for image data")
        self.encoder = nn.Embedding(num_classes, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=1, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        _, (h_n, _) = self.lstm(self.encoder(x))
        return h_n[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
