"""Run the studies' sweeps (every studies/<study>/*.toml) on this machine, resumably.

    python studies/run.py [STUDY ...] [--plan] [--parallel N]   # default: every CPU study, in the order below
    python studies/run.py fedcme/gpu fedfm/gpu --parallel 12    # the GPU studies: 12 runs sharing the GPU

Before it starts it prints, per study, the points done, partly done and to do, and a time estimate
from the seconds per round recorded in the study's result files (or in its timing.json, kept from
the runs that made the committed results: on another machine, scale by its speed).
Points run seed by seed (every arm and grid value of seed 0 of every named study, then seed 1, ...),
one at a time or --parallel N at once (a node's cores, or processes sharing its GPU), so that an
interrupted study still holds complete pairs. Re-running the same command continues where it
stopped: a finished point is skipped, a partly done one resumes from its last checkpoint. SIGTERM or
SIGUSR1 (a SLURM time limit) reaches every running point, which checkpoints after its round; no new
point starts and the runner exits with 3 (run it again to continue). A point that fails is reported
and the rest go on; one that stopped on a NaN/Inf loss (train.on_nonfinite = 'stop') has diverged, a
result that is kept and not run again (the same seeds diverge again). Result files are then
compacted (hpcfl.metrics.compact, finished ones only) for committing. One lock file
(studies/.run.lock) keeps two runners from computing at once; `--plan` only prints.
"""
import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from hpcfl.config import read_job_file
from hpcfl.errors import ConfigError, ResultsError
from hpcfl.jobs import load_job
from hpcfl.metrics import compact, read_run
from hpcfl.sweep import points

HERE = Path(__file__).resolve().parent
STUDIES = ("fedcme", "fedfm", "fedka", "fedclassavg", "fedma", "precision")


def _progress(path: Path) -> tuple[int, str, list[float]]:
    """(rounds recorded, how the run ended, seconds per recorded round) of a result file, zeros if none.
    Ended: "completed"; "diverged" when it stopped on a client's NaN/Inf (train.on_nonfinite = 'stop'),
    a result (the same seeds diverge again); "" while it is still to run or to resume."""
    try:
        run = read_run(path, keys=["round/time_s", "client/nonfinite"])
    except ResultsError:
        return 0, "", []
    seconds = list(run.arrays.get("round/time_s", []))
    nonfinite = run.arrays.get("client/nonfinite", np.zeros((0, 0)))
    status = run.attrs.get("status")
    if status == "completed":
        return len(seconds), "completed", seconds
    diverged = status == "failed" and len(nonfinite) > 0 and np.nansum(nonfinite[-1]) > 0
    return len(seconds), "diverged" if diverged else "", seconds


def _points(folder: Path):
    """(sweep file, point index, config) of every point of the study, sweep file by sweep file, in seed order."""
    for job in sorted(folder.glob("*.toml")):
        by_seed = sorted(enumerate(points(read_job_file(job))),
                         key=lambda p: (int(next(o for o in p[1] if o.startswith("run.seed="))[9:]), p[0]))
        for index, overrides in by_seed:
            yield job, index, load_job(job, overrides, allow_sweep=True)


def plan(folder: Path) -> tuple[list[tuple[Path, int, Path, int]], dict, dict]:
    """The study's points to run, in `_points` order, as (seed, sweep file, index, result path, rounds left),
    its summary, and each sweep file's median seconds per round (measured now, or as timing.json kept
    it, so that a fresh run of the study still gets an estimate). Reads only. Relative results_root are
    relative to the repository."""
    todo, count, done, diverged, partial, seconds = [], 0, 0, 0, 0, {}
    timing_file = folder / "timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.exists() else {}
    for job, index, config in _points(folder):
        path = folder.parent.parent / config.result_path
        rounds, ended, spent = _progress(path)
        count += 1
        seconds.setdefault(job.name, []).extend(spent)
        if ended:
            done += 1
            diverged += ended == "diverged"
            continue
        partial += rounds > 0
        todo.append((config.run.seed, job, index, path, config.run.rounds - rounds))
    timing.update({name: round(float(np.median(s)), 2) for name, s in seconds.items() if s})
    left = {}
    for _, job, _, _, rounds in todo:
        left[job.name] = left.get(job.name, 0) + rounds
    hours = (None if any(name not in timing for name in left)
             else sum(rounds * timing[name] for name, rounds in left.items()) / 3600)
    return todo, {"points": count, "done": done, "diverged": diverged, "partial": partial,
                  "rounds_left": sum(left.values()),
                  "hours": hours}, timing


