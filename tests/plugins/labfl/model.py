"""A one-hidden-layer network with the split every hpcfl model has: features(x) and a classifier."""
from dataclasses import dataclass

import numpy as np
from torch import nn


class Mlp(nn.Module):
    @dataclass(frozen=True)
    class Options:
        hidden: int = 32

    def __init__(self, in_shape, num_classes, options=Options()):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(in_shape)), options.hidden), nn.ReLU())
        self.classifier = nn.Linear(options.hidden, num_classes)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.classifier(self.features(x))
