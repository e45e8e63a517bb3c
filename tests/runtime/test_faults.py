"""Faults during training: a hung or killed rank ends the job within the round timeout naming the
round and the rank; a NaN/Inf client update stops the run or is dropped, as configured, and is
recorded; a refused second run on a result file names the first (the lock itself:
tests/runtime/test_lock.py)."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import FAULT_LAUNCHER, MPIRUN, launch

from hpcfl.errors import Exit
from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.runtime.lock import lock_path
from hpcfl.testing import assert_same_metrics, run_metrics

RESULT = "test/fedavg-dirichlet-seed0.h5"


def _leftovers(tag) -> str:
    """Processes whose command line mentions `tag` (this test's own temporary folder)."""
    return subprocess.run(["pgrep", "-af", str(tag)], capture_output=True, text=True).stdout


@pytest.mark.parametrize("fault", ["hang", "die"])
def test_a_hung_or_killed_rank_ends_the_job_within_the_round_timeout(fault, tiny_job, tmp_path):
    start = time.perf_counter()
    result = launch(tiny_job(rounds=4), "--results-root", tmp_path, "--set", "run.round_timeout_s=10", ranks=3,
                    timeout=120, launcher=FAULT_LAUNCHER, env={"HPCFL_FAULT": fault, "HPCFL_FAULT_ROUND": "2"})
    elapsed = time.perf_counter() - start
    assert result.returncode != 0 and elapsed < 60, (elapsed, result.stderr)
    if fault == "hang":                 # alive but silent: only the timeout can see it, and names it
        assert "round 2: rank 2 (" in result.stderr and "run.round_timeout_s = 10" in result.stderr, result.stderr
    time.sleep(1)
    assert not _leftovers(tmp_path), _leftovers(tmp_path)
    run = read_run(tmp_path / RESULT)                          # the completed round is kept
    assert run.rounds == 1 and np.isfinite(run.arrays["round/test_acc"]).all()
    assert not lock_path(tmp_path / RESULT).exists() or fault == "die"


def test_a_rank_stuck_in_set_up_ends_the_job_within_the_timeout_naming_it(tiny_job, tmp_path):
    start = time.perf_counter()
    result = launch(tiny_job(rounds=4), "--results-root", tmp_path, "--set", "run.round_timeout_s=5", ranks=3,
                    timeout=120, launcher=FAULT_LAUNCHER, env={"HPCFL_FAULT": "hang-setup"})
    assert result.returncode != 0 and time.perf_counter() - start < 60, result.stderr
    assert "failed in set-up" in result.stderr and "set-up: rank 2 (" in result.stderr, result.stderr
    time.sleep(1)
    assert not _leftovers(tmp_path), _leftovers(tmp_path)


def test_a_rank_that_cannot_read_the_job_fails_set_up_on_every_rank_naming_it(tiny_job, tmp_path):
    """It stops before MPI starts, where MPICH's mpiexec would let the others wait for it forever."""
    result = launch(tiny_job(rounds=4), "--results-root", tmp_path, ranks=3, timeout=120, launcher=FAULT_LAUNCHER,
                    env={"HPCFL_FAULT": "no-job-on-2"})
    assert result.returncode == Exit.BAD_INPUT, result.stderr
    assert f"rank 2 on {socket.gethostname()}: ConfigError: " in result.stderr and ".not-on-this-node" in result.stderr
    assert result.stderr.count("hpcfl: error:") == 1                   # rank 0 speaks for all
    assert not (tmp_path / RESULT).exists() and not lock_path(tmp_path / RESULT).exists()


def test_a_server_failing_alone_at_the_end_of_set_up_ends_every_rank(tiny_job, tmp_path):
    """An error after set-up's collective check is the server's alone: the workers, already in the
    first round, must not wait for it until run.round_timeout_s."""
    result = launch(tiny_job(rounds=4), "--results-root", tmp_path, "--set", "run.round_timeout_s=600", ranks=3,
                    timeout=120, launcher=FAULT_LAUNCHER, env={"HPCFL_FAULT": "results-on-0"})
    assert result.returncode != 0, result.stderr       # MPI_Abort's 2, or the SIGKILL (9) mpiexec's hydra sends
    assert re.search(r"rank 0 on \S+ failed in set-up:\nerror: cannot write attribute '\w+': disk quota exceeded",
                     result.stderr), result.stderr


def test_a_stop_signal_during_set_up_checkpoints_after_the_first_round(tiny_job, tmp_path):
    """SLURM's SIGTERM may come before the first round: the run must still exit with the code that
    requeues it (the default handler would end it with 143)."""
    result = launch(tiny_job(rounds=4), "--results-root", tmp_path, launcher=FAULT_LAUNCHER,
                    env={"HPCFL_FAULT": "term-setup"})
    assert result.returncode == Exit.RESUME, result.stderr
    run = read_run(tmp_path / RESULT)
    assert run.attrs["status"] == "interrupted" and run.rounds == 1


def test_a_failure_that_cannot_be_written_to_the_result_file_still_ends_the_job(tiny_job, tmp_path, monkeypatch,
                                                                                capsys):
    """A full disk: the failed round's error and then marking the file "failed" both raise; the run must
    still end through the abort (which, under MPI, ends every rank) with the failure's code."""
    from hpcfl.metrics import Recorder
    from hpcfl.runtime import loop

    def fail(*args, **kwargs):
        raise OSError("No space left on device")

    set_attr = Recorder.set_attr
    monkeypatch.setattr(loop, "record", fail)
    monkeypatch.setattr(Recorder, "set_attr", lambda self, name, value: (
        fail if value == "failed" else set_attr)(self, name, value))
    with pytest.raises(SystemExit) as stop:
        main([str(tiny_job(rounds=2)), "--results-root", str(tmp_path)])
    assert stop.value.code == Exit.FAILED
    assert "failed in round 1:" in capsys.readouterr().err


def test_a_result_file_that_cannot_be_closed_after_the_last_round_fails_the_job_through_the_abort(
        tiny_job, tmp_path, monkeypatch, capsys):
    """Marking the file "completed" raises (a full disk): the run ends with the failure's code and the
    rank's failure line, as an abort that ends every rank under MPI, not a bare traceback."""
    from hpcfl.metrics import Recorder

    set_attr = Recorder.set_attr

    def full(self, name, value):
        if value == "completed":
            raise OSError("No space left on device")
        set_attr(self, name, value)

    monkeypatch.setattr(Recorder, "set_attr", full)
    with pytest.raises(SystemExit) as stop:
        main([str(tiny_job(rounds=2)), "--results-root", str(tmp_path)])
    assert stop.value.code == Exit.FAILED
    assert re.search(r"hpcfl: rank 0 on \S+ failed in round 2:\n.*No space left on device", capsys.readouterr().err,
                     re.S)


def _nan_run(tiny_job, tmp_path, policy, ranks=0, algorithm="fedavg", timeout_s=1800):
    """Client 1 trains on NaN inputs in round 2 of 4; every client is sampled every round."""
    return launch(tiny_job(algorithm, rounds=4), "--results-root", tmp_path, "--set", "train.clients_per_round=6",
                  "--set", f"train.on_nonfinite={policy!r}", "--set", f"run.round_timeout_s={timeout_s}",
                  ranks=ranks, launcher=FAULT_LAUNCHER,
                  env={"HPCFL_FAULT": "nan", "HPCFL_FAULT_CLIENT": "1", "HPCFL_FAULT_ROUND": "2"})


@pytest.mark.parametrize("ranks", [0, 3])
def test_a_nan_update_stops_the_run_after_recording_the_round(ranks, tiny_job, tmp_path):
    result = _nan_run(tiny_job, tmp_path, "stop", ranks)
    assert result.returncode == 1, result.stderr
    assert "rank 0 " in result.stderr and " ERROR round 2: client(s) [1] gave a non-finite" in result.stderr
    assert "train.on_nonfinite" in result.stderr and result.stderr.count("gave a non-finite") == 1     # rank 0 alone
    run = read_run(tmp_path / RESULT)
    assert run.rounds == 2 and run.attrs["status"] == "failed"
    flags = run.arrays["client/nonfinite"]
    assert flags[1, 1] == 1 and np.nansum(flags) == 1
    assert np.isfinite(run.arrays["round/test_acc"]).all()     # the NaN update never reached the model
    assert not lock_path(tmp_path / RESULT).exists()


@pytest.mark.parametrize("ranks", [0, 3])
def test_a_fedma_model_gone_nan_ends_the_job_at_once_from_its_rank_naming_the_client(ranks, tiny_job, tmp_path):
    """FedMA cannot match a non-finite model's neurons, so the rank hosting the client raises in the
    middle of a round: it ends every rank (no peer waits out run.round_timeout_s) and says why."""
    result = _nan_run(tiny_job, tmp_path, "stop", ranks, algorithm="fedma", timeout_s=600)
    assert result.returncode == Exit.FAILED if not ranks else result.returncode != 0, result.stderr   # MPI: or 9
    assert re.search(rf"rank {'[12]' if ranks else 0} on \S+ failed in round 2:", result.stderr)  # a worker's
    assert "phase 'train': client 1's model is not finite (NaN/Inf)" in result.stderr, result.stderr
    assert "never reached" not in result.stderr
    assert read_run(tmp_path / "test/fedma-dirichlet-seed0.h5").rounds == 1     # the round before is kept


def test_dropped_nan_updates_are_recorded_and_the_client_keeps_its_state(tiny_job, tmp_path):
    one = _nan_run(tiny_job, tmp_path / "one", "drop", algorithm="scaffold")
    three = _nan_run(tiny_job, tmp_path / "three", "drop", ranks=3, algorithm="scaffold")
    assert one.returncode == 0 and three.returncode == 0, one.stderr + three.stderr
    assert " WARNING round 2: client(s) [1] gave a non-finite loss or update; their updates were dropped" in one.stderr
    path = "test/scaffold-dirichlet-seed0.h5"
    run = read_run(tmp_path / "one" / path)
    flags = run.arrays["client/nonfinite"]
    assert flags[1, 1] == 1 and np.nansum(flags) == 1          # later rounds: SCAFFOLD's control variate is clean
    assert np.isfinite(run.arrays["round/test_acc"]).all() and np.isfinite(run.arrays["round/train_loss"]).all()
    assert_same_metrics(run_metrics(tmp_path / "one" / path), run_metrics(tmp_path / "three" / path))


def test_a_second_run_on_the_same_result_is_refused_naming_the_first(tiny_job, tmp_path, capsys):
    job = tiny_job(rounds=30)
    args = [str(job), "--results-root", str(tmp_path)]
    first = subprocess.Popen([sys.executable, "-m", "hpcfl.launch", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    for line in first.stdout:                  # the first run is training
        if " round    1/" in line:
            break
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"host {socket.gethostname()}, pid {first.pid}" in err and "s ago). Wait for it" in err, err
    assert first.wait(timeout=120) == 0                        # the refusal left the first run alone
    assert read_run(tmp_path / RESULT).attrs["status"] == "completed"
    assert not lock_path(tmp_path / RESULT).exists()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_mpirun_checkpoints_and_exits_with_the_resumable_code(sig, tiny_job, tmp_path):
    proc = subprocess.Popen([MPIRUN, "-np", "3", sys.executable, "-m", "hpcfl.launch", str(tiny_job(rounds=30)),
                             "--results-root", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stdout:
        if " round    2/" in line:
            proc.send_signal(sig)
    assert proc.wait(timeout=120) == Exit.RESUME               # only rank 0 exits non-zero: mpiexec ORs the codes
    run = read_run(tmp_path / RESULT)
    assert run.attrs["status"] == "interrupted" and 2 <= run.rounds < 30
    assert not lock_path(tmp_path / RESULT).exists()
