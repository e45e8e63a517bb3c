"""One result file, one writer: `<result>.lock` names the run that owns it (SLURM job, host, pid).

HDF5's own file locking is often off on Lustre/NFS, and hpcfl's writer turns it off anyway so that
readers can follow a run; so rank 0 claims the result path itself, creating the lock file atomically
(O_EXCL) before it touches the result file, and the launcher removes it however the run ends
(finished, stopped at a checkpoint, failed). A lock left by a run that is provably gone is taken over:
same host and no such process any more, or an earlier incarnation of the same SLURM job (requeued).
Any other lock refuses the run with a message naming the owner.
"""
import json
import os
import socket
import time
from pathlib import Path

from hpcfl.errors import ResultsError

_held: dict[Path, list[Path]] = {}          # lock file -> the folders claiming it created


def lock_path(result_path: Path) -> Path:
    return result_path.with_name(result_path.name + ".lock")


def _me() -> dict:
    return {"job": os.environ.get("SLURM_JOB_ID", ""), "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
            "host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _gone(owner: dict, me: dict) -> bool:
    """Whether the owner of a lock can no longer be writing."""
    if owner.get("job") and owner.get("job") == me["job"] and owner.get("restart") != me["restart"]:
        return True                                     # the same SLURM job, requeued: its old self is gone
    if owner.get("host") != me["host"]:
        return False                                    # another node: nothing here can tell
    if owner.get("pid") == me["pid"]:
        return True                                     # this very process, from an earlier run in it
    try:
        os.kill(int(owner.get("pid", -1)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    return False


def _describe(owner: dict) -> str:
    job = f"SLURM job {owner['job']}, " if owner.get("job") else ""
    return f"{job}host {owner.get('host', '?')}, pid {owner.get('pid', '?')}, since {owner.get('since', '?')}"


def claim(result_path: Path) -> None:
    """Make this process the result file's only writer, or raise ResultsError naming the owner."""
    path, me = lock_path(result_path), _me()
    created = [folder for folder in path.parents if not folder.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as file:
            json.dump(me, file)
    except FileExistsError:
        try:
            owner = json.loads(path.read_text())
        except (OSError, ValueError):
            owner = {}
        if not isinstance(owner, dict) or not _gone(owner, me):
            raise ResultsError(f"{result_path} is being written by another run ({_describe(owner)}; lock file "
                               f"{path}). Wait for it, or choose another run.name; if that run is no longer "
                               f"running, delete {path}") from None
        temporary = path.with_name(f"{path.name}.{me['pid']}")
        temporary.write_text(json.dumps(me))
        os.replace(temporary, path)                     # take over the stale lock in one step
    _held[path] = created


def release() -> None:
    """Remove the locks this process holds, and the folders claiming them created if they stayed
    empty (a run refused at set-up leaves nothing behind); the launcher calls it however a run ends."""
    while _held:
        path, created = _held.popitem()
        path.unlink(missing_ok=True)
        for folder in created:                          # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
