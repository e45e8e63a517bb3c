"""The set-up walk: how a reader travels from the launcher to the first round.

Runs a one-round job (the quickstart template on the digits set) under a tracer from
`hpcfl.launch.main` to `hpcfl.runtime.loop.run` and follows hpcfl's functions in the order they
first run, each read once (a later call is known already; comprehensions and lambdas belong to the
function they are in; module and class bodies, and what they call as a module is imported, are
imports, not steps). It counts

- functions read, and files entered (distinct);
- entries: moves into another file by a call; climbs: returns to the function being read in
  another file (the nearest on the stack the reader read, not a known one passed through);
- re-entries: entries into a file read before (a reader opening it again).

    python tools/setup_walk.py              # the counts and the most re-entered files
    python tools/setup_walk.py --path       # also every function in reading order
    python tools/setup_walk.py --glance 3   # a reader who takes functions of <= 3 lines in from the call

Issue 41 asked for at most 10 re-entries, counted by hand. The count depends on the reader: on the
tree the issue was filed against (5cf46d3^), `--glance 3` gives 30 files and 27 re-entries against
the hand count's 28 and 29, the default 35 and 45. Compare commits with this script and one setting.
"""
import argparse
import contextlib
import io
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEW_LOCALS = 0x02       # code.co_flags of a function (not of a module or class body)


def _importing(frame, package: str) -> bool:
    """Whether `frame` runs inside the import of one of hpcfl's modules (its code, or what it calls)."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_code.co_filename.startswith(package):
            return True
        frame = frame.f_back
    return False


def lines(code) -> int:
    """A function's length in lines, from its `def` to its last line."""
    return max(line for *_, line in code.co_lines() if line) - code.co_firstlineno + 1


def trace(run, root: Path, stop: tuple[str, str], glance: int = 0) -> list[tuple[str, str, str]]:
    """("call", file, function) at each function's first run and ("climb", file, "") when the reader
    returns to a function in another file, while `run()` runs, until the function `stop` (file,
    name) starts. The reader returns to the nearest function on the stack they read: a known
    function they did not open again is no place to climb back to. A function of at most `glance`
    lines the reader takes in from its call and does not open."""
    package, steps, seen, reading, done = str(root / "hpcfl"), [], set(), set(), [False]

    def reader_at(frame):
        while frame is not None and id(frame) not in reading:
            frame = frame.f_back
        return frame

    def tracer(frame, event, arg):
        code, name = frame.f_code, frame.f_code.co_filename
        if done[0] or not name.startswith(package):
            return None
        where = str(Path(name).relative_to(root))
        if event == "call":
            if (where, code.co_name) == stop:
                done[0] = True
                return None
            if not code.co_flags & NEW_LOCALS or code in seen or _importing(frame.f_back, package):
                return None
            seen.add(code)
            if not code.co_name.startswith("<") and lines(code) > glance:
                reading.add(id(frame))
                steps.append(("call", where, code.co_name))
        elif event == "return" and id(frame) in reading:
            reading.discard(id(frame))
            back = reader_at(frame.f_back)
            if back is not None and back.f_code.co_filename != name:
                steps.append(("climb", str(Path(back.f_code.co_filename).relative_to(root)), ""))
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return steps


def trace_setup(root: Path, glance: int = 0) -> list[tuple[str, str, str]]:
    """The walk (trace) from the launcher, on a one-round job, until the round loop starts."""
    sys.path.insert(0, str(root))
    import hpcfl.launch
    template = root / "hpcfl" / "templates" / "jobs" / "quickstart.toml"
    with tempfile.TemporaryDirectory() as results, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        return trace(lambda: hpcfl.launch.main([str(template), "--results-root", results,
                                                 "--set", "run.rounds=1", "--set", "data.dataset='digits'"]),
                     root, ("hpcfl/runtime/loop.py", "run"), glance)


def walk(steps) -> dict:
    """The counts of a traced walk (module docstring)."""
    current, read, entries, climbs, again = None, set(), 0, 0, Counter()
    for kind, where, _ in steps:
        if where == current:
            continue
        if kind == "call":
            again.update([where] if where in read else [])
            read.add(where)
            entries += 1
        else:
            climbs += 1
        current = where
    return {"functions": sum(kind == "call" for kind, *_ in steps), "files": len(read), "entries": entries,
            "climbs": climbs, "re-entries": sum(again.values()), "most re-entered": again.most_common(8)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="store_true", help="print every function in reading order")
    parser.add_argument("--glance", type=int, default=0, metavar="LINES",
                        help="take functions of at most LINES lines in at a glance: not read, not counted")
    args = parser.parse_args(argv)
    steps = trace_setup(ROOT, args.glance)
    counts = walk(steps)
    print(", ".join(f"{k} {v}" for k, v in counts.items() if k != "most re-entered"))
    print("most re-entered: " + ", ".join(f"{f} ({n})" for f, n in counts["most re-entered"]))
    if args.path:
        print("\n".join(f"{where}: {name}" for kind, where, name in steps if kind == "call"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
