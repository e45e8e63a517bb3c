"""Strong scaling: the same job on W = 1, 2, 4, ... worker ranks (`mpirun -np W+1`, rank 0 the server).

Per W, from the result file (medians over the rounds after the first, which warms up):
- time per round (`round/time_s`), speed-up T(1) / T(W) and parallel efficiency speed-up / W
  (against the smallest W run when 1 is not in the list, scaled by its W);
- the split of a round: the workers' mean compute (`rank/compute_s`, ranks >= 1: local training and
  summing the uplink), imbalance (`round/imbalance_s`: slowest worker minus the mean, also as a
  share of the round), the
  server's compute (rank 0: downlink, aggregate, test evaluation) and the rest, communication +
  waiting + bookkeeping (round - server compute - slowest worker), next to `rank/wait_s`.

Then a model of the round time for sizing a job, fitted to these runs:

    T_round(W) ~ L(W) * t_client + t_comm(W) + t_server

t_client: the workers' compute per sampled client; t_server: the server's compute; t_comm(W) =
a + b * log2(W + 1) (tree collectives of this job's model bytes), fitted to the measured rest
(with fewer than 3 W: b * log2(W + 1), b >= 0).
L(W): the busiest worker's load, in the cohort's mean clients: K / W at best (K =
train.clients_per_round), more since clients differ in size, cannot be split, and (fixed placement)
live on one worker while cohorts are drawn at random. Estimated by drawing cohorts over the job's
own partition and placing them with hpcfl's placement code (run.placement). The model is printed
with its predictions for W up to K.

Each run is wrapped in `flock /tmp/hpcfl-bench.lock` (benchmarks on a shared machine do not overlap)
and writes to a temporary folder.

    python bench/scaling.py [--job jobs/quickstart.toml] [--workers 1,2] [--rounds 4] [--set KEY=VALUE ...]
    python bench/scaling.py --smoke       # W = 1, 2 rounds on `digits`: checks that the bench runs (CI)
"""
import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcfl.algorithms import ALGORITHMS
from hpcfl.jobs import load_job
from hpcfl.metrics import read_run
from hpcfl.runtime.placement import assign_clients, client_cost, deal_cohort, worker_ranks

REPO = Path(__file__).resolve().parent.parent
MPIRUN = str(Path(sys.executable).with_name("mpirun"))
LOCK = "/tmp/hpcfl-bench.lock"
DRAWS = 1000                        # cohorts drawn to estimate the busiest worker's load
KEYS = ["round/time_s", "round/imbalance_s", "rank/compute_s", "rank/wait_s", "round/bytes_down/model",
        "client/steps", "partition"]


@dataclass
class Point:
    """One W, medians per round."""

    workers: int
    round_s: float
    compute_mean: float     # workers' mean compute
    compute_max: float      # slowest worker's compute
    imbalance: float
    server: float           # rank 0's compute
    wait_mean: float        # workers' mean time blocked in collectives
    per_client: float       # workers' compute per sampled client
    rest: float             # communication, waiting, bookkeeping: round - server compute - slowest worker
    model_elements: int
    sizes: np.ndarray       # each client's training samples


def run_job(job: str, workers: int, rounds: int, overrides: list[str], root: Path) -> Path:
    """One locked `mpirun -np workers+1` of the job; its result file."""
    name = f"scaling-w{workers}"
    sets = sum((["--set", o] for o in [*overrides, f"run.rounds={rounds}", f"run.name='{name}'"]), [])
    cmd = ["flock", LOCK, MPIRUN, "-np", str(workers + 1), sys.executable, "-m", "hpcfl.launch", job,
           "--results-root", str(root), *sets]
    subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
    return load_job(job, [*overrides, f"run.results_root='{root}'", f"run.name='{name}'"]).result_path


def measure(result: Path, workers: int) -> Point:
    run = read_run(result, KEYS)
    a = {k: v[1:] if run.rounds > 1 else v for k, v in run.arrays.items()}     # round 0 warms up
    compute, workers_compute = a["rank/compute_s"], a["rank/compute_s"][:, 1:]
    sampled = np.isfinite(a["client/steps"]).sum(axis=1)
    elements = int(run.arrays["round/bytes_down/model"][0] / 4 / sampled[0])
    rest = a["round/time_s"] - compute[:, 0] - workers_compute.max(axis=1)

    def med(values) -> float:
        return float(np.median(values))

    return Point(workers, med(a["round/time_s"]), med(workers_compute.mean(axis=1)), med(workers_compute.max(axis=1)),
                 med(a["round/imbalance_s"]), med(compute[:, 0]), med(a["rank/wait_s"][:, 1:].mean(axis=1)),
                 med(workers_compute.sum(axis=1) / sampled), med(rest), elements, run.arrays["partition"].sum(1))


