"""One client's local training: hpcfl's client loop against a bare loop, and the levers a loop has.

The issue behind it asked what hpcfl's client loop spends beyond a plain loop (indexing the resident
data, the loss bookkeeping, the optimizer, the terms' hooks) and which settings make a loop faster
than the plain one. Every variant below trains the same model from the same weights on the same
Fashion-MNIST client (real data, the quickstart's CNN and batch size, SGD with momentum, the runner's
memory layout) through the same batches, alternating the variants (the machine's speed drifts); each
figure is the best of --repeat, in microseconds per step, with its ratio to the bare loop:

- bare:          `x[idx]`, `torch.optim.SGD` as constructed by default, `zero_grad()`, nothing else;
- hpcfl:         `LocalTrainer.train` (what every algorithm's local update runs);
- index_select:  the bare loop taking the batch with `index_select` instead of advanced indexing;
- foreach/fused: the bare loop with `torch.optim.SGD(foreach=True)` / `(fused=True)`;
- pre-permuted:  the bare loop on one permuted copy of the client's data per epoch (contiguous slices);
- uint8:         the bare loop on the client's uint8 pixels, each batch normalised as it is taken (the
                 same floats; a quarter of the memory, and what set-up would no longer make).

    python bench/local_step.py [--samples 3000] [--repeat 5] [--device cpu|cuda]
"""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from hpcfl.algorithms.base import Client
from hpcfl.config import TrainConfig
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.models import build_model, lay_out, load_state
from hpcfl.runtime.placement import memory_format
from hpcfl.training import LocalTrainer


def bare(variant: str):
    """A plain loop with one lever changed (`variant`), taking the runner's batches."""
    def train(model, client, trainer, round):
        options = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(variant, {})
        opt = torch.optim.SGD(model.parameters(), lr=trainer.cfg.lr, momentum=trainer.cfg.momentum, **options)
        batches = trainer.batches(client.num_samples, round, client.id, client.y.device)
        if variant == "pre-permuted":
            order = torch.cat(batches)
            x, y = client.x.index_select(0, order), client.y.index_select(0, order)
            sizes = [len(b) for b in batches]
            batches = [slice(i, i + n) for i, n in zip(np.cumsum([0] + sizes[:-1]), sizes, strict=True)]
        else:
            x, y = client.x, client.y
        for idx in batches:
            if variant == "uint8":
                scale, shift = PIXELS[1]
                xb, yb = PIXELS[0].index_select(0, idx).float() * scale - shift, y[idx]
            elif variant == "index_select":
                xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            else:
                xb, yb = x[idx], y[idx]
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    return train


def hpcfl(model, client, trainer, round):
    trainer.train(model, client, round)


VARIANTS = {"bare": bare("bare"), "hpcfl": hpcfl, "index_select": bare("index_select"),
            "foreach": bare("foreach"), "fused": bare("fused"), "pre-permuted": bare("pre-permuted"),
            "uint8": bare("uint8")}
PIXELS = []          # the client's uint8 pixels and the (scale, shift) that normalise them, for "uint8"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000, help="the client's samples (3000: 94 steps of 32)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    data = load_dataset("fashion_mnist", resolve_data_root(None))
    index = np.random.default_rng(0).permutation(len(data.train_y))[:args.samples]
    client = Client(0, *(t.to(device) for t in data.train_rows(index)), np.zeros(10))
    PIXELS[:] = [data.train_rows(index, normalised=False)[0].to(device),
                 tuple(t.to(device) for t in data.pixel_normalization())]
    assert torch.equal(PIXELS[0].float() * PIXELS[1][0] - PIXELS[1][1], client.x), "not the runner's floats"
    trainer = LocalTrainer(TrainConfig(batch_size=32, lr=0.05, momentum=0.9), seed=0)
    torch.manual_seed(0)
    model = lay_out(build_model("fmnist_cnn", data.input_shape, 10).to(device), memory_format("auto", device))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    steps = len(trainer.batches(client.num_samples, 0, 0, device))
    times = {name: [] for name in VARIANTS}
    for repeat in range(args.repeat + 1):                  # the first pass warms every path up, untimed
        for name, train in VARIANTS.items():
            load_state(model, start)
            if device.type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            train(model, client, trainer, repeat)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if repeat:
                times[name].append((time.perf_counter() - began) / steps * 1e6)
    print(f"device: {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu, 1 thread'}, "
          f"torch {torch.__version__}, fmnist_cnn, {steps} steps of 32, best of {args.repeat}")
    base = min(times["bare"])
    for name, runs in times.items():
        print(f"{name:<14} {min(runs):8.1f} us/step   ratio {min(runs) / base:.3f}   "
              f"(median {np.median(runs):.1f})")


if __name__ == "__main__":
    main()
