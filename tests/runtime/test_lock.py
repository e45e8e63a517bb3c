"""One writer per result file (hpcfl.runtime.lock): a lock of a run that is gone is taken over, one
of a live run refuses naming its owner, a stale one from another node is taken over with a warning,
and the owner's heartbeat keeps its lock fresh until it releases it."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from hpcfl.errors import ResultsError
from hpcfl.runtime.lock import claim, lock_path, release


def _write_lock(path, **owner):
    lock_path(path).parent.mkdir(parents=True, exist_ok=True)
    lock_path(path).write_text(json.dumps(owner))


def test_a_lock_of_a_gone_run_is_taken_over_and_one_of_another_node_is_not(tmp_path, monkeypatch):
    path = tmp_path / "study" / "run.h5"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _write_lock(path, job="", host=socket.gethostname(), pid=int(dead.stdout))        # that process has exited
    claim(path)
    assert json.loads(lock_path(path).read_text())["pid"] == os.getpid()
    release()
    assert not lock_path(path).exists()

    _write_lock(path, job="", host="node-17", pid=4242, since="2026-11-22 10:00:00")
    with pytest.raises(ResultsError, match="host node-17, pid 4242, since 2026-11-22"):
        claim(path)

    _write_lock(path, job="977", restart="0", host="node-17", pid=4242)                # requeued SLURM job
    monkeypatch.setenv("SLURM_JOB_ID", "977")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    claim(path)
    assert json.loads(lock_path(path).read_text())["restart"] == "1"
    release()


def test_a_lock_from_another_host_is_stale_once_its_heartbeat_stops(tmp_path, hpcfl_log):
    """Rank 0 on another node killed by the launcher leaves its lock: untouched for STALE_S it is
    taken over with a warning naming the owner; a lock its owner keeps touching is not."""
    import hpcfl.runtime.lock as lock

    path = tmp_path / "study" / "run.h5"
    _write_lock(path, job="55", restart="0", host="node-3", pid=4242, since="2026-11-20 08:00:00")
    os.utime(lock_path(path), (time.time() - lock.STALE_S + 30, time.time() - lock.STALE_S + 30))
    with pytest.raises(ResultsError, match="host node-3, pid 4242.*refreshed 27[0-9] s ago"):
        claim(path)                                    # recently refreshed: its owner may be alive
    assert sorted(p.name for p in lock_path(path).parent.iterdir()) == ["run.h5.lock"]     # no temporary left
    os.utime(lock_path(path), (time.time() - lock.STALE_S - 30, time.time() - lock.STALE_S - 30))
    claim(path)
    [warning] = hpcfl_log.records
    assert warning.levelname == "WARNING" and warning.message.startswith(f"taking over {lock_path(path)}: its owner "
                                                                         "(SLURM job 55, host node-3, pid 4242")
    assert json.loads(lock_path(path).read_text())["pid"] == os.getpid()
    release()


def test_the_owner_keeps_its_lock_fresh_until_it_releases_it(tmp_path, monkeypatch):
    import hpcfl.runtime.lock as lock

    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.05)
    path = tmp_path / "run.h5"
    claim(path)
    old = time.time() - 1000
    os.utime(lock_path(path), (old, old))
    deadline = time.time() + 10
    while lock_path(path).stat().st_mtime == old and time.time() < deadline:
        time.sleep(0.02)
    assert lock_path(path).stat().st_mtime > old + 900                # touched again by the heartbeat
    release()
    assert not lock_path(path).exists()
    time.sleep(0.2)                                                    # the stopped heartbeat recreates nothing
    assert not lock_path(path).exists()
    assert not any(t.name == "hpcfl-lock-heartbeat" and t.is_alive() for t in lock.threading.enumerate())


def test_a_claim_names_this_run_and_release_leaves_no_folder_it_made(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "31")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    (tmp_path / "kept").mkdir()
    made, existing = tmp_path / "new" / "study" / "run.h5", tmp_path / "kept" / "run.h5"
    claim(made)
    claim(existing)
    assert {k: v for k, v in json.loads(lock_path(made).read_text()).items() if k != "since"} == \
        {"job": "31", "restart": "2", "host": socket.gethostname(), "pid": os.getpid()}
    lock_path(existing).unlink()                                  # removed under the run: release goes on
    release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and not list((tmp_path / "kept").iterdir())


def test_a_lock_this_process_left_is_taken_over_and_one_of_a_live_process_is_not(tmp_path):
    path = tmp_path / "run.h5"
    _write_lock(path, job="", host=socket.gethostname(), pid=os.getpid())          # an earlier run in this process
    claim(path)
    release()
    script = ("import signal, time\n"                           # any signal ends it, even under nohup
              "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_DFL)\n"
              "print(flush=True)\ntime.sleep(60)")
    alive = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    alive.stdout.readline()                                       # its handlers are set
    try:
        for pid in (alive.pid, None, "abc", 2**70):               # alive, or no pid that can be asked about
            _write_lock(path, job="", host=socket.gethostname(), pid=pid)
            with pytest.raises(ResultsError, match="is being written by another run"):
                claim(path)
        with pytest.raises(subprocess.TimeoutExpired):           # asked (signal 0), not signalled: it lives on
            alive.wait(timeout=0.5)
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_fresh_lock_refuses_naming_an_unknown_owner(tmp_path, text):
    path = tmp_path / "run.h5"
    lock_path(path).write_text(text)
    with pytest.raises(ResultsError, match=r"\(host \?, pid \?, since \?; lock file"):
        claim(path)


def test_a_lock_is_stale_after_ten_missed_heartbeats_and_the_heartbeat_never_holds_the_process(tmp_path):
    import hpcfl.runtime.lock as lock

    assert lock.STALE_S == 10 * lock.HEARTBEAT_S
    script = f"from hpcfl.runtime.lock import claim; claim(__import__('pathlib').Path({str(tmp_path / 'r.h5')!r}))"
    ended = subprocess.run([sys.executable, "-c", script], timeout=20)              # exits without release()
    assert ended.returncode == 0 and lock_path(tmp_path / "r.h5").exists()


def test_a_path_this_process_claims_again_keeps_one_heartbeat_and_its_folders(tmp_path):
    import hpcfl.runtime.lock as lock

    def beating():
        return sum(t.name == "hpcfl-lock-heartbeat" and t.is_alive() for t in lock.threading.enumerate())

    before, path = beating(), tmp_path / "new" / "run.h5"
    claim(path)
    claim(path)                                       # a second run in this process, on the same result file
    time.sleep(0.1)
    assert beating() == before + 1
    release()
    time.sleep(0.1)
    assert beating() == before and not (tmp_path / "new").exists()     # the folder the first claim made


def test_a_run_is_writing_while_its_lock_is_fresh_by_the_file_systems_clock(tmp_path, monkeypatch):
    """hpcfl status reads it on a login node whose clock may differ from the file server's."""
    from pathlib import Path

    from hpcfl.runtime import lock

    path = tmp_path / "run.h5"
    assert not lock.writing(path)                                       # no lock
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _write_lock(path, job="", host=socket.gethostname(), pid=int(dead.stdout))
    assert not lock.writing(path)                          # fresh, but its process is gone: a killed run
    _write_lock(path, job="", host=socket.gethostname(), pid=os.getpid())
    assert lock.writing(path)                                           # this process's own
    _write_lock(path, host="elsewhere", pid=1)
    assert lock.writing(path)
    refreshed = time.time() - lock.STALE_S - 30
    os.utime(lock_path(path), (refreshed,) * 2)
    monkeypatch.setattr(time, "time", lambda: refreshed + 10)          # this machine's clock, behind: fresh by it
    assert not lock.writing(path)                                       # stale by the file system's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5.lock"]        # no probe left behind
    write_text = Path.write_text

    for refusal in (PermissionError(13, "Permission denied"), OSError(30, "Read-only file system")):
        def read_only(self, *args, refusal=refusal):                    # a folder the reader cannot write in
            if ".probe-" in self.name:
                raise refusal
            return write_text(self, *args)

        monkeypatch.setattr(Path, "write_text", read_only)
        assert lock.writing(path)                                       # then this machine's clock is all there is


