"""channels_last against contiguous (NCHW) convolution weights, the measurement behind run.memory_format = 'auto'.

Each built-in image model trains some batches of random images (SGD with momentum, as the studies
run) and then evaluates them in one batch, once with its weights contiguous and once channels_last,
alternating the two (the machine's speed drifts); each figure is the best of --repeat. Prints the
seconds and the ratio channels_last / contiguous per model, for training and for evaluation.

    python bench/memory_format.py [--device cpu|cuda] [--batches 20] [--repeat 3] [--models fmnist_cnn,lenet]
    python bench/memory_format.py --smoke     # fmnist_cnn, 2 batches, once, on the CPU: checks that it runs (CI)
"""
import argparse
import time

import torch
import torch.nn.functional as F

from hpcfl.models import build_model, lay_out

# (model, input shape, the batch size its studies use)
MODELS = {"fmnist_cnn": ((1, 28, 28), 32), "fmnist_cnn_bn": ((1, 28, 28), 64), "fmnist_cnn_wide": ((1, 28, 28), 32),
          "lenet": ((1, 28, 28), 32), "tcnn": ((3, 32, 32), 128), "vgg9": ((3, 32, 32), 64),
          "resnet18": ((3, 32, 32), 64)}


def seconds(name: str, layout: torch.memory_format, batches: int, device: torch.device) -> tuple[float, float]:
    """(training, evaluation) seconds of model `name` with its weights in `layout`."""
    shape, size = MODELS[name]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batches * size, *shape, generator=gen).to(device)
    y = torch.randint(0, 10, (batches * size,), generator=gen).to(device)
    torch.manual_seed(0)
    model = lay_out(build_model(name, shape, 10).to(device), layout)
    trained = train(model, x, y, size, device)
    model.eval()
    with torch.inference_mode():
        start = time.perf_counter()
        model(x)
        sync(device)
    return trained, time.perf_counter() - start


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, size: int, device: torch.device) -> float:
    """Seconds of one pass of SGD with momentum over (x, y) in batches of `size`; dropout is seeded,
    so two models compared draw the same masks."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(1)
    sync(device)
    start = time.perf_counter()
    for xb, yb in zip(x.split(size), y.split(size), strict=True):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    sync(device)
    return time.perf_counter() - start


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--models", default="fmnist_cnn,fmnist_cnn_bn,fmnist_cnn_wide,lenet,tcnn")
    parser.add_argument("--smoke", action="store_true", help="fmnist_cnn, 2 batches, once, on the CPU: checks that "
                        "the bench runs")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.batches, args.repeat, args.models = "cpu", 2, 1, "fmnist_cnn"
    torch.set_num_threads(1)
    device = torch.device(args.device)
    print(f"device: {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu, 1 thread'}, "
          f"torch {torch.__version__}, {args.batches} training batches, best of {args.repeat}")
    for name in args.models.split(","):
        runs = {layout: [] for layout in (torch.contiguous_format, torch.channels_last)}
        for layout in runs:
            seconds(name, layout, 2, device)                              # warm: kernels, allocator
        for _ in range(args.repeat):
            for layout, times in runs.items():
                times.append(seconds(name, layout, args.batches, device))
        (train_c, eval_c), (train_l, eval_l) = ([min(t[i] for t in times) for i in (0, 1)] for times in runs.values())
        print(f"{name:<16} training contiguous {train_c:7.3f} s  channels_last {train_l:7.3f} s  "
              f"ratio {train_l / train_c:.2f}   evaluation {eval_c:6.3f} s -> {eval_l:6.3f} s  "
              f"ratio {eval_l / eval_c:.2f}", flush=True)


if __name__ == "__main__":
    main()
