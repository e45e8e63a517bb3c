"""Run the studies' sweeps (every studies/<study>/*.toml) on this machine, one point after another, resumably.

    python studies/run.py [STUDY ...] [--plan]      # default: every study, in the order below

Before it starts it prints, per study, the points done, partly done and to do, and a time estimate
from the seconds per round recorded in the study's result files (or in its timing.json, kept from
the runs that made the committed results: on another machine, scale by its speed).
Points run seed by seed (every arm and grid value of seed 0, then seed 1, ...), so that an
interrupted study still holds complete pairs. Re-running the same command continues where it
stopped: a finished point is skipped, a partly done one resumes from its last checkpoint. Finished
result files are compacted (hpcfl.metrics.compact) for committing. One lock
file (studies/.run.lock) keeps two runners from computing at once; `--plan` only prints.
"""
import argparse
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from hpcfl.config import load_job, read_job_file
from hpcfl.errors import ConfigError, ResultsError
from hpcfl.metrics import compact, read_run
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


def plan(folder: Path) -> tuple[list[tuple[Path, int, Path, int]], dict]:
    """The study's points to run, sweep file by sweep file and in seed order, as (sweep file, index,
    result path, rounds left), and its summary. Relative results_root are relative to the repository.
    Each sweep file's median seconds per round, once measured, is kept in the study's timing.json, so
    a fresh run of the study (its results moved away) still gets an estimate."""
    todo, count, done, partial, hours = [], 0, 0, 0, 0.0
    timing_file = folder / "timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.exists() else {}
    for job in sorted(folder.glob("*.toml")):
        by_seed = sorted(enumerate(points(read_job_file(job))),
                         key=lambda p: (int(next(o for o in p[1] if o.startswith("run.seed="))[9:]), p[0]))
        count += len(by_seed)
        seconds, left = [], 0
        for index, overrides in by_seed:
            config = load_job(job, overrides, allow_sweep=True)
            path = folder.parent.parent / config.result_path
            rounds, completed, spent = _progress(path)
            seconds += spent
            if completed:
                compact(path)                                 # what gets committed: exact lengths, gzip
                done += 1
                continue
            partial += rounds > 0
            todo.append((job, index, path, config.run.rounds - rounds))
            left += config.run.rounds - rounds
        if seconds:
            timing[job.name] = round(float(np.median(seconds)), 2)
        hours = None if hours is None or (left and job.name not in timing) else hours + left * timing.get(job.name, 0) / 3600
    if timing:
        timing_file.write_text(json.dumps(timing, indent=1, sort_keys=True) + "\n")
    return todo, {"points": count, "done": done, "partial": partial,
                  "rounds_left": sum(t[3] for t in todo), "hours": hours}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="*", default=list(STUDIES), help=f"any of {', '.join(STUDIES)}")
    parser.add_argument("--plan", action="store_true", help="print what is left and the estimate, run nothing")
    parser.add_argument("--root", type=Path, default=HERE, help=argparse.SUPPRESS)      # the studies' folder (tests)
    args = parser.parse_args(argv)
    unknown = [s for s in args.studies if not (args.root / s).is_dir()]
    if unknown:
        parser.error(f"no study {unknown}; the studies: {', '.join(STUDIES)}")
    try:
        plans = {study: plan(args.root / study) for study in args.studies}
    except ConfigError as err:
        sys.stderr.write(f"studies: error: {err}\n")
        return 2
    total = 0.0
    for study, (_, s) in plans.items():
        eta = ("unknown until a round of each sweep file is measured" if s["hours"] is None
               else f"about {s['hours']:.1f} hours")
        total += s["hours"] or 0.0
        print(f"{study:12} {s['done']}/{s['points']} points done, {s['partial']} partly, {s['rounds_left']} rounds "
              f"left: {eta}")
    print(f"in all about {total:.1f} hours on one core of this machine (the seconds per round measured here), "
          "for the studies with an estimate")
    if args.plan:
        return 0
    repository = args.root.parent
    with open(args.root / ".run.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"studies: another runner holds {args.root / '.run.lock'}; wait for it or stop it\n")
            return 1
        # the hpcfl of this checkout (a worktree at the study's commit), one thread per point
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(repository), os.environ.get("PYTHONPATH")]))}
        for study, (todo, _) in plans.items():
            for job, index, path, rounds_left in todo:
                print(f"studies: {study} {job.name} point {index} ({path.name}, {rounds_left} rounds left)", flush=True)
                code = subprocess.call([sys.executable, "-m", "hpcfl.sweep", str(job), "--index", str(index)],
                                       cwd=repository, env=env)
                if code:
                    sys.stderr.write(f"studies: {study} point {index} failed with exit code {code}; stopping\n")
                    return code
            plan(args.root / study)                           # compacts the new results, records the timing
    return 0


if __name__ == "__main__":
    sys.exit(main())
