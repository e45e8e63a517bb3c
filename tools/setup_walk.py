"""The set-up walk: how a reader travels from the launcher to the first round.

Runs a one-round job (the quickstart template on the digits set) under a tracer from
`hpcfl.launch.main` to `hpcfl.runtime.loop.run` and follows hpcfl's functions in the order they
first run, each read once (a later call is known already; comprehensions and lambdas belong to the
function they are in; module and class bodies, and what they call as a module is imported, are
imports, not steps). It counts

- functions read, and files entered (distinct);
- entries: moves into another file by a call; climbs: returns to a caller in another file;
- re-entries: entries into a file read before (a reader opening it again).

    python tools/setup_walk.py            # the counts and the most re-entered files
    python tools/setup_walk.py --path     # also every function in reading order

Issue 41 asked for at most 10 re-entries. The count depends on this definition (a reader who skips
small helpers counts fewer), so compare commits with this script, not with a hand count.
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


def trace_setup(root: Path) -> list[tuple[str, str, str]]:
    """("call", file, function) at each function's first run and ("climb", file, "") at each return to
    a caller in another file, from the launcher until the round loop starts."""
    sys.path.insert(0, str(root))
    import hpcfl.launch
    package, steps, seen, done = str(root / "hpcfl"), [], set(), [False]

    def tracer(frame, event, arg):
        code, name = frame.f_code, frame.f_code.co_filename
        if done[0] or not name.startswith(package):
            return None
        where = str(Path(name).relative_to(root))
        if event == "call":
            if code.co_name == "run" and where == "hpcfl/runtime/loop.py":
                done[0] = True
                return None
            if not code.co_flags & NEW_LOCALS or code in seen or _importing(frame.f_back, package):
                return None
            if not code.co_name.startswith("<"):
                seen.add(code)
                steps.append(("call", where, code.co_name))
        elif event == "return" and frame.f_back and frame.f_back.f_code.co_filename.startswith(package):
            if frame.f_back.f_code.co_filename != name:
                steps.append(("climb", str(Path(frame.f_back.f_code.co_filename).relative_to(root)), ""))
        return tracer

    template = root / "hpcfl" / "templates" / "jobs" / "quickstart.toml"
    with tempfile.TemporaryDirectory() as results, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        sys.settrace(tracer)
        try:
            hpcfl.launch.main([str(template), "--results-root", results, "--set", "run.rounds=1",
                               "--set", "data.dataset='digits'"])
        finally:
            sys.settrace(None)
    return steps


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
    args = parser.parse_args(argv)
    steps = trace_setup(ROOT)
    counts = walk(steps)
    print(", ".join(f"{k} {v}" for k, v in counts.items() if k != "most re-entered"))
    print("most re-entered: " + ", ".join(f"{f} ({n})" for f, n in counts["most re-entered"]))
    if args.path:
        print("\n".join(f"{where}: {name}" for kind, where, name in steps if kind == "call"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
