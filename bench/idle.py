"""Idle ranks: the CPU a rank uses while it waits in hpcfl's collectives, under the real runner.

Each rank runs `hpcfl.launch` unchanged, with MpiTransport's two waiting points wrapped to record,
per call, the round, the wall seconds and the process CPU seconds (time.process_time: every thread
of the process, MPICH's and torch's included):
- `poll`: `_wait`, the sleep-polled non-blocking barrier (or point-to-point requests) where a rank
  waits for its peers, e.g. the server through a round's training;
- `move`: `_timed`, the blocking MPI call after the barrier, which moves the data. MPICH spins in
  it, so its CPU % is high, but it is short: every rank is already there.
CPU % of a core = CPU seconds / wall seconds over the calls. The server's rows cover its waits; a
worker's are split by whether it hosted a sampled client in that round (read from the result file:
`client/rank`), since a worker without one waits through the whole round. Set-up
waits (before round 1) are listed apart. The target is under 5 % while waiting; a row is flagged
only from 1 s of waiting (a 1 ms wait is all fixed cost).

Scenarios (real Fashion-MNIST, quickstart job, one torch thread per rank):
- `-np 3`: server + 2 workers, 10 of 20 clients per round (every worker trains every round);
- `-np 4`: server + 3 workers, 2 of 20 clients per round (at least one worker idle every round).

Each run is wrapped in `flock /tmp/hpcfl-bench.lock` so benchmarks on a shared machine do not
overlap; results go to a temporary folder.

    python bench/idle.py [--rounds 3] [--scenario np3 np4]
    python bench/idle.py --smoke          # -np 3, 2 rounds on `digits`: checks that the bench runs (CI)
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "jobs" / "quickstart.toml"
MPIRUN = str(Path(sys.executable).with_name("mpirun"))
LOCK = "/tmp/hpcfl-bench.lock"
TARGET_PCT = 5.0
FLAG_AFTER_S = 1.0          # judge a row against the target from this much waiting
SCENARIOS = {"np3": (3, 10), "np4": (4, 2)}      # name: (ranks, clients per round)


# -- inside each rank ----------------------------------------------------------------------------
def _recording(method, calls: list):
    """`method` of MpiTransport, appending (round, wall s, CPU s) of every call to `calls`."""
    def wrapped(self, *args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return method(self, *args, **kwargs)
        finally:
            calls.append((self.round, time.perf_counter() - wall, time.process_time() - cpu))
    return wrapped


def rank_main(out: Path, launch_args: list[str]) -> int:
    """Run hpcfl.launch on this rank with its waits recorded; write them to out/rank-<R>.json."""
    from mpi4py import MPI

    from hpcfl.launch import main
    from hpcfl.transport.mpi import MpiTransport

    calls = {"poll": [], "move": []}
    MpiTransport._wait = _recording(MpiTransport._wait, calls["poll"])
    MpiTransport._timed = _recording(MpiTransport._timed, calls["move"])
    code = main(launch_args)
    (out / f"rank-{MPI.COMM_WORLD.Get_rank()}.json").write_text(json.dumps(calls))
    return code


# -- the driver ----------------------------------------------------------------------------------
def run_scenario(ranks: int, per_round: int, rounds: int, tmp: Path, *extra: str) -> tuple[dict, Path]:
    """One locked `mpirun` (`extra`: more --set overrides); (rank -> recorded calls, result file)."""
    out = tmp / f"np{ranks}"
    out.mkdir()
    name = f"idle-np{ranks}"
    cmd = ["flock", LOCK, MPIRUN, "-np", str(ranks), sys.executable, __file__, "--rank-out", str(out), "--",
           str(JOB), "--results-root", str(tmp), "--set", f"run.rounds={rounds}", "--set", f"run.name='{name}'",
           "--set", f"train.clients_per_round={per_round}", *(arg for o in extra for arg in ("--set", o))]
    subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
    calls = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    return calls, tmp / "quickstart" / f"{name}.h5"


def busy_ranks(result: Path) -> np.ndarray:
    """round x rank: whether the rank hosted a sampled client in that round."""
    from hpcfl.metrics import read_run

    ranks = read_run(result, ["client/rank"]).arrays["client/rank"]
    busy = np.zeros((len(ranks), int(np.nanmax(ranks)) + 1), dtype=bool)
    for round, row in enumerate(ranks):
        busy[round, row[np.isfinite(row)].astype(int)] = True
    return busy


def rows_of(rank: int, calls: dict, busy: np.ndarray) -> list[tuple[str, str, str, list]]:
    """(role, label, kind, [(round, wall, cpu)]) groups of one rank's calls."""
    def pick(kind, keep):
        return [c for c in calls[kind] if keep(c[0])]

    if rank == 0:
        groups = [("server", "server", lambda r: r >= 0)]
    else:
        groups = [("workers with sampled clients", f"worker {rank}, with sampled clients",
                   lambda r: r >= 0 and busy[r, rank]),
                  ("workers without", f"worker {rank}, no sampled client", lambda r: r >= 0 and not busy[r, rank])]
    groups.append(("set-up", f"rank {rank}, set-up", lambda r: r < 0))
    return [(role, label, kind, pick(kind, keep)) for role, label, keep in groups for kind in ("poll", "move")]


def percent(picked: list) -> tuple[float, float, float]:
    """(wall s, CPU s, CPU % of a core) summed over calls."""
    wall, cpu = sum(c[1] for c in picked), sum(c[2] for c in picked)
    return wall, cpu, 100 * cpu / wall if wall else 0.0


def print_table(title: str, calls: dict, busy: np.ndarray) -> None:
    print(f"\n{title}")
    print(f"{'who':<36} {'wait':<5} {'calls':>6} {'wall s':>8} {'CPU s':>8}  {'CPU % of a core':>16}")
    roles = {}
    for rank in sorted(calls):
        for role, label, kind, picked in rows_of(rank, calls[rank], busy):
            if not picked:
                continue
            wall, cpu, pct = percent(picked)
            over = kind == "poll" and wall >= FLAG_AFTER_S and pct >= TARGET_PCT
            print(f"{label:<36} {kind:<5} {len(picked):>6} {wall:>8.2f} {cpu:>8.3f} {pct:>15.1f}%"
                  + ("  over target" if over else ""))
            if kind == "poll" and role != "set-up":
                roles.setdefault(role, []).extend(picked)
    summary = [f"{role} {percent(picked)[2]:.1f} % ({percent(picked)[0]:.1f} s)" for role, picked in roles.items()]
    print("polled waiting in the rounds, CPU % of a core: " + ", ".join(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenario", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--smoke", action="store_true", help="-np 3, 2 rounds on digits: checks that the bench runs")
    parser.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)      # set on the ranks by the driver
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)        # the ranks' hpcfl.launch arguments follow "--"
    args, launch_args = parser.parse_args(argv[:split]), argv[split + 1:]
    if args.rank_out:
        sys.exit(rank_main(args.rank_out, launch_args))
    extra = []
    if args.smoke:
        args.scenario, args.rounds, extra = ["np3"], 2, ["data.dataset='digits'"]
    print(f"CPU time per rank while it waits in collectives (target < {TARGET_PCT:g} % of a core)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenario:
            ranks, per_round = SCENARIOS[name]
            calls, result = run_scenario(ranks, per_round, args.rounds, Path(tmp), *extra)
            print_table(f"mpirun -np {ranks}: {per_round} of 20 clients per round, {args.rounds} rounds",
                        calls, busy_ranks(result))


if __name__ == "__main__":
    main()
