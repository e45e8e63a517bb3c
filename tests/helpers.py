"""Helpers for tests that run the launcher as a user would."""
import os
import subprocess
import sys
from pathlib import Path

MPIRUN = str(Path(sys.executable).with_name("mpirun"))


def launch(*args, ranks: int = 0, cwd=None, timeout: float = 240, launcher=("-m", "hpcfl.launch")):
    """Run the launcher (under `mpirun -np ranks` if ranks); a hang fails the test via the timeout."""
    cmd = [sys.executable, *launcher, *map(str, args)]
    if ranks:
        cmd = [MPIRUN, "-np", str(ranks), *cmd]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