def busiest_load(sizes: np.ndarray, per_round: int, workers: int, batch: int, dealt: bool, seed: int = 0) -> float:
    """The busiest worker's expected load in the cohort's mean clients (batches per epoch), cohorts
    uniform, placed as the runner does: dealt per round, or each client on its fixed home."""
    rng = np.random.default_rng(seed)
    cost, ranks = client_cost(sizes, batch), worker_ranks(workers + 1)
    home = assign_clients(sizes, ranks)
    loads = []
    for _ in range(DRAWS):
        cohort = rng.choice(len(sizes), size=per_round, replace=False).tolist()
        hosts = deal_cohort(cohort, cost, ranks) if dealt else {c: home[c] for c in cohort}
        per_worker = np.bincount([hosts[c] for c in cohort], weights=cost[cohort], minlength=workers + 1)
        loads.append(per_worker.max() / cost[cohort].mean())
    return float(np.mean(loads))


def fit_comm(points: list[Point]) -> tuple[float, float]:
    """(a, b) of rest ~ a + b * log2(W + 1), least squares from 3 or more W; from fewer, a = 0 and
    b >= 0 (two points would fit their noise exactly)."""
    x = np.log2([p.workers + 1 for p in points])
    y = np.array([p.rest for p in points])
    if len(points) >= 3:
        b, a = np.polyfit(x, y, 1)
        return float(a), float(b)
    return 0.0, max(0.0, float(x @ y / (x @ x)))


def print_measured(points: list[Point]) -> None:
    base = points[0]
    print(f"\n{'W':>3} {'s/round':>8} {'speed-up':>9} {'efficiency':>10} | {'compute':>8} {'imbalance':>9} "
          f"{'of round':>8} {'server':>7} {'comm+wait':>9} | {'worker wait':>11} {'s/client':>9}")
    for p in points:
        speedup = base.round_s / p.round_s * base.workers
        print(f"{p.workers:>3} {p.round_s:>8.2f} {speedup:>9.2f} {speedup / p.workers:>10.0%} | {p.compute_mean:>8.2f} "
              f"{p.imbalance:>9.2f} {p.imbalance / p.round_s:>8.1%} {p.server:>7.2f} {p.rest:>9.2f} | "
              f"{p.wait_mean:>11.2f} {p.per_client:>9.3f}")
    print("(seconds per round, medians; compute = workers' mean; comm+wait = round - server - slowest worker)")


def print_model(points: list[Point], per_round: int, batch: int, dealt: bool) -> None:
    t_client = float(np.median([p.per_client for p in points]))
    t_server = float(np.median([p.server for p in points]))
    a, b = fit_comm(points)
    elements = points[0].model_elements
    print(f"\nModel: T_round(W) ~ L(W) * {t_client:.3f} s + ({a:.3f} + {b:.3f} * log2(W+1)) s + {t_server:.3f} s")
    print(f"  t_client {t_client:.3f} s per sampled client; t_server {t_server:.3f} s; t_comm fitted for a model of "
          f"{elements:,} elements ({4 * elements / 1e6:.2f} MB down as float32, {8 * (elements + 1) / 1e6:.2f} MB up "
          "as float64, per worker and payload)")
    measured = {p.workers: p.round_s for p in points}
    single = t_client * per_round + a + b + t_server
    print(f"\n{'W':>4} {'K/W':>6} {'L(W)':>6} {'model s/round':>14} {'measured':>9} {'model efficiency':>17}")
    for w in sorted({*measured, *(2 ** i for i in range(per_round.bit_length() + 1) if 2 ** i <= per_round)}):
        load = busiest_load(points[0].sizes, per_round, w, batch, dealt)
        model = load * t_client + a + b * np.log2(w + 1) + t_server
        seen = f"{measured[w]:>9.2f}" if w in measured else f"{'':>9}"
        print(f"{w:>4} {per_round / w:>6.2f} {load:>6.2f} {model:>14.2f} {seen} {single / model / w:>17.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default=str(REPO / "jobs" / "quickstart.toml"))
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts, e.g. 1,2,4,8")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--smoke", action="store_true", help="W = 1, 2 rounds on digits: checks that the bench runs")
    args = parser.parse_args()
    if args.smoke:
        args.workers, args.rounds, args.overrides = "1", 2, [*args.overrides, "data.dataset='digits'"]
    workers = sorted(int(w) for w in args.workers.split(","))
    cfg = load_job(args.job, args.overrides)
    print(f"{Path(args.job).name}: {cfg.algorithm.name}, {cfg.data.num_clients} clients, "
          f"K = {cfg.train.clients_per_round} per round, {args.rounds} rounds (round 1 left out), "
          f"workers {workers}, server on one more rank")
    with tempfile.TemporaryDirectory() as tmp:
        points = [measure(run_job(args.job, w, args.rounds, args.overrides, Path(tmp)), w) for w in workers]
    print_measured(points)
    dealt = ALGORITHMS[cfg.algorithm.name].moves_clients(cfg)
    print(f"placement: {'dealt per round' if dealt else 'fixed'}")
    print_model(points, cfg.train.clients_per_round, cfg.train.batch_size, dealt)


if __name__ == "__main__":
    main()
