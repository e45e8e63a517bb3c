"""The SLURM scripts on a real single-node SLURM cluster (Debian's slurmctld/slurmd/munge, started
by slurm/local-cluster.sh; CI installs them): the MPI job on 3 tasks gives the one-process numbers,
a sweep runs as a job array (and `hpcfl sweep --submit` sizes it), srun starts the `hpcfl` console
script as an MPI job, a job signalled with USR1 checkpoints, requeues itself and finishes with the
metrics of an uninterrupted run (in a job array, the signalled task alone), a cancelled one
checkpoints and stays cancelled, and srun without an MPI plugin is refused with the fix."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CHECKPOINTED_JOB

from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.testing import assert_same_metrics, run_metrics

SLURM = Path(__file__).resolve().parent.parent / "slurm"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}    # a job's states once it has ended (scontrol's JobState)
JOB = CHECKPOINTED_JOB.format(study="slurm") + '[algorithm]\nname = "scaffold"\n'

pytestmark = pytest.mark.skipif(shutil.which("slurmctld") is None or os.geteuid() != 0,
                                reason="needs root and Debian's slurmctld, slurmd, munge (CI installs them)")


@pytest.fixture(scope="module")      # one cluster (its ports are SLURM's defaults): `--dist loadfile` keeps
def cluster(tmp_path_factory):        # this file's tests on one worker
    state = tmp_path_factory.mktemp("slurm")
    subprocess.run([SLURM / "local-cluster.sh", "start", state], check=True, timeout=60)
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf"), "HPCFL_SLURM": str(SLURM),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    yield env
    subprocess.run([SLURM / "local-cluster.sh", "stop", state], timeout=60)


def _sbatch(env, tmp_path, *args, wait=True, status=0) -> str:
    """Submit a 3-task job; with `wait`, until it ends with exit `status`. Returns the job id."""
    out = subprocess.run(["sbatch", "--parsable", "-n", "3", "-o", str(tmp_path / "slurm-%j.out"), *map(str, args)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    jid = out.stdout.strip().split(";")[0]
    if wait:
        assert _exit_codes(env, jid) == {status}
    return jid


def _exit_codes(env, jid: str, timeout: float = 300) -> set[int]:
    """The exit codes of job `jid`'s tasks (each of an array's), once every task has ended. Polled here:
    `sbatch --wait` sleeps 2, 8, then 32 s between its own polls, which cost the suite a minute."""
    records = []

    def ended():
        shown = subprocess.run(["scontrol", "-o", "show", "job", jid], env=env, capture_output=True, text=True,
                               timeout=30).stdout.splitlines()
        records[:] = [dict(field.split("=", 1) for field in line.split() if "=" in field) for line in shown]
        return bool(records) and all(r["JobState"] in ENDED for r in records)

    _until(ended, timeout, f"job {jid} to end")
    return {int(r["ExitCode"].split(":")[0]) for r in records}


def _until(predicate, timeout, what):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def _local_run(job, tmp_path, name, *overrides):
    assert main([str(job), "--results-root", str(tmp_path / "results"), "--set", f"run.name={name!r}",
                 *(a for o in overrides for a in ("--set", o))]) == 0
    return run_metrics(tmp_path / "results" / "slurm" / f"{name}.h5")


def test_the_mpi_job_on_three_tasks_gives_the_one_process_numbers(cluster, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    _sbatch(cluster, tmp_path, SLURM / "hpcfl.sbatch", job, "--results-root", tmp_path / "results",
            "--set", "run.name='mpi'")
    result = read_run(tmp_path / "results" / "slurm" / "mpi.h5")
    assert result.attrs["status"] == "completed" and result.attrs["world_size"] == 3
    assert_same_metrics(_local_run(job, tmp_path, "one"), run_metrics(tmp_path / "results" / "slurm" / "mpi.h5"))


def test_a_sweep_runs_as_a_job_array(cluster, tmp_path):
    job = tmp_path / "sweep.toml"
    job.write_text(JOB.replace("rounds = 6", "rounds = 2") + '[sweep]\ngrid = { "train.lr" = [0.05, 0.1] }\n')
    _sbatch(cluster, tmp_path, "--array=0-1", SLURM / "sweep.sbatch", job, "--results-root", tmp_path / "results")
    for name in ("sweep-0.05-seed0", "sweep-0.1-seed0"):
        assert read_run(tmp_path / "results" / "slurm" / f"{name}.h5").attrs["status"] == "completed"


def _running(cluster, tmp_path, rounds: int, name: str) -> tuple[Path, str, Path]:
    """A job of `rounds` rounds submitted and past round 3: (its job file, job id, output file)."""
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace("rounds = 6", f"rounds = {rounds}"))
    jid = _sbatch(cluster, tmp_path, SLURM / "hpcfl.sbatch", job, "--results-root", tmp_path / "results",
                  "--set", f"run.name={name!r}", wait=False)
    log = tmp_path / f"slurm-{jid}.out"
    _until(lambda: log.exists() and "round    3/" in log.read_text(), 120, "round 3")
    return job, jid, log


def test_a_signalled_job_checkpoints_requeues_and_finishes_with_the_same_metrics(cluster, tmp_path):
    job, jid, log = _running(cluster, tmp_path, 12, "requeued")
    subprocess.run(["scancel", "--batch", "--signal=USR1", jid], env=cluster, check=True, timeout=30)
    _until(lambda: " INFO wrote " in log.read_text(), 240, "the requeued job to finish")
    text = log.read_text()
    assert "requeueing job" in text and "resuming after round" in text
    shown = subprocess.run(["scontrol", "show", "job", jid], env=cluster, capture_output=True, text=True).stdout
    assert "Restarts=1" in shown
    assert_same_metrics(_local_run(job, tmp_path, "straight"),
                        run_metrics(tmp_path / "results" / "slurm" / "requeued.h5"))


def test_a_cancelled_job_checkpoints_and_stays_cancelled(cluster, tmp_path):
    """scancel sends TERM, and SLURM requeues even a cancelled job when asked: step.sh must not."""
    _, jid, log = _running(cluster, tmp_path, 40, "cancelled")
    subprocess.run(["scancel", jid], env=cluster, check=True, timeout=30)
    assert _exit_codes(cluster, jid) == {3}
    _until(lambda: "hpcfl: checkpointed" in log.read_text(), 30, "step.sh's last word")
    shown = subprocess.run(["scontrol", "show", "job", jid], env=cluster, capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in shown and "Restarts=0" in shown
    assert f"job {jid} got TERM (scancel, a preemption" in log.read_text() and "requeueing" not in log.read_text()
    stopped = read_run(tmp_path / "results" / "slurm" / "cancelled.h5")
    assert stopped.attrs["status"] == "interrupted" and 3 <= stopped.rounds < 40


def test_a_signalled_array_task_requeues_alone(cluster, tmp_path):
    """Task 1 of a two-task array carries the array's own job id, which scontrol reads as the whole
    array: only that task may requeue, the other runs on undisturbed, and both end as run straight."""
    job, straight = tmp_path / "sweep.toml", tmp_path / "straight.toml"
    straight.write_text(JOB.replace("rounds = 6", "rounds = 12"))
    job.write_text(straight.read_text() + '[sweep]\ngrid = { "train.lr" = [0.05, 0.1] }\n')
    array = subprocess.run(["sbatch", "--parsable", "--array=0-1", "-n", "1", "-o", str(tmp_path / "slurm-%A_%a.out"),
                            SLURM / "sweep.sbatch", str(job), "--results-root", str(tmp_path / "results")],
                           env=cluster, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    jid = array.stdout.strip().split(";")[0]
    logs = [tmp_path / f"slurm-{jid}_{task}.out" for task in (0, 1)]
    _until(lambda: logs[1].exists() and "round    3/" in logs[1].read_text(), 120, "round 3 of task 1")
    subprocess.run(["scancel", "--batch", "--signal=USR1", f"{jid}_1"], env=cluster, check=True, timeout=30)
    _until(lambda: all(log.exists() and " INFO wrote " in log.read_text() for log in logs), 240, "both tasks to finish")
    assert "resuming after round" in logs[1].read_text() and "resuming" not in logs[0].read_text()

    def restarts(task):
        shown = subprocess.run(["scontrol", "show", "job", f"{jid}_{task}"], env=cluster, capture_output=True,
                               text=True, timeout=30).stdout
        return shown.split("Restarts=")[1].split()[0]

    assert (restarts(0), restarts(1)) == ("0", "1")
    for lr in ("0.05", "0.1"):
        assert_same_metrics(_local_run(straight, tmp_path, f"straight-{lr}", f"train.lr={lr}"),
                            run_metrics(tmp_path / "results" / "slurm" / f"sweep-{lr}-seed0.h5"))

def test_srun_without_an_mpi_plugin_is_refused_with_the_fix(cluster, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    _sbatch(cluster, tmp_path, "--wrap", f"srun --mpi=none {sys.executable} -m hpcfl.launch {job} "
            f"--results-root {tmp_path / 'results'}", status=2)
    text = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert "srun ran without an MPI plugin" in text and "--mpi=pmi2" in text
    assert not (tmp_path / "results").exists()


def test_hpcfl_sweep_submit_sizes_the_job_array_itself(cluster, tmp_path):
    job = tmp_path / "sweep.toml"
    job.write_text(JOB.replace("rounds = 6", "rounds = 2") + '[sweep]\ngrid = { "train.lr" = [0.05, 0.1] }\n')
    out = subprocess.run([sys.executable, "-m", "hpcfl.cli", "sweep", str(job), "--submit", "--max-concurrent", "1",
                          "--script", str(SLURM / "sweep.sbatch"), "--results-root", str(tmp_path / "results"), "--",
                          "--parsable", "-n", "3", "-o", str(tmp_path / "slurm-%A_%a.out")],
                         env=cluster, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "hpcfl: 2 points: sbatch --array=0-1%1 --parsable" in out.stdout
    assert _exit_codes(cluster, out.stdout.split()[-1].split(";")[0]) == {0}
    for name in ("sweep-0.05-seed0", "sweep-0.1-seed0"):
        assert read_run(tmp_path / "results" / "slurm" / f"{name}.h5").attrs["status"] == "completed"


def test_srun_runs_the_console_script_as_an_mpi_job(cluster, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    script = Path(sys.executable).with_name("hpcfl")
    _sbatch(cluster, tmp_path, "--wrap", f"srun --mpi=pmi2 {script} run {job} --results-root {tmp_path / 'results'} "
            "--set run.name='srun'")
    result = read_run(tmp_path / "results" / "slurm" / "srun.h5")
    assert result.attrs["status"] == "completed" and result.attrs["world_size"] == 3
    assert_same_metrics(_local_run(job, tmp_path, "one"), run_metrics(tmp_path / "results" / "slurm" / "srun.h5"))
