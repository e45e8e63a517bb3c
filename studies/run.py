"""Run the studies' sweeps on this machine, one point after another, resumably.

    python studies/run.py [STUDY ...] [--plan]      # default: every study, in the order below

Before it starts it prints, per study, the points done, partly done and to do, and a time estimate
from the seconds per round this machine recorded in the study's result files (none yet: unknown).
Points run seed by seed (every arm and grid value of seed 0, then seed 1, ...), so that an
interrupted study still holds complete pairs. Re-running the same command continues where it
stopped: a finished point is skipped, a partly done one resumes from its last checkpoint. One lock
file (studies/.run.lock) keeps two runners from computing at once; `--plan` only prints.
"""
import argparse
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from hpcfl.config import load_job, read_job_file
from hpcfl.errors import ResultsError
from hpcfl.metrics import read_run
from hpcfl.sweep import points

HERE = Path(__file__).resolve().parent
STUDIES = ("fedcme", "fedfm", "fedka", "fedclassavg", "fedma")


def _progress(path: Path) -> tuple[int, bool, list[float]]:
    """(rounds recorded, completed, seconds per recorded round) of a result file, zeros if none."""
    try:
        run = read_run(path, keys=["round/time_s"])
    except ResultsError:
        return 0, False, []
    seconds = list(run.arrays.get("round/time_s", []))
    return len(seconds), run.attrs.get("status") == "completed", seconds


def plan(study: str) -> tuple[list[tuple[int, Path, int]], dict]:
    """The study's points to run, in seed order, as (index, result path, rounds left), and its summary."""
    job = HERE / study / "sweep.toml"
    todo, done, partial, seconds, left = [], 0, 0, [], 0
    by_seed = sorted(enumerate(points(read_job_file(job))),
                     key=lambda p: (int(next(o for o in p[1] if o.startswith("run.seed="))[9:]), p[0]))
    for index, overrides in by_seed:
        config = load_job(job, overrides, allow_sweep=True)
        path = HERE.parent / config.result_path          # results_root is relative to the repository
        rounds, completed, spent = _progress(path)
        seconds += spent
        if completed:
            done += 1
            continue
        partial += rounds > 0
        todo.append((index, path, config.run.rounds - rounds))
        left += config.run.rounds - rounds
    per_round = float(np.median(seconds)) if seconds else None
    return todo, {"points": len(by_seed), "done": done, "partial": partial, "rounds_left": left,
                  "hours": None if per_round is None else left * per_round / 3600}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="*", default=list(STUDIES), help=f"any of {', '.join(STUDIES)}")
    parser.add_argument("--plan", action="store_true", help="print what is left and the estimate, run nothing")
    args = parser.parse_args(argv)
    unknown = set(args.studies) - set(STUDIES)
    if unknown:
        parser.error(f"no study {sorted(unknown)}; the studies: {', '.join(STUDIES)}")
    plans = {study: plan(study) for study in args.studies}
    total = 0.0
    for study, (_, s) in plans.items():
        eta = "unknown until its first round" if s["hours"] is None else f"about {s['hours']:.1f} CPU-hours"
        total += s["hours"] or 0.0
        print(f"{study:12} {s['done']}/{s['points']} points done, {s['partial']} partly, {s['rounds_left']} rounds "
              f"left: {eta}")
    print(f"estimated: {total:.1f} hours on this machine (one point at a time) for the studies with results")
    if args.plan:
        return 0
    with open(HERE / ".run.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"studies: another runner holds {HERE / '.run.lock'}; wait for it or stop it\n")
            return 1
        # the hpcfl of this checkout (a worktree at the study's commit), one thread per point
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
        for study, (todo, _) in plans.items():
            for index, path, rounds_left in todo:
                print(f"studies: {study} point {index} ({path.name}, {rounds_left} rounds left)", flush=True)
                code = subprocess.call([sys.executable, "-m", "hpcfl.sweep", str(HERE / study / "sweep.toml"),
                                        "--index", str(index)], cwd=HERE.parent, env=env)
                if code:
                    sys.stderr.write(f"studies: {study} point {index} failed with exit code {code}; stopping\n")
                    return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