def record(folder: Path) -> None:
    """After running: compact the study's finished result files (what gets committed: exact lengths,
    gzip) and keep its seconds per round in timing.json."""
    for _, _, config in _points(folder):
        path = folder.parent.parent / config.result_path
        if path.exists():
            compact(path)
    timing = plan(folder)[2]
    if timing:
        (folder / "timing.json").write_text(json.dumps(timing, indent=1, sort_keys=True) + "\n")


def execute(tasks: list[tuple[str, list[str]]], parallel: int, cwd: Path, env: dict) -> int:
    """Run the (label, command) tasks in order, up to `parallel` at once; a task that fails is reported
    and the others go on (a diverging configuration must not hold up the rest). 0 when all finished;
    3 when a stop signal came (passed on to the running points, which checkpoint; none starts after
    it); else the first failure's exit code."""
    running, stopped, code = {}, [], 0

    def stop(signum, _frame):
        stopped.append(signum)
        for proc in running.values():
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        queue = list(tasks)
        while queue or running:
            while queue and len(running) < parallel and not stopped:
                label, command = queue.pop(0)
                print(f"studies: {label}", flush=True)
                proc = subprocess.Popen(command, cwd=cwd, env=env)
                running[proc.pid] = proc
            if not running:
                break
            pid, status = os.wait()
            proc = running.pop(pid, None)
            if proc is None:
                continue
            exit_code = os.waitstatus_to_exitcode(status)
            proc.returncode = exit_code
            # 3: checkpointed; or stopped while starting
            if exit_code and not (stopped and exit_code in (3, -stopped[0])):
                sys.stderr.write(f"studies: {' '.join(proc.args[-3:])} failed with exit code {exit_code}\n")
                code = code or exit_code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code or (3 if stopped else 0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("studies", nargs="*", default=list(STUDIES), help=f"any of {', '.join(STUDIES)}")
    parser.add_argument("--plan", action="store_true", help="print what is left and the estimate, run nothing")
    parser.add_argument("--parallel", type=int, default=1, metavar="N", help="points computed at once (default 1)")
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
    for study, (_, s, _) in plans.items():
        eta = ("unknown until a round of each sweep file is measured" if s["hours"] is None
               else f"about {s['hours']:.1f} hours")
        total += s["hours"] or 0.0
        ended = f" ({s['diverged']} diverged: final, a result)" if s["diverged"] else ""
        print(f"{study:12} {s['done']}/{s['points']} points done{ended}, {s['partial']} partly, {s['rounds_left']} "
              f"rounds left: {eta}")
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
        todo = sorted(((seed, order, study, job, index, path, left)
                       for order, study in enumerate(plans) for seed, job, index, path, left in plans[study][0]),
                      key=lambda task: task[:2])                  # seed by seed across the studies
        tasks = [(f"{study} {job.name} point {index} ({path.name}, {left} rounds left)",
                  [sys.executable, "-m", "hpcfl.sweep", str(job), "--index", str(index)])
                 for _, _, study, job, index, path, left in todo]
        code = execute(tasks, max(1, args.parallel), repository, env)
        for study in plans:
            record(args.root / study)
    return code


if __name__ == "__main__":
    sys.exit(main())
