"""Regenerate the studies' tables in their README files from the committed result files.

    python studies/report.py [README ...]           # default: studies/*/README.md

A README names each table by the command that makes it, and the output sits below it, up to the
end marker; this script runs every such command (from the repository root) and rewrites its output:

    <!-- analysis: python -m hpcfl.analyze compare studies/fedcme/results --baseline run.arm=FedAvg -->
    ...the table...
    <!-- end -->

So a table in a README is always what hpcfl.analyze prints for the results next to it.
"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- analysis: (.+?) -->\n)(.*?)(<!-- end -->)", re.DOTALL)


def _output(command: str, cwd: Path) -> str:
    args = shlex.split(command)
    if args[:3] != ["python", "-m", "hpcfl.analyze"]:
        raise SystemExit(f"report: only `python -m hpcfl.analyze ...` commands run here, not {command!r}")
    done = subprocess.run([sys.executable, *args[1:]], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"report: `{command}` failed:\n{done.stderr}")
    return done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"


def refresh(readme: Path, cwd: Path = REPOSITORY) -> int:
    """Rewrite every analysis block of `readme`; returns how many there were."""
    text = readme.read_text()
    blocks = BLOCK.findall(text)
    readme.write_text(BLOCK.sub(lambda m: m.group(1) + "\n" + _output(m.group(2), cwd) + "\n" + m.group(4), text))
    return len(blocks)


def main(argv=None) -> int:
    readmes = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or sorted(
        (REPOSITORY / "studies").glob("*/README.md"))
    for readme in readmes:
        print(f"{readme}: {refresh(readme)} table(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
