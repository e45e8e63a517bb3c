"""The CPU-sized FedMA study (jobs/fedma/fmnist-cpu.toml: real Fashion-MNIST, Dir(0.5), 10 clients,
all of them every round): FedMA with communication against FedAvg and FedProx (mu = 0.001, the paper's
best) given the same number of bytes exchanged, as the paper's Figure 2 compares them. FedMA runs
first; the baselines then get as many rounds as it takes them to move as many bytes.

    python bench/fedma_study.py [--seeds 0 1 2] [--parallel 2] [--root results]
"""
import math
from pathlib import Path

import numpy as np
from runs import launch, run_all, study_parser

from hpcfl.config import load_job
from hpcfl.models import build_model, count_parameters

JOB = Path(__file__).resolve().parent.parent / "jobs" / "fedma" / "fmnist-cpu.toml"
BASELINES = {"FedAvg": ['algorithm.name="fedavg"', 'algorithm.params={init = "independent"}'],   # no shared init, as FedMA (App. A)
             "FedProx": ['algorithm.name="fedprox"', 'algorithm.params={mu = 0.001, init = "independent"}']}


def total_bytes(arrays: dict) -> float:
    """Everything sent and received over the run (every payload, both directions)."""
    return float(sum(np.nansum(v) for k, v in arrays.items() if k.startswith(("round/bytes_down/", "round/bytes_up/"))))


def main() -> None:
    args = study_parser(__doc__).parse_args()
    fedma = run_all([("FedMA", seed) for seed in args.seeds],
                    lambda label, seed: launch(JOB, args.root, f"FedMA-seed{seed}", f"run.seed={seed}"), args.parallel)
    config = load_job(JOB, [])
    params = count_parameters(build_model(config.model.name, (1, 28, 28), 10))
    per_round = 4 * (2 * params + 1) * config.train.clients_per_round      # model down; model and weight up
    rounds = math.ceil(max(total_bytes(r) for r in fedma.values()) / per_round)
    results = {**fedma, **run_all([(label, seed) for label in BASELINES for seed in args.seeds],
                                  lambda label, seed: launch(JOB, args.root, f"{label}-seed{seed}", f"run.seed={seed}",
                                                             f"run.rounds={rounds}", *BASELINES[label]), args.parallel)}
    print("| method | rounds | MB exchanged (mean) | final test accuracy (mean ± std) | per seed | global params / local |")
    print("|---|---|---|---|---|---|")
    for label in ["FedMA", *BASELINES]:
        runs = [results[(label, seed)] for seed in args.seeds]
        final = np.array([r["round/test_acc"][-1] for r in runs])
        growth = np.mean([r["round/growth_rate"][-1] for r in runs]) if label == "FedMA" else 1.0
        print(f"| {label} | {len(runs[0]['round/test_acc'])} | {np.mean([total_bytes(r) for r in runs]) / 1e6:.1f} | "
              f"{final.mean():.4f} ± {final.std():.4f} | {', '.join(f'{a:.4f}' for a in final)} | {growth:.2f} |")
    match = {k.split("/")[-1]: np.mean([np.median(r[k]) for r in fedma.values()])
             for k in next(iter(fedma.values())) if k.startswith("round/match_s/")}
    print("FedMA server matching s per layer (median over rounds): " +
          ", ".join(f"{k} {v:.3f}" for k, v in match.items()))


if __name__ == "__main__":
    main()
