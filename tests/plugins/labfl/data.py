"""Four Gaussian blobs in 8 dimensions, the same on every rank (a fixed generator)."""
import numpy as np
import torch

from hpcfl import Dataset


def blobs(root, train_images=True):
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 2.0, (4, 8)).astype(np.float32)

    def draw(n):
        y = rng.integers(0, 4, n)
        return torch.from_numpy(centres[y] + rng.standard_normal((n, 8), dtype=np.float32)), torch.from_numpy(y)

    (train_x, train_y), (test_x, test_y) = draw(800), draw(400)
    return Dataset("blobs", train_x if train_images else train_x[:0], train_y, test_x, test_y, num_classes=4)