def test_a_lock_released_while_a_claim_judges_it_is_claimed_afresh(tmp_path, monkeypatch):
    from hpcfl.runtime import lock

    path = tmp_path / "run.h5"
    _write_lock(path, job="", host="node-17", pid=4242)                 # a live run elsewhere...
    judge = lock._silent_s

    def released_meanwhile(lock_file, probe):                           # ...that ends as the claim reads the lock
        lock_file.unlink()
        return judge(lock_file, probe)

    monkeypatch.setattr(lock, "_silent_s", released_meanwhile)
    claim(path)
    assert json.loads(lock_path(path).read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5.lock"]      # no temporary lock left
    release()


@pytest.mark.parametrize("readable", [True, False])
def test_of_two_runs_taking_over_one_stale_lock_at_once_only_one_owns_it(tmp_path, monkeypatch, readable):
    """Run A takes the stale lock over (and makes its own) while this run is judging the stale one:
    this run must leave A's lock in place and refuse, not overwrite it and write the file alongside A."""
    from hpcfl.runtime import lock

    path = tmp_path / "run.h5"
    _write_lock(path, job="", host="node-3", pid=4242)
    long_ago = time.time() - lock.STALE_S - 30
    os.utime(lock_path(path), (long_ago, long_ago))
    judge = lock._silent_s

    def other_run_takes_over(lock_file, probe):
        silent = judge(lock_file, probe)
        if json.loads(lock_file.read_text())["pid"] == 4242:           # (the real text, whatever _read says)
            lock_file.unlink()
            lock_file.write_text(json.dumps({"job": "", "host": "node-9", "pid": 777}))
        return silent

    monkeypatch.setattr(lock, "_silent_s", other_run_takes_over)
    if not readable:                                    # another user's lock: no text to tell the two apart
        monkeypatch.setattr(lock, "_read", lambda path: None)
    with pytest.raises(ResultsError, match="host node-9, pid 777" if readable else "being written by another run"):
        claim(path)
    assert json.loads(lock_path(path).read_text())["pid"] == 777
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5.lock"]      # no temporary left


def test_a_results_folder_that_cannot_be_made_or_written_is_refused_naming_it(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ResultsError, match=r"cannot write in the results folder .*afile/study \(Not a directory\): "
                                           r"choose another run.results_root"):
        claim(tmp_path / "afile" / "study" / "run.h5")
    from hpcfl.runtime import lock

    def read_only(path, me):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(lock, "_create", read_only)
    with pytest.raises(ResultsError, match=r"cannot write in the results folder .* \(Read-only file system\)"):
        claim(tmp_path / "study" / "run.h5")
