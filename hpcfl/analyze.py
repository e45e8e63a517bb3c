"""The papers' tables and figures from result files, without writing a script:

    python -m hpcfl.analyze table RESULTS... [--metric round/test_acc] [--by KEY ...] [--last 10]
                                                         [--format md|csv|latex]
    python -m hpcfl.analyze compare RESULTS... --baseline algorithm.name=fedavg [--stat final|last|best_val|rounds]
                                                         [--rounds R | --max-bytes B: at equal rounds or bytes]
                                                         [--stat selected --select-on METRIC [--select min|max]]
    python -m hpcfl.analyze target RESULTS... --target 0.8 [--baseline algorithm.name=fedavg]
    python -m hpcfl.analyze personal RESULTS...          personalised accuracy across clients (data.local_test_ratio
                                                         > 0 runs)
    python -m hpcfl.analyze forgetting RESULTS...        forgetting degree per class and per class role (dominant,
                                                         non-dominant, missing: FedKA obs. 1; eval.forgetting runs)
    python -m hpcfl.analyze time RESULTS...              seconds per phase, compute vs wait, MB per payload
    python -m hpcfl.analyze curves RESULTS... --out FIG.png [--x round|bytes] [--metric ...]
    python -m hpcfl.analyze partition RUN.h5 --out FIG.png
    python -m hpcfl.analyze export RESULTS... --out DIR [--to tensorboard|mlflow|wandb]
                                                         replay result files into a tracker, offline

`hpcfl analyze ...` is the same command. RESULTS are result files or folders (searched recursively; a
file named twice is read once). Runs are grouped by `--by` config keys (default: every key whose value
differs between runs, seeds and keys that cannot change the numbers aside) and aggregated over seeds,
and a key that still differs within a group is named on stderr; e.g.
`table --metric final/feature_nmi` is FedFM's Table IV.
`table` gives the final value, the mean of the last k evaluations (lastK; all of them in a run that
evaluated fewer) and, for runs with data.validation_fraction > 0, the value at the best-validation
round (never the best test value): mean ± std over the completed runs (no ± for one run), and the
runs a figure is over where some completed runs lack it (best_val_n).
`compare` pairs each run with the baseline run of the same seeds and other keys, and gives the paired
effect with its 95 % interval, over seeds and (where the files record per-example bits) the test set's
examples, and a verdict (better / worse / inconclusive; hpcfl.analysis.paired, hpcfl.analysis.noise).
`--select-on METRIC [--select min|max]` (table, and compare's --stat selected) reads the metric at the
round where METRIC is lowest or highest: a paper's own rule, e.g. FedClassAvg's authors' lowest mean
client test loss, which selects on test data and is never the default.
`target`'s speed-up is each group's over the baseline group that shares its other keys.
Unfinished runs are counted, enter no figure and are listed (`time`'s seconds read every run's committed
rounds, finished or not; its MB per run, the completed runs'); unreadable files are named on stderr, not
fatal. A command whose figures no run recorded (a --metric, personal's or forgetting's) exits 2.
"""
import argparse
import sys
from pathlib import Path

from hpcfl.analysis import load, render, rounds_to_target, summary
from hpcfl.analysis.export import TARGETS, VIEW, export
from hpcfl.analysis.noise import NEEDS as NOISE_NEEDS
from hpcfl.analysis.paired import compare
from hpcfl.analysis.plots import curves, partition_heatmap
from hpcfl.analysis.results import completed, mixed_keys, truncate, varying_keys
from hpcfl.analysis.tables import SELECTION, STATISTICS, forgetting, on_test_data, personalised, time_and_bytes
from hpcfl.errors import Exit, ResultsError, exit_help
from hpcfl.metrics import read_run

# what each command reads: (dataset names, name prefixes); None: the --metric
NEEDS = {"table": (None, ()), "compare": (None, ()), "target": (None, ()), "curves": (None, ("round/bytes_",)),
         "personal": (("round/personal_acc_mean", "round/personal_acc_std"), ()),
         "forgetting": (("client_class/forgetting", "partition"), ()),
         "time": ((), ("round/phase_s/", "rank/", "round/bytes_"))}
COMMANDS = (*NEEDS, "partition", "export")      # every subcommand, in the order --help lists them
# what a command's figures cannot do without, and the job setting that records it; table, compare and
# target need their --metric
RECORDED_BY = {"personal": ("round/personal_acc_mean", "data.local_test_ratio > 0"),
               "forgetting": ("client_class/forgetting", "eval.forgetting = true")}


