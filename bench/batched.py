"""Each method's local training with a worker's sampled clients one after another against together
(train.batched_clients), through the launcher, on one device.

Each case runs the same job once per path and repeat, the paths' order rotating between repeats:
sequential (batched_clients = 0), batched (a worker's whole share of the cohort) and, on a GPU, batched
with each step a CUDA graph (train.cuda_graphs) and sequential under bf16 autocast (train.precision).
From the result files: the training phases' seconds per round (round 1 left out: kernels, the CUDA
context and the graphs' capture warm up there), each path's speed-up over sequential (> 1 is a gain)
and the largest difference between its test accuracies and sequential's (batched and graphs agree with
it to float rounding, so theirs is the drift rounding gives; bf16's is the precision's effect).
The cases are the quickstart's FedAvg and the seed papers' methods on it, FedClassAvg on its three
widths, and FedFM's own regime: ResNet-18 with the ImageNet stem on CIFAR-shaped synthetic images (10
clients x 5,000 images of 32 x 32 x 3, batch 64, E = 1), whose seconds per round project FedFM's 100
rounds at E = 10. Writes batched.md (the table) and batched.json into --out.

    python bench/batched.py --device cuda --out OUT [--cases fedavg,fedcme] [--rounds 3] [--repeat 2]
    python bench/batched.py --smoke --out OUT        # two rounds of two tiny cases on the CPU (CI runs it)
"""
import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hpcfl.data.base import Dataset
from hpcfl.launch import main as launch
from hpcfl.metrics import read_run

QUICKSTART = "jobs/quickstart.toml"
HETEROGENEOUS = ["model.architectures=['fmnist_cnn_narrow','fmnist_cnn','fmnist_cnn_wide']",
                 "model.params={preactivation=true}", "data.local_test_ratio=0.3",
                 "data.partition='dirichlet_equal'", "data.partition_params={beta=0.5,size=1000}"]
CASES = {
    "fedavg": [],
    "fedfm-cg": ["algorithm.name='fedfm'", "algorithm.params.start_round=1"],
    "fedcme": ["algorithm.name='fedcme'", "train.local_epochs=2"],
    "fedka": ["algorithm.name='fedka'"],
    "fedclassavg": ["algorithm.name='fedclassavg'", *HETEROGENEOUS],
    "moon": ["algorithm.name='moon'"],
    "scaffold": ["algorithm.name='scaffold'"],
    "resnet18-fedfm": ["algorithm.name='fedfm'", "algorithm.params.start_round=1",
                       "data.dataset='batched:cifar_shaped'",          # this file, a data-set plug-in
                       "model.name='resnet18'", "model.params={stem='imagenet'}", "data.num_clients=10",
                       "train.clients_per_round=10", "train.batch_size=64", "train.local_epochs=1",
                       "data.partition='iid'", "data.partition_params={}"],
}
SMOKE = {"fedavg": ["data.dataset='digits'"], "fedcme": ["algorithm.name='fedcme'", "data.dataset='digits'",
                                                          "train.local_epochs=2"]}


def cifar_shaped(root) -> Dataset:
    """50,000 + 1,000 random 32 x 32 x 3 images of 10 classes, generated (a timing set: nothing to learn)."""
    generator = torch.Generator().manual_seed(0)
    draw = lambda n: (torch.randn(n, 3, 32, 32, generator=generator),                        # noqa: E731
                      torch.randint(0, 10, (n,), generator=generator))
    (train_x, train_y), (test_x, test_y) = draw(50_000), draw(1_000)
    return Dataset("cifar_shaped", train_x, train_y, test_x, test_y, 10)


