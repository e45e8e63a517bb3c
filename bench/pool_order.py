"""Pooling before ReLU against the papers' ReLU-then-pool, the measurement behind the built-in CNNs' order.

Max and ReLU commute, so both orders compute the same outputs and gradients bit for bit; pooling
first leaves the ReLU and its backward pass a quarter of the elements. Each model trains some batches
of random images (SGD with momentum) in the papers' order and in hpcfl's, alternating (the machine's
speed drifts); the script checks that both end with the same weights, bit for bit, and prints the
best of --repeat seconds and the ratio hpcfl / paper per model.

    python bench/pool_order.py [--device cpu|cuda] [--batches 30] [--repeat 5] [--models fmnist_cnn,tcnn]
"""
import argparse
import copy
import types

import torch
import torch.nn.functional as F
from memory_format import train  # bench/ is the script's folder, so on its path (as runs.py for others)
from torch import nn

from hpcfl.models import build_model, lay_out
from hpcfl.models.tcnn import TCNN
from hpcfl.runtime.placement import memory_format

MODELS = {"fmnist_cnn": ((1, 28, 28), 32), "fmnist_cnn_bn": ((1, 28, 28), 64), "fmnist_cnn_wide": ((1, 28, 28), 32),
          "lenet": ((1, 28, 28), 32), "tcnn": ((3, 32, 32), 128), "alexnet_cifar": ((3, 32, 32), 64)}


def paper_order(model: nn.Module) -> nn.Module:
    """A copy of `model` that applies ReLU before each max-pool, as the papers draw it."""
    model = copy.deepcopy(model)
    if isinstance(model, TCNN):
        def features(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = self.fc1(x.flatten(1))
            return x if self.preactivation else F.relu(x)
        model.features = types.MethodType(features, model)
        return model
    layers = list(model.conv)
    for i in range(len(layers) - 1):
        if isinstance(layers[i], nn.MaxPool2d) and isinstance(layers[i + 1], nn.ReLU):
            layers[i], layers[i + 1] = layers[i + 1], layers[i]
    model.conv = nn.Sequential(*layers)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default=",".join(m for m in MODELS if m != "alexnet_cifar"),
                        help="comma-separated; alexnet_cifar (also measured) takes minutes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    layout = memory_format("auto", device)
    print(f"device: {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu, 1 thread'}, "
          f"torch {torch.__version__}, layout {layout}, {args.batches} batches, best of {args.repeat}")
    for name in args.models.split(","):
        shape, size = MODELS[name]
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(args.batches * size, *shape, generator=gen).to(device)
        y = torch.randint(0, 10, (args.batches * size,), generator=gen).to(device)
        torch.manual_seed(0)
        ours = lay_out(build_model(name, shape, 10).to(device), layout)
        theirs = paper_order(ours)
        runs = [(train(theirs, x, y, size, device), train(ours, x, y, size, device)) for _ in range(args.repeat)]
        same = all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(),
                                                      strict=True))
        paper, pooled = min(p for p, _ in runs), min(o for _, o in runs)
        print(f"{name:<16} relu-then-pool {paper:6.3f} s   pool-then-relu {pooled:6.3f} s   ratio {pooled / paper:.3f}"
              f"   same weights after {args.repeat * args.batches} steps: {same}")


if __name__ == "__main__":
    main()
