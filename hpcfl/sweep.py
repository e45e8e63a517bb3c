"""Sweeps: one job file, arms times a grid over any config keys times seeds, one run (and result file) per point.

    [sweep]
    seeds = [0, 1, 2]                                       # run.seed, innermost
    grid = { "data.partition_params.beta" = [0.1, 0.5] }    # every combination of these values

    [sweep.arms.FedAvg]                                     # optional: the compared methods, outermost; each
    "algorithm.name" = "fedavg"                             # sets its keys together and run.arm = its name
    [sweep.arms.FedProx]
    "algorithm.name" = "fedprox"
    "algorithm.params" = { mu = 0.01 }

expands, arms first, grid keys in the order written and seeds last, into points 0..N-1; point i is the
job with those keys set, run.seed set, and run.name = `<run.name or "sweep">-<arm>-<value>-<value>-seed<seed>`
(so every point writes its own result file, and a re-submitted sweep skips the points already
complete). Arms share seeds, so `analyze compare --baseline run.arm=FedAvg` pairs them:

    hpcfl sweep JOB --list                       # every point checked, and listed with its index
    [mpiexec] hpcfl sweep JOB [--index I] [run options]
                                                 # run point I (default $SLURM_ARRAY_TASK_ID)
    hpcfl sweep JOB --submit [--max-concurrent K] [run options] [-- sbatch options]
                                                 # the points not complete as one SLURM job array (more,
                                                 # where they outnumber the cluster's MaxArraySize)

(`python -m hpcfl.sweep` is the same command.)
"""
import argparse
import contextlib
import hashlib
import io
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from hpcfl.config import read_job_file, toml_string
from hpcfl.errors import ConfigError, Exit, HpcflError, exit_help

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    """A table's key as TOML reads it back as one key: bare where it can be, else quoted (a plug-in's
    "pkg.mod:Term" written bare would be dotted keys, or no TOML at all)."""
    return key if BARE_KEY.fullmatch(key) else toml_string(key)


def toml_value(value) -> str:
    """A value in the TOML syntax --set takes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"sweep value {value!r} has no TOML form")


def _label(value) -> str:
    text = value if isinstance(value, str) else toml_value(value)
    return "".join(ch if ch.isalnum() or ch in ".+-_" else "_" for ch in text)


def _arms(sweep: dict, grid: dict) -> dict[str, dict]:
    arms = sweep.get("arms", {"": {}})
    if not isinstance(arms, dict) or not arms or not all(isinstance(a, dict) for a in arms.values()):
        raise ConfigError("sweep.arms must be tables of config keys, "
                          'e.g. [sweep.arms.FedAvg] "algorithm.name" = "fedavg"')
    for label, keys in arms.items():
        tables = [key for key in keys if "." not in key]
        if tables:
            raise ConfigError(f"sweep.arms.{label} sets {tables[0]!r}, a whole table: an arm sets config keys, which "
                              f"TOML reads as one key only quoted, e.g. \"algorithm.name\" = \"fedprox\" (unquoted, "
                              "algorithm.name = ... would replace the job's whole [algorithm] table)")
        if label != _label(label) or "run.arm" in keys:
            raise ConfigError(f"sweep.arms.{label}: an arm's name is made of letters, digits and .+-_ and sets run.arm "
                              "itself")
        if set(keys) & set(grid):
            raise ConfigError(f"sweep.arms.{label} sets {sorted(set(keys) & set(grid))}, which sweep.grid varies too; "
                              "set each key in one place")
    return arms


def points(raw: dict) -> list[list[str]]:
    """The sweep's points, each as the --set overrides that make it."""
    sweep = raw.get("sweep")
    if not isinstance(sweep, dict) or set(sweep) - {"grid", "seeds", "arms"}:
        raise ConfigError("[sweep] must be a table with `grid` (a table: config key -> list of values), `seeds` (a "
                          "list of integers) and/or `arms` (tables: arm name -> config keys it sets)")
    grid, seeds = sweep.get("grid", {}), sweep.get("seeds", [raw.get("run", {}).get("seed", 0)])
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError("sweep.grid must map each config key to a non-empty list of values, "
                          "e.g. { \"train.lr\" = [0.01, 0.1] }")
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise ConfigError(f"sweep.seeds must be a non-empty list of integers, got {seeds!r}")
    arms = _arms(sweep, grid)
    _check_swept_keys(grid, arms)
    base = raw.get("run", {}).get("name") or "sweep"
    out = []
    for (arm, keys), *values in itertools.product(arms.items(), *grid.values(), seeds):
        *chosen, seed = values
        name = "-".join([base, *([arm] if arm else []), *(_label(v) for v in chosen), f"seed{seed}"])
        sets = {**keys, **({"run.arm": arm} if arm else {}), **dict(zip(grid, chosen, strict=True))}
        out.append([*(f"{k}={toml_value(v)}" for k, v in sets.items()), f"run.seed={seed}",
                    f"run.name={toml_string(name)}"])
    files = [tuple(o for o in point if o.startswith(("run.name=", "run.study=", "run.results_root=")))
             for point in out]
    twins = sorted({file for file in files if files.count(file) > 1})
    if twins:
        raise ConfigError(f"sweep points share a result file ({' '.join(twins[0])}): a seed or grid value is listed "
                          "twice, or two values read alike in a run name; list each once")
    return out