def run(sets: list[str], root: Path, name: str) -> dict:
    """One run of the quickstart job with `sets`; its result file's arrays."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = launch([QUICKSTART, "--results-root", str(root), "--set", f"run.name='{name}'",
                       *[a for s in sets for a in ("--set", s)]])
    if code:
        raise SystemExit(f"bench: the run {name} with {sets} exited with {code}")
    return read_run(next(root.rglob(f"{name}.h5"))).arrays


def train_seconds(arrays: dict) -> list[float]:
    """Seconds in training phases per round, round 1 left out."""
    phases = [k for k in arrays if k.startswith("round/phase_s/") and not k.endswith("/anchors")]
    return list(np.sum([arrays[k] for k in phases], axis=0)[1:])


def paths(device: str) -> dict[str, list[str]]:
    """The compared paths, each a list of --set overrides: on a GPU also CUDA graphs and bf16."""
    together = "train.batched_clients=" + ("'auto'" if device == "cuda" else "1000")
    out = {"sequential": ["train.batched_clients=0"], "batched": [together]}
    if device == "cuda":
        out.update(graphs=[together, "train.cuda_graphs=true"],
                   bf16=["train.batched_clients=0", "train.precision='bf16'"])
    return out


def measure(case: str, sets: list[str], device: str, rounds: int, repeat: int, root: Path) -> dict:
    common = [*sets, f"run.device='{device}'", f"run.rounds={rounds}", "run.checkpoint_every=0"]
    compared = paths(device)
    seconds, drift = {p: [] for p in compared}, dict.fromkeys(compared, 0.0)
    for r in range(repeat):
        order = list(compared)[r % len(compared):] + list(compared)[:r % len(compared)]
        got = {p: run([*common, *compared[p]], root, f"{case}-{p}-{r}") for p in order}
        for p in compared:
            seconds[p] += train_seconds(got[p])
            if "round/test_acc" in got[p]:
                gap = np.abs(got[p]["round/test_acc"] - got["sequential"]["round/test_acc"])
                drift[p] = max(drift[p], float(np.nanmax(gap)))
    median = {p: statistics.median(seconds[p]) for p in compared}
    return {"case": case, **{f"{p}_s": median[p] for p in compared},
            **{f"{p}_speedup": median["sequential"] / median[p] for p in compared if p != "sequential"},
            **{f"{p}_drift": drift[p] for p in compared if p != "sequential"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", required=True, help="folder for batched.md and batched.json")
    parser.add_argument("--smoke", action="store_true", help="two tiny cases, two rounds, on the CPU")
    args = parser.parse_args()
    cases = SMOKE if args.smoke else {c: CASES[c] for c in args.cases.split(",")}
    device, rounds, repeat = ("cpu", 2, 1) if args.smoke else (args.device, args.rounds, args.repeat)
    if device == "cpu":
        torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, began = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for case, sets in cases.items():
            rows.append(measure(case, sets, device, rounds, repeat, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU, 1 thread"
    others = [p for p in paths(device) if p != "sequential"]
    lines = [f"device: {name}; {rounds} rounds x {repeat} repeats; {time.perf_counter() - began:.0f} s; s/round "
             "of training, speed-up over sequential, and the largest test-accuracy difference from it", "",
             "| case | sequential s | " + " | ".join(f"{p} s | {p} speed-up | {p} drift" for p in others) + " |",
             "|---|---|" + "---|---|---|" * len(others)]
    lines += [f"| {r['case']} | {r['sequential_s']:.3f} | " + " | ".join(
        f"{r[p + '_s']:.3f} | {r[p + '_speedup']:.2f}x | {r[p + '_drift']:.4f}" for p in others) + " |" for r in rows]
    fedfm = next((r for r in rows if r["case"] == "resnet18-fedfm"), None)
    if fedfm:           # FedFM's regime: 100 rounds of E = 10 epochs, from rounds of one epoch
        lines.append("\nFedFM's regime (100 rounds, E = 10) projected from resnet18-fedfm: "
                     + ", ".join(f"{100 * 10 * fedfm[p + '_s'] / 60:.1f} GPU-minutes {p}" for p in paths(device)))
    (out / "batched.md").write_text("\n".join(lines) + "\n")
    (out / "batched.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
