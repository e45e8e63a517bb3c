"""How each run stands, read from its result file: `hpcfl status RESULTS... [--sweep JOB]`.

- complete: every round done;
- running: a writer holds the file (its lock was refreshed in the last STALE_S seconds, by the file
  system's clock, and its process, if on this node, is alive); a file it is writing that does not read
  back at that moment is running too;
- interrupted: stopped at a checkpoint, or killed (a file marked running whose lock went stale or
  whose process on this node is gone): run the same command again to resume;
- failed: a failure during training ended the run;
- unreadable: not a valid result file, or damaged: some part of it does not read back (the reason
  is printed; `hpcfl analyze` skips the same files);
- missing: with --sweep, a point of the sweep that has no result file yet;
- other config: with --sweep, a point whose result file is of another configuration (the keys are
  printed): its array task would refuse it.

With --sweep and no RESULTS, the sweep's own files are listed, not their folders'. It exits 2 when
any file is unreadable or of another configuration, so that a script checking a study stops there.
"""
import argparse
import sys
from collections import Counter
from pathlib import Path

from hpcfl.analysis.results import find_files
from hpcfl.errors import Exit, HpcflError, exit_help
from hpcfl.launch import run_overrides
from hpcfl.metrics import read_run
from hpcfl.runtime.lock import STALE_S, writing


def state(path: Path, expected=None) -> tuple[str, str, str]:
    """(state, rounds as 'committed/planned', why it is unreadable or of another configuration) of one
    result file, whose run should have the job `expected` if given (a sweep's point)."""
    try:
        run = read_run(path)              # all of it, as `hpcfl analyze` reads it: one verdict for both
    except HpcflError as err:             # a file its run is writing may be caught between two flushes
        return ("running", "", f"not readable while it is written: {err}") if writing(path) else (
            "unreadable", "", str(err))
    planned = run.attrs.get("config", {}).get("run", {}).get("rounds", "?")
    if expected is not None:
        from hpcfl.runtime.resume import mismatch  # a sweep's jobs have imported torch already

        if differ := mismatch(run.attrs.get("config", {}), expected):
            return "other config", f"{run.rounds}/{planned}", differ
    status = run.attrs.get("status", "running")
    if status == "running":
        status = "running" if writing(path) else "interrupted"
    return {"completed": "complete"}.get(status, status), f"{run.rounds}/{planned}", ""


def sweep_jobs(job: str, overrides: list[str]) -> dict[Path, object]:
    """Each point of the sweep in `job`, with the --set `overrides` it ran with: its result file -> its job."""
    from hpcfl.config import read_job_file
    from hpcfl.sweep import point_jobs, points

    return {config.result_path: config for config in point_jobs(job, overrides, points(read_job_file(job)))}


def main(argv=None, prog: str = "hpcfl status") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.replace("STALE_S seconds", f"{STALE_S:.0f} s"),
                                     epilog=exit_help(Exit.DONE, Exit.BAD_INPUT),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="*", help="result files, or folders searched for them")
    parser.add_argument("--sweep", metavar="JOB", help="a sweep's job file: also list its points with no file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="with --sweep: the overrides the sweep ran with")
    parser.add_argument("--results-root", default=None, help="with --sweep: the --results-root it ran with")
    args = parser.parse_args(argv)
    if (args.overrides or args.results_root) and not args.sweep:
        parser.error("--set and --results-root say where a sweep's points are: they need --sweep JOB")
    try:
        expected = sweep_jobs(args.sweep, run_overrides(args)) if args.sweep else {}
    except HpcflError as err:
        sys.stderr.write(f"hpcfl: error: {err}\n")
        return Exit.BAD_INPUT
    roots = [Path(r).resolve() for r in args.results]
    if roots and expected and not any(p.resolve().is_relative_to(r) for p in expected for r in roots):
        sys.stderr.write(f"hpcfl: note: the sweep's result files are looked for under {next(iter(expected)).parent}, "
                         f"not in {' '.join(args.results)}: a sweep run with --results-root needs the same "
                         "--results-root here\n")
    found = sorted(set(find_files(args.results or [path for path in expected if path.exists()])))
    jobs = {path.resolve(): config for path, config in expected.items()}
    rows = [(path, *state(path, jobs.get(path.resolve()))) for path in found if path.exists()]
    have = {path.resolve() for path in found if path.exists()}
    rows += [(path, "missing", "", "") for path in expected if path.resolve() not in have]
    if not rows:
        absent = [r for r in args.results if not Path(r).exists()]
        where = f" ({', '.join(absent)}: no such file or folder)" if absent else ""
        sys.stderr.write(f"hpcfl: error: no result files found{where}; name result files or folders (or --sweep JOB)\n")
        return Exit.BAD_INPUT
    for path, what, rounds, why in rows:
        print(f"{what:<12}{rounds:>9}  {path}" + (f"  ({why})" if why else ""))
    counts = Counter(what for _, what, _, _ in rows)
    print(", ".join(f"{n} {what}" for what, n in sorted(counts.items())))
    return Exit.BAD_INPUT if counts["unreadable"] or counts["other config"] else Exit.DONE