def _check_swept_keys(grid: dict, arms: dict[str, dict]) -> None:
    """Keys a sweep may not vary: run.seed and run.name, which every point sets itself (sweep.seeds, the
    point's name), and in the grid a key that cannot change a number (NON_RESULT_KEYS: the analysis
    would pool its values as seeds of one group); vary one of those in arms, which run.arm keeps apart."""
    from hpcfl.config import NON_RESULT_KEYS

    own = sorted({"run.seed", "run.name"} & {*grid, *(k for keys in arms.values() for k in keys)})
    if own:
        raise ConfigError(f"the sweep varies {own[0]}, which it sets on every point itself: list seeds in "
                          "sweep.seeds, and the name comes from run.name, the arm and the values")
    pooled = sorted(set(grid) & set(NON_RESULT_KEYS))
    if pooled:
        raise ConfigError(f"sweep.grid varies {pooled[0]}, which cannot change a run's numbers, so the analysis "
                          "would pool its values as more seeds of one group: vary it in sweep.arms (each arm's "
                          "run.arm keeps them apart)")


def swept_keys(todo: list[list[str]]) -> set[str]:
    """The config keys the sweep sets on its points."""
    return {override.partition("=")[0] for point in todo for override in point}


def main(argv=None, prog: str = "python -m hpcfl.sweep") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, epilog=exit_help(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--list", action="store_true", help="check every point as its run will (keys, values, "
                                                           "plug-ins) and print them with their indices")
    parser.add_argument("--index", type=int, default=None, help="the point to run (default: $SLURM_ARRAY_TASK_ID "
                                                                "+ --index-base)")
    parser.add_argument("--index-base", type=int, default=0, metavar="B",
                        help="an array task runs point B + $SLURM_ARRAY_TASK_ID (--submit adds it to the arrays after "
                             "the first where the points outnumber the cluster's MaxArraySize)")
    parser.add_argument("--submit", action="store_true",
                        help="submit the points not complete as one SLURM job array (sbatch)")
    parser.add_argument("--max-concurrent", type=int, default=0, metavar="K",
                        help="with --submit: at most K points of each job array run at once (--array=...%%K)")
    parser.add_argument("--script", default=None, help="with --submit: the batch script (default: sweep.sbatch in "
                                                       "$HPCFL_SLURM, else ./slurm, else the one hpcfl ships)")
    parser.add_argument("--job-digest", default=None, help="the job file's digest when the array was submitted "
                                                           "(--submit adds it): a task refuses a file edited since")
    args, launch_args = parser.parse_known_args(argv[:split])
    from hpcfl.launch import run_overrides

    try:
        todo = points(read_job_file(args.job))
        options = _check_run_options(args.job, launch_args, swept_keys(todo))
        if args.submit or args.list:
            jobs = point_jobs(args.job, run_overrides(options), todo)
    except HpcflError as err:
        sys.stderr.write(f"hpcfl: error: {err}\n")
        return Exit.BAD_INPUT
    if args.list:
        for i, overrides in enumerate(todo):
            print(f"{i}\t{' '.join(overrides)}")
        return Exit.DONE
    if args.submit:
        return submit(args, [i for i, job in enumerate(jobs) if not _complete(job)], len(todo), launch_args,
                      argv[split + 1:])
    if args.job_digest not in (None, digest(args.job)):
        sys.stderr.write(f"hpcfl: error: {args.job} changed since the sweep was submitted: its points may have "
                         "moved, and array task i runs point i of the file as it is now. Re-submit the sweep (its "
                         "complete points are skipped)\n")
        return Exit.BAD_INPUT
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    index = args.index if args.index is not None else None if task is None else args.index_base + int(task)
    if index is None or not 0 <= index < len(todo):
        sys.stderr.write(f"hpcfl: error: pick a point 0..{len(todo) - 1} with --index (or run as a SLURM array task); "
                         f"--list shows them\n")
        return Exit.BAD_INPUT
    from hpcfl.launch import main as launch

    return launch([args.job, *launch_args, *(a for o in todo[index] for a in ("--set", o))], allow_sweep=True,
                  prog=prog)                  # the point's keys last, as point_jobs resolves them


def point_jobs(job: str, overrides: list[str], todo: list[list[str]]) -> list:
    """Every point resolved as its array task will resolve it (hpcfl.jobs.prepare), so that a bad key or
    value is refused before sbatch, not in each task after its wait in the queue; their jobs."""
    from hpcfl.jobs import prepare

    jobs = []
    for i, point in enumerate(todo):
        try:
            jobs.append(prepare(job, [*overrides, *point], allow_sweep=True).config)
        except HpcflError as err:
            raise ConfigError(f"point {i} ({point[-1]}): {err}") from None
    return jobs


def _complete(job) -> bool:
    """Whether a point's result file is complete, and of its configuration: its task would exit 0 at once,
    after its wait in the queue, on a node allocated for nothing. (One of another configuration is
    submitted: its task says so, exit 2.)"""
    from hpcfl.status import state

    return job.result_path.exists() and state(job.result_path, job)[0] == "complete"


def array_spec(indices: list[int]) -> str:
    """SLURM's --array list for `indices` (increasing): runs of consecutive ones as ranges, 0-3,5,7-9."""
    runs, start = [], None
    for i, index in enumerate(indices):
        start = index if start is None else start
        if i + 1 == len(indices) or indices[i + 1] != index + 1:
            runs.append(str(start) if start == index else f"{start}-{index}")
            start = None
    return ",".join(runs)


def max_array_size() -> int:
    """The cluster's MaxArraySize (`scontrol show config`): an array task's id is below it. SLURM's
    default, 1001, where scontrol cannot tell."""
    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        shown = ""
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", shown, re.MULTILINE)
    return int(found.group(1)) if found else 1001


def arrays(indices: list[int], size: int) -> list[tuple[int, list[int]]]:
    """The points `indices` (increasing) as job arrays (base, task ids), every task id below `size`
    (MaxArraySize): task t of an array runs point base + t. One array with base 0 where all fit."""
    out = []
    for index in indices:
        if not out or index - out[-1][0] >= size:
            out.append((0 if not out and index < size else index, []))
        out[-1][1].append(index - out[-1][0])
    return out


def _check_run_options(job: str, launch_args: list[str], swept: set[str]) -> argparse.Namespace:
    """The run options every point gets, checked here and not in each array task after its wait in the
    queue: options `hpcfl run` takes (sbatch's go after `--`), and no --set (or --results-root) of a key
    the sweep sets on its points (run.name or run.seed would send every point to one result file; the
    task reads the option last, the other commands the point)."""
    from hpcfl.launch import parser

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            options = parser().parse_args([job, *launch_args])
    except SystemExit:                    # argparse's own words, without its usage block
        why = said.getvalue().strip().splitlines()[-1].partition("error: ")[2]
        raise ConfigError(f"{shlex.join(launch_args)}: not options of a run (hpcfl run --help); sbatch's go after "
                          f"`--` (argparse: {why})") from None
    given = {**{o.partition("=")[0]: f"--set {o.partition('=')[0]}" for o in options.overrides},
             **({"run.results_root": "--results-root (run.results_root)"} if options.results_root else {})}
    clash = sorted(key for key in given
                   if any(key == s or s.startswith(key + ".") or key.startswith(s + ".") for s in swept))
    if clash:
        raise ConfigError(f"{given[clash[0]]}: the sweep sets it on each point, or a key inside it, or the table "
                          "holding it (a point's run.name, run.seed, its arm's and grid's keys); change it in the "
                          "job's [sweep] table")
    return options


def digest(job: str) -> str:
    """The job file's content, hashed: what --job-digest compares."""
    return hashlib.sha256(Path(job).read_bytes()).hexdigest()[:16]


def default_script() -> Path:
    """sweep.sbatch in $HPCFL_SLURM, else in ./slurm (an edited copy, `hpcfl init`), else the packaged one."""
    from hpcfl.init import TEMPLATES

    if os.environ.get("HPCFL_SLURM"):
        return Path(os.environ["HPCFL_SLURM"]) / "sweep.sbatch"
    here = Path("slurm") / "sweep.sbatch"
    return here if here.is_file() else TEMPLATES / "slurm" / "sweep.sbatch"


def submit(args, indices: list[int], count: int, launch_args: list[str], sbatch_args: list[str]) -> int:
    """`sbatch --array=INDICES[%K] [sbatch options] SCRIPT JOB --job-digest D [run options]`, printed,
    then run: the `indices` of the `count` points not complete yet; as several arrays, the later with
    --index-base, where the indices reach the cluster's MaxArraySize (`arrays`)."""
    script = Path(args.script) if args.script else default_script()
    if not script.is_file():
        sys.stderr.write(f"hpcfl: error: batch script {script} does not exist: pass --script PATH (hpcfl's "
                         "slurm/sweep.sbatch) or set $HPCFL_SLURM to the folder holding it\n")
        return Exit.BAD_INPUT
    if args.max_concurrent < 0:
        sys.stderr.write(f"hpcfl: error: --max-concurrent {args.max_concurrent} must be >= 1 (0: no limit)\n")
        return Exit.BAD_INPUT
    done = f", {count - len(indices)} complete" if len(indices) < count else ""
    if not indices:
        print(f"hpcfl: {count} points{done}: nothing to submit")
        return Exit.DONE
    # where the script finds site.sh: beside the script as named (a link to hpcfl's own keeps this folder's)
    env = {**os.environ, "HPCFL_SLURM": str(script.absolute().parent)}
    parts, job_digest = arrays(indices, max_array_size()), digest(args.job)
    for n, (base, tasks) in enumerate(parts, 1):
        array = f"--array={array_spec(tasks)}" + (f"%{args.max_concurrent}" if args.max_concurrent else "")
        command = ["sbatch", array, *sbatch_args, str(script), args.job, "--job-digest", job_digest,
                   *(["--index-base", str(base)] if base else []), *launch_args]
        part = f" (array {n} of {len(parts)})" if len(parts) > 1 else ""
        print(f"hpcfl: {count} points{done}{part}: {shlex.join(command)}", flush=True)
        try:
            status = subprocess.run(command, env=env).returncode
        except FileNotFoundError:
            sys.stderr.write("hpcfl: error: sbatch is not on PATH: submit from a SLURM login node\n")
            return Exit.BAD_INPUT
        if status:
            return status
    return Exit.DONE


if __name__ == "__main__":
    sys.exit(main())
