"""One result file, one writer: `<result>.lock` names the run that owns it (SLURM job, host, pid).

HDF5's own file locking is often off on Lustre/NFS, and hpcfl's writer turns it off anyway so that
readers can follow a run; so rank 0 claims the result path itself, creating the lock file atomically
(O_EXCL) before it touches the result file, and the launcher removes it however the run ends
(finished, stopped at a checkpoint, failed). A lock left by a run that is provably gone is taken over:
same host and no such process any more, or an earlier incarnation of the same SLURM job (requeued).

A lock can also outlive its run where nobody removes it: when a rank on another node is killed, the
MPI launcher kills rank 0 too. So rank 0 keeps its lock fresh: a thread touches it every HEARTBEAT_S
seconds for as long as the process lives (waiting in a collective included). A lock not touched for
STALE_S seconds is stale from any node and is taken over with a warning naming the old owner. Its
age is measured against the file system's own clock (a file written next to it), so clocks that
differ between nodes do not matter. Any other lock refuses the run with a message naming the owner.
"""
import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from hpcfl.errors import ResultsError

HEARTBEAT_S = 30.0      # rank 0 touches its lock this often
STALE_S = 300.0         # a lock untouched this long has no live owner (ten missed heartbeats)

# lock file -> (folders claiming it created, heartbeat stop)
_held: dict[Path, tuple[list[Path], threading.Event]] = {}


def lock_path(result_path: Path) -> Path:
    return result_path.with_name(result_path.name + ".lock")


def _me() -> dict:
    return {"job": os.environ.get("SLURM_JOB_ID", ""), "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
            "host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _silent_s(path: Path, probe: Path) -> float:
    """Seconds since `path` was last touched, by the file system's clock: `probe`, just written next to
    it, carries that clock's now."""
    return probe.stat().st_mtime - path.stat().st_mtime


def _beat(path: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            os.utime(path)
        except OSError:                                 # removed under us, or the file system is away: try again
            pass


def _gone(owner: dict, me: dict) -> bool:
    """Whether the owner of a lock can no longer be writing (staleness aside)."""
    if owner.get("job") and owner.get("job") == me["job"] and owner.get("restart") != me["restart"]:
        return True                                     # the same SLURM job, requeued: its old self is gone
    if owner.get("host") != me["host"]:
        return False                                    # another node: nothing here can tell
    if owner.get("pid") == me["pid"]:
        return True                                     # this very process, from an earlier run in it
    try:
        os.kill(int(owner.get("pid")), 0)               # signal 0: is it alive?
    except ProcessLookupError:
        return True
    except (PermissionError, TypeError, ValueError, OverflowError):     # another user's, or no pid: cannot tell
        return False
    return False


def _describe(owner: dict) -> str:
    job = f"SLURM job {owner['job']}, " if owner.get("job") else ""
    return f"{job}host {owner.get('host', '?')}, pid {owner.get('pid', '?')}, since {owner.get('since', '?')}"


def _create(path: Path, me: dict) -> bool:
    """Create the lock, if there is none."""
    try:
        with open(path, "x") as file:
            json.dump(me, file)
    except FileExistsError:
        return False
    return True


def _read(path: Path) -> str | None:
    """The lock's text (None when it is gone or unreadable)."""
    try:
        return path.read_text()
    except OSError:
        return None


def _owner(text: str | None) -> dict:
    """The lock's owner as it wrote itself ({} when unreadable)."""
    try:
        owner = json.loads(text or "")
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _identity(stat: os.stat_result) -> tuple:
    """Which lock file this is: its inode, and its last touch (a new lock or a heartbeat changes it)."""
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns


def _take_over(path: Path, result_path: Path, me: dict) -> None:
    """Remove the lock if its owner is gone or silent, else raise ResultsError naming the owner. The
    caller then creates the lock (O_EXCL), so of two runs taking over one stale lock at once only one
    ends up owning it."""
    owner = _owner(_read(path))
    unique = path.with_name(f"{path.name}.{me['host']}-{me['pid']}")
    unique.write_text("")                               # its mtime is the file system's now
    try:
        judged = _identity(path.stat())
        silent = _silent_s(path, unique)
    except FileNotFoundError:                           # released meanwhile
        unique.unlink()
        return
    if not _gone(owner, me) and silent <= STALE_S:
        unique.unlink()
        raise ResultsError(f"{result_path} is being written by another run ({_describe(owner)}; lock file "
                           f"{path}, refreshed {silent:.0f} s ago). Wait for it, or choose another run.name; "
                           f"a lock not refreshed for {STALE_S:.0f} s is taken over by the next run")
    try:
        os.replace(path, unique)                        # one rename of the lock: only one run gets it
    except OSError:                                     # another run took it first (or no right to move it)
        unique.unlink(missing_ok=True)
        if not path.exists():
            return
        raise
    if _identity(unique.stat()) != judged:              # what we moved is a lock another run just made, or
        os.replace(unique, path)                        # one its owner refreshed: put it back, theirs
        return
    unique.unlink()
    if not _gone(owner, me):
        logging.getLogger(__name__).warning(f"taking over {path}: its owner ({_describe(owner)}) has not "
                                            f"refreshed it for {silent:.0f} s (more than {STALE_S:.0f} s), "
                                            "so it is gone")


def claim(result_path: Path) -> None:
    """Make this process the result file's only writer, or raise ResultsError naming the owner."""
    path, me = lock_path(result_path), _me()
    created = [folder for folder in path.parents if not folder.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while not _create(path, me):
            _take_over(path, result_path, me)           # refuses, or removes a lock whose owner is gone
    except OSError as err:                              # a file in the way, no permission, a read-only mount
        raise ResultsError(f"cannot write in the results folder {path.parent} ({err.strerror}): choose another "
                           "run.results_root (--results-root) or run.study") from None
    earlier = _held.pop(path, None)
    if earlier:                                         # claimed before by this process: one heartbeat, not two
        earlier[1].set()
        created = earlier[0]
    stop = threading.Event()
    threading.Thread(target=_beat, args=(path, stop), name="hpcfl-lock-heartbeat", daemon=True).start()
    _held[path] = created, stop


def writing(result_path: Path) -> bool:
    """Whether a run is writing `result_path`: its lock was refreshed within STALE_S, by the file
    system's clock where a probe can be written next to it (else this machine's: a reader may not
    write there), and its owner is not provably gone (a dead process on this node)."""
    path, me = lock_path(result_path), _me()
    owner = _owner(_read(path))
    if owner.get("pid") != me["pid"] and _gone(owner, me):     # (this process asking: it is the writer)
        return False
    probe = path.with_name(f"{path.name}.probe-{socket.gethostname()}-{os.getpid()}")
    try:
        try:
            probe.write_text("")
            silent = _silent_s(path, probe)
        except FileNotFoundError:
            raise
        except OSError:                                 # not ours to write, or a read-only mount
            silent = time.time() - path.stat().st_mtime
    except FileNotFoundError:                           # no lock (or it went as the run ended)
        return False
    finally:
        with contextlib.suppress(OSError):               # never written, or a read-only mount
            probe.unlink()
    return silent <= STALE_S


def release() -> None:
    """Remove the locks this process holds, and the folders claiming them created if they stayed
    empty (a run refused at set-up leaves nothing behind); the launcher calls it however a run ends."""
    while _held:
        path, (created, stop) = _held.popitem()
        stop.set()
        path.unlink(missing_ok=True)
        for folder in created:                          # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
