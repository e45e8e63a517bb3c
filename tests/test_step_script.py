"""slurm/step.sh removes what MPICH leaves in /dev/shm when ranks are killed: the step's own
segments that no process maps any more, never another run's or one still in use. Runs the script
with a stand-in launcher, no SLURM needed."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEP = Path(__file__).resolve().parents[1] / "slurm" / "step.sh"
pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")


def test_the_step_removes_its_leftover_shared_memory_but_not_segments_in_use_or_older(tmp_path):
    tag = f"hpcfltest{os.getpid()}"
    older = Path(f"/dev/shm/mpich_shm_{tag}_old")
    older.write_bytes(b"\0" * 4096)
    os.utime(older, (time.time() - 60, time.time() - 60))         # from before the step started
    holder_ready = tmp_path / "mapped"
    # the stand-in launcher: a killed rank's leftover, and a segment another process keeps mapped
    launcher = tmp_path / "launch.sh"
    launcher.write_text(f"""#!/bin/bash
printf '%4096s' > /dev/shm/mpich_shm_{tag}_left
printf '%4096s' > /dev/shm/mpich_shm_{tag}_held
{sys.executable} -c "
import mmap, pathlib, time
f = open('/dev/shm/mpich_shm_{tag}_held', 'r+b'); m = mmap.mmap(f.fileno(), 4096)
pathlib.Path('{holder_ready}').touch(); time.sleep(30)" > /dev/null 2>&1 &
while [ ! -e {holder_ready} ]; do sleep 0.05; done
exit 3
""")
    launcher.chmod(0o755)
    try:
        env = {**os.environ, "HPCFL_MPI_LAUNCH": str(launcher), "SLURM_JOB_ID": ""}
        result = subprocess.run(["bash", str(STEP), "true"], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 3                                  # the step's status comes through
        assert not Path(f"/dev/shm/mpich_shm_{tag}_left").exists()     # nobody maps it: removed
        assert Path(f"/dev/shm/mpich_shm_{tag}_held").exists()         # still mapped by a live process
        assert older.exists()                                          # not this step's
    finally:
        subprocess.run(["pkill", "-f", f"mpich_shm_{tag}_held"], check=False)
        for path in Path("/dev/shm").glob(f"mpich_shm_{tag}_*"):
            path.unlink()