def _positive(kind):
    """An argparse type: a number of `kind` above 0."""
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text}: must be above 0")
        return value
    parse.__name__ = kind.__name__          # argparse names the type in its "invalid int value" message
    return parse


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, epilog=exit_help(Exit.DONE, Exit.BAD_INPUT),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in NEEDS:
        sub = commands.add_parser(name)
        sub.add_argument("results", nargs="+")
        sub.add_argument("--by", nargs="+", default=None, help="config keys to group by, e.g. algorithm.name")
        sub.add_argument("--metric", default="round/test_acc")
        sub.add_argument("--format", choices=["md", "csv", "latex"], default="md")
        if name in ("table", "compare"):
            sub.add_argument("--last", type=_positive(int), default=10,
                             help="the last-k mean over this many evaluations")
            sub.add_argument("--select-on", default=None, metavar="METRIC",
                             help="the selected figure: the metric at the round where METRIC (a client/... one: its "
                             "cohort mean) is lowest or highest, e.g. client/local_test_loss for FedClassAvg's "
                             "authors' rule; a metric of test data (round/test_acc, round/personal_acc_mean, ...) "
                             "selects on test data, which flatters")
            sub.add_argument("--select", choices=["min", "max"], default=None,
                             help="with --select-on: the lowest or highest (default: min for a loss, else max)")
        if name in ("table", "compare", "target"):
            sub.add_argument("--rounds", type=_positive(int), default=None,
                             help="read every run's first R rounds only (equal rounds for runs of different lengths)")
            sub.add_argument("--max-bytes", type=_positive(float), default=None,
                             help="read every run's rounds up to this many bytes exchanged, both directions (equal "
                             "communication)")
        if name == "compare":
            sub.add_argument("--baseline", required=True,
                             help="KEY=VALUE of the reference arm, e.g. algorithm.name=fedavg")
            sub.add_argument("--stat", choices=STATISTICS, default="final",
                             help="each run's figure (rounds: needs --target; selected: --select-on)")
            sub.add_argument("--target", type=float, default=None,
                             help="with --stat rounds: rounds to reach this value")
        if name == "target":
            sub.add_argument("--target", type=float, required=True, help="rounds to reach this value of --metric")
            sub.add_argument("--baseline", default=None, help="KEY=VALUE of the reference group for the speed-up")
        if name == "forgetting":
            sub.add_argument("--gamma", type=float, default=None, help="a class is dominant for a client holding at "
                             "least this share of it (FedKA Definition 1; default 1 / classes)")
        if name == "curves":
            sub.add_argument("--out", required=True, help="figure file (.png, .svg, .pdf)")
            sub.add_argument("--x", choices=["round", "bytes"], default="round")
    partition = commands.add_parser("partition")
    partition.add_argument("run")
    partition.add_argument("--out", required=True)
    export = commands.add_parser("export", help="replay result files into an offline experiment tracker")
    export.add_argument("results", nargs="+")
    export.add_argument("--to", choices=TARGETS, default="tensorboard")
    export.add_argument("--out", required=True, help="the folder to write (one sub-folder per run)")
    return parser


def _selection(args) -> tuple[str, str] | None:
    """(metric, "min" | "max") of --select-on / --select, the rule of the `selected` figure; None if not asked."""
    on = getattr(args, "select_on", None)
    if on is None:
        return None
    if on_test_data(on):
        sys.stderr.write(f"hpcfl: note: the selected round is chosen on {on}, a metric of test data: selection on "
                         "test data (as FedClassAvg's authors did), optimistic; hpcfl's default is best_val\n")
    return on, args.select or ("min" if on.endswith("loss") else "max")


def _export(args) -> int:
    try:
        written, problems = export(args.results, Path(args.out), args.to)
    except (ResultsError, OSError) as err:
        sys.stderr.write(f"hpcfl: error: {err}\n")
        return 2
    for problem in problems:
        sys.stderr.write(f"hpcfl: skipped: {problem}\n")
    if not written:
        sys.stderr.write(f"hpcfl: error: no result file to export in {' '.join(args.results)}\n")
        return 2
    print(f"hpcfl: {len(written)} run(s) written under {args.out}; then: {VIEW[args.to].format(out=args.out)}")
    return 0


def _partition(args) -> int:
    try:
        run = read_run(args.run, keys=["partition"])
        if "partition" not in run.arrays:
            raise ResultsError(f"{args.run} records no partition (the client x class counts)")
        print(partition_heatmap(run.arrays["partition"], args.out, title=str(run.attrs.get("run", ""))))
    except (ResultsError, ValueError, OSError) as err:
        sys.stderr.write(f"hpcfl: error: {err}\n")
        return 2
    return 0


