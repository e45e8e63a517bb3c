"""Checkpoint cost and preemption turnaround.

1. Size and write time of a checkpoint with 100 clients holding per-client state (SCAFFOLD's control
   variates) on real Fashion-MNIST, in one process and on 3 ranks (one file per rank).
2. With `--slurm DIR` (root, Debian's SLURM installed): on a single-node cluster started under DIR,
   the time from USR1 to the batch shell until the run has checkpointed and asked to be requeued,
   and until the requeued job resumes training.

    python bench/checkpoint.py [--clients 100] [--slurm /tmp/hpcfl-slurm]
    python bench/checkpoint.py --smoke    # 10 clients on `digits`, one process: checks that the bench runs (CI)
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MPIRUN = str(Path(sys.executable).with_name("mpirun"))
JOB = REPO / "jobs" / "quickstart.toml"


def checkpoint_cost(clients: int, ranks: int, root: Path, *extra: str) -> tuple[float, float]:
    """(checkpoint MiB, median write seconds) of a SCAFFOLD run checkpointing every round."""
    cmd = [sys.executable, "-m", "hpcfl.launch", str(JOB), "--results-root", str(root),
           *(arg for o in extra for arg in ("--set", o)),
           "--set", "algorithm.name=scaffold", "--set", f"data.num_clients={clients}",
           "--set", "train.clients_per_round=10", "--set", "run.rounds=4",
           "--set", "run.checkpoint_every=1", "--set", "run.checkpoint_keep=5", "--set", f"run.name='ck{ranks}'"]
    # stop after round 3 so that the checkpoints stay on disk (a completed run removes them)
    proc = subprocess.Popen([MPIRUN, "-np", str(ranks), *cmd] if ranks > 1 else cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seconds = []
    for line in proc.stdout:
        found = re.search(r" INFO checkpoint after round (\d+) written in ([\d.]+) s", line)
        if found:
            seconds.append(float(found.group(2)))
        if " INFO round    2/" in line:
            proc.send_signal(signal.SIGUSR1)
    proc.wait()
    folder = sorted((root / "quickstart" / f"ck{ranks}.ckpt").glob("round-*"))[-1]
    size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
    return size, sorted(seconds)[len(seconds) // 2]


def _wait_for(log: Path, text: str) -> None:
    while not (log.exists() and text in log.read_text()):
        time.sleep(0.05)


def requeue_turnaround(state: Path) -> tuple[float, float]:
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf"), "HPCFL_SLURM": str(REPO / "slurm"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run([REPO / "slurm" / "local-cluster.sh", "start", state], check=True)
    try:
        out = state / "bench-%j.out"
        jid = subprocess.run(["sbatch", "--parsable", "-n", "3", "-o", str(out), str(REPO / "slurm" / "hpcfl.sbatch"),
                              str(JOB), "--results-root", str(state / "results"), "--set", "run.rounds=30",
                              "--set", "data.dataset='digits'", "--set", "run.name='requeue'"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
        log = Path(str(out).replace("%j", jid))
        _wait_for(log, "round    2/")
        start = time.perf_counter()
        subprocess.run(["scancel", "--batch", "--signal=USR1", jid], env=env, check=True)
        _wait_for(log, "requeueing job")
        requeued = time.perf_counter() - start
        _wait_for(log, "resuming after round")
        return requeued, time.perf_counter() - start
    finally:
        subprocess.run(["scancel", jid], env=env)
        subprocess.run([REPO / "slurm" / "local-cluster.sh", "stop", state])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--slurm", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="10 clients on digits, one process: checks that the "
                        "bench runs")
    args = parser.parse_args()
    clients, every, extra = (10, (1,), ["data.dataset='digits'"]) if args.smoke else (args.clients, (1, 3), [])
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in every:
            size, seconds = checkpoint_cost(clients, ranks, Path(tmp), *extra)
            print(f"SCAFFOLD, {clients} clients, {ranks} rank(s): checkpoint {size:.1f} MiB, "
                  f"written in {seconds:.3f} s (median)")
    if args.slurm:
        requeued, resumed = requeue_turnaround(args.slurm)
        print(f"SLURM: USR1 -> checkpointed and requeue asked {requeued:.1f} s; -> training again {resumed:.1f} s")


if __name__ == "__main__":
    main()
