"""What the bench scripts share: run one job as its own process (under mpirun when `ranks`), keep a
completed result and redo an interrupted one."""
import subprocess
import sys
from pathlib import Path

from hpcfl.jobs import load_job
from hpcfl.metrics import read_run

MPIRUN = str(Path(sys.executable).with_name("mpirun"))


def launch(job: Path, root: Path, name: str, *overrides: str, ranks: int = 0) -> dict:
    """The arrays of run `name` of `job` under `root`, running it unless a completed file is there."""
    sets = [f"run.name={name!r}", *overrides]
    args = [arg for o in sets for arg in ("--set", o)]
    config = load_job(job, [*sets, f"run.results_root={str(root)!r}"])
    path = config.result_path
    if path.exists() and read_run(path).attrs.get("status") != "completed":
        path.unlink()                 # an interrupted earlier run: redo it
    if not path.exists():
        cmd = [sys.executable, "-m", "hpcfl.launch", str(job), "--results-root", str(root), *args]
        done = subprocess.run([MPIRUN, "-np", str(ranks), *cmd] if ranks else cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"run {name} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return read_run(path).arrays