def _results(args, select: tuple[str, str] | None):
    """The result files the command reads (only the metrics it needs, and `select`'s), cut to --rounds /
    --max-bytes; None, having said why, when none is readable."""
    names, prefixes = NEEDS[args.command]
    rounds, max_bytes = getattr(args, "rounds", None), getattr(args, "max_bytes", None)
    reads = (args.metric, SELECTION[0], *NOISE_NEEDS, *(select[:1] if select else ()))
    results = load(args.results, metrics=reads if names is None else names,
                   prefixes=(*prefixes, "round/bytes_") if max_bytes is not None else prefixes)
    for problem in results.problems:
        sys.stderr.write(f"hpcfl: skipped: {problem}\n")
    if results.runs.empty:
        sys.stderr.write("hpcfl: error: no readable result files\n")
        return None
    for _, run in results.incomplete.iterrows():
        # a file says "running" whether its run is alive or was killed: only its lock (hpcfl status) tells
        status = ("running, or was killed (`hpcfl status` tells which)" if run["status"] == "running"
                  else run["status"])
        sys.stderr.write(f"hpcfl: note: {run['path']} is {status}: {run['rounds']} rounds committed\n")
    if rounds is not None:
        _note_shorter(results.runs, rounds)
    if rounds is not None or max_bytes is not None:
        results = truncate(results, rounds, max_bytes)
    return results


def _note_shorter(runs, rounds: int) -> None:
    """Say which completed runs ran fewer than --rounds rounds: they are read whole, so the figures are
    not at equal rounds as asked."""
    short = runs[completed(runs) & (runs["rounds"] < rounds)]
    if len(short):
        sys.stderr.write(f"hpcfl: note: --rounds {rounds} is more than {len(short)} completed run(s) ran (the "
                         f"shortest: {short['rounds'].min()} rounds): they are read whole, not at equal rounds\n")


def _unrecorded(args, series: dict) -> str | None:
    """Why the command would print blanks: the dataset its figures read (RECORDED_BY; table, compare and
    target: --metric) is recorded in none of the runs. None when some run has it."""
    if args.command in RECORDED_BY:
        needed, setting = RECORDED_BY[args.command]
        what, why = f"{needed}, which {args.command} reads,", f"runs record it with {setting}"
    elif args.command in ("table", "compare", "target"):
        needed = args.metric
        what, why = f"--metric {needed}", "a typo? the names are in docs/reference/result-files.md"
    else:
        return None
    recorded = any(needed in run for run in series.values())
    return None if recorded else f"{what} is recorded in none of these runs ({why})"


def main(argv=None, prog: str = "python -m hpcfl.analyze") -> int:
    args = _parser(prog).parse_args(argv)
    if args.command in ("export", "partition"):                 # file by file, no tables
        return _export(args) if args.command == "export" else _partition(args)
    select = _selection(args)
    results = _results(args, select)
    if results is None:
        return 2
    unrecorded = _unrecorded(args, results.series)
    if unrecorded:
        sys.stderr.write(f"hpcfl: error: {unrecorded}\n")
        return 2
    by = args.by or varying_keys(results.runs)
    missing = [k for k in by if k not in results.runs.columns]
    if missing:
        sys.stderr.write(f"hpcfl: error: --by {missing} are not config keys of these runs\n")
        return 2
    mixed = [] if args.command == "compare" else mixed_keys(results.runs, by)     # compare names its own
    if mixed:
        sys.stderr.write(f"hpcfl: note: the runs of a group also differ in {mixed}: its figures are over their "
                         "values together; add them to --by to tell them apart\n")
    if args.command == "curves":
        try:
            print(curves(results, by, args.out, args.metric, args.x))
        except (ValueError, OSError) as err:
            sys.stderr.write(f"hpcfl: error: {err}\n")
            return 2
        return 0
    if args.command in ("compare", "target") and args.baseline and "=" not in args.baseline:
        sys.stderr.write(f"hpcfl: error: --baseline {args.baseline!r} is not KEY=VALUE, e.g. algorithm.name=fedavg\n")
        return 2
    try:
        if args.command == "compare":
            table, unpaired = compare(results, dict([args.baseline.split("=", 1)]), args.stat, args.metric, args.last,
                                      args.target, args.by, select)
            for path in unpaired:
                sys.stderr.write(f"hpcfl: note: {path} has no partner run (same seeds and keys) in the other arm\n")
            if table.attrs["also_differ"]:
                sys.stderr.write(f"hpcfl: note: the arms also differ in {table.attrs['also_differ']} (each the same "
                                 "within an arm): the effects are of each arm with its values, not of "
                                 f"{args.baseline.split('=')[0]} alone\n")
            sys.stdout.write(render(table, args.format))
            return 0
        table = {"table": lambda: summary(results, by, args.metric, args.last, select),
                 "target": lambda: rounds_to_target(results, args.target, by,
                                                    dict([args.baseline.split("=", 1)]) if args.baseline else None,
                                                    args.metric),
                 "personal": lambda: personalised(results, by),
                 "forgetting": lambda: forgetting(results, by, args.gamma),
                 "time": lambda: time_and_bytes(results, by)}[args.command]()
    except ValueError as err:
        sys.stderr.write(f"hpcfl: error: {err}\n")
        return 2
    sys.stdout.write(render(table, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
