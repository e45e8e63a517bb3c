"""Checkpoint and resume: a run stopped by a signal, or killed, and started again gives exactly the
metrics of the uninterrupted run, on 1 process and on 3 ranks; a damaged newest checkpoint falls
back to the one before it; a checkpoint that holds more than tensors is refused, not run."""
import hashlib
import io
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch
from helpers import CHECKPOINTED_JOB

from hpcfl.jobs import load_job, resolve
from hpcfl.launch import main
from hpcfl.logs import LOG, configure
from hpcfl.metrics import read_run
from hpcfl.runtime.checkpoint import MANIFEST, checkpoint_root
from hpcfl.testing import assert_same_metrics, run_metrics

JOB = CHECKPOINTED_JOB.format(study="resume")


def _job(tmp_path, algorithm="scaffold"):
    path = tmp_path / f"{algorithm}.toml"
    text = JOB.replace("clients_per_round = 4", "clients_per_round = 6") if algorithm == "fedma" else JOB
    path.write_text(text + f'[algorithm]\nname = "{algorithm}"\n')       # fedma: every client every round
    return path


def _args(job, tmp_path, name):
    return [str(job), "--results-root", str(tmp_path / "results"), "--set", f"run.name={name!r}"]


def _interrupt(job, tmp_path, name, after_round: int, sig) -> int:
    """Launch the job, send `sig` once round `after_round` is logged; the exit status."""
    return _signalled(job, tmp_path, name, {f" round {after_round:>4}/": sig})[0]


def _signalled(job, tmp_path, name, cues: dict) -> tuple[int, str]:
    """Launch the job and send cues[text] once a line with `text` is logged; (exit status, output)."""
    proc = subprocess.Popen([sys.executable, "-m", "hpcfl.launch", *_args(job, tmp_path, name)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        for text in [text for text in cues if text in line]:
            proc.send_signal(cues.pop(text))
    return proc.wait(timeout=120), "".join(lines)


# scaffold: client state; moon: a loss term's client state; fedma: global widths carried over; fedadagrad,
# fedadam, fedyogi: the server's moments
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "moon", "fedma", "fedadagrad", "fedadam", "fedyogi"])
def test_a_signalled_run_resumes_to_exactly_the_uninterrupted_metrics(algorithm, tmp_path, capsys):
    job = _job(tmp_path, algorithm)
    assert main(_args(job, tmp_path, "full")) == 0
    assert _interrupt(job, tmp_path, "cut", 3, signal.SIGUSR1) == 3          # checkpointed, asks to be requeued
    path = load_job(job, [f"run.results_root={str(tmp_path / 'results')!r}", "run.name='cut'"]).result_path
    stopped = read_run(path)
    assert stopped.attrs["status"] == "interrupted" and len(stopped.arrays["round/test_acc"]) < 6
    assert main(_args(job, tmp_path, "cut")) == 0
    assert "resuming after round" in capsys.readouterr().out
    assert_same_metrics(run_metrics(path.with_name("full.h5")), run_metrics(path), exact=True)
    assert read_run(path).attrs["status"] == "completed" and not checkpoint_root(path).exists()
    assert main(_args(job, tmp_path, "cut")) == 0                            # complete: nothing to do
    assert "already complete" in capsys.readouterr().out


def test_ctrl_c_checkpoints_after_the_round_and_the_run_resumes_to_the_same_metrics(tmp_path, capsys):
    job = _job(tmp_path, "fedavg")
    assert main(_args(job, tmp_path, "full")) == 0
    code, out = _signalled(job, tmp_path, "cut", {" round    3/": signal.SIGINT})
    assert code == 3 and "Traceback" not in out and out.count("run the same command again to resume") == 1, out
    path = tmp_path / "results" / "resume" / "cut.h5"
    assert read_run(path).attrs["status"] == "interrupted" and read_run(path).rounds < 6
    assert main(_args(job, tmp_path, "cut")) == 0
    assert "resuming after round" in capsys.readouterr().out
    assert_same_metrics(run_metrics(path.with_name("full.h5")), run_metrics(path), exact=True)


def test_a_second_ctrl_c_aborts_at_once_in_one_line(tmp_path):
    job = _job(tmp_path, "fedavg")
    job.write_text(job.read_text().replace("momentum = 0.5", "momentum = 0.5\nlocal_epochs = 10"))  # a round > 1 s
    cues = {" round    2/": signal.SIGINT, "Ctrl-C again to abort": signal.SIGINT}
    code, out = _signalled(job, tmp_path, "cut", cues)
    assert code == 1 and "interrupted (Ctrl-C): stopped at once" in out and "Traceback" not in out, out
    assert 2 <= read_run(tmp_path / "results" / "resume" / "cut.h5").rounds < 6


def test_a_killed_run_resumes_from_its_last_checkpoint_and_redoes_later_rounds(tmp_path, capsys):
    job = _job(tmp_path)
    assert main(_args(job, tmp_path, "full")) == 0
    assert _interrupt(job, tmp_path, "cut", 3, signal.SIGKILL) == -signal.SIGKILL
    path = tmp_path / "results" / "resume" / "cut.h5"
    assert read_run(path).attrs["status"] == "running"
    assert main(_args(job, tmp_path, "cut")) == 0
    assert "resuming after round 2 " in capsys.readouterr().out           # round 3 is done again
    assert_same_metrics(run_metrics(tmp_path / "results" / "resume" / "full.h5"), run_metrics(path), exact=True)


def test_a_node_crash_that_tore_the_result_file_resumes_from_the_checkpoints_copy(tmp_path, capsys):
    """The rounds a checkpoint covers are not lost with the result file: after a kill, the file torn as a
    crashed node can leave it, the run resumes from the checkpoint's copy to the uninterrupted metrics."""
    job = _job(tmp_path)
    assert main(_args(job, tmp_path, "full")) == 0
    assert _interrupt(job, tmp_path, "cut", 3, signal.SIGKILL) == -signal.SIGKILL
    path = tmp_path / "results" / "resume" / "cut.h5"
    path.write_bytes(path.read_bytes()[:2048])
    assert main(_args(job, tmp_path, "cut")) == 0
    out = capsys.readouterr()
    assert "put back the result file of checkpoint round-000002 (cut.h5 is kept as cut.h5.damaged)" in out.err
    assert "resuming after round 2 " in out.out
    assert_same_metrics(run_metrics(tmp_path / "results" / "resume" / "full.h5"), run_metrics(path), exact=True)
    assert [segment["first_round"] for segment in read_run(path).attrs["segments"]] == [0, 2]


def test_fedfm_lite_resumes_between_model_rounds_to_the_uninterrupted_metrics(tmp_path, capsys):
    """Models go out at rounds 0 and 4 only: a run resumed at round 2 continues each client's own model
    (it used to start them from a global model the resumed workers never received, and crash)."""
    job = tmp_path / "lite.toml"
    job.write_text(JOB.replace("clients_per_round = 4", "clients_per_round = 6") + '[algorithm]\nname = "fedfm_lite"\n'
                   'params = { model_every = 4, start_round = 1, weight = 1.0 }\n')
    assert main(_args(job, tmp_path, "full")) == 0
    assert _interrupt(job, tmp_path, "cut", 3, signal.SIGKILL) == -signal.SIGKILL
    assert main(_args(job, tmp_path, "cut")) == 0
    assert "resuming after round 2 " in capsys.readouterr().out
    path = tmp_path / "results" / "resume" / "cut.h5"
    assert_same_metrics(run_metrics(tmp_path / "results" / "resume" / "full.h5"), run_metrics(path), exact=True)


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path, capsys):
    job = _job(tmp_path)
    assert main(_args(job, tmp_path, "full")) == 0
    assert _interrupt(job, tmp_path, "cut", 3, signal.SIGUSR1) == 3
    root = checkpoint_root(tmp_path / "results" / "resume" / "cut.h5")
    assert len(list(root.glob("round-*"))) == 2                           # run.checkpoint_keep
    newest = sorted(root.glob("round-*"))[-1]
    (newest / "server.pt").write_bytes(b"half a file")
    (root / "round-000005.partial").mkdir()                                # a write that never finished
    assert main(_args(job, tmp_path, "cut")) == 0
    out = capsys.readouterr()
    assert f"WARNING checkpoint {newest} is damaged" in out.err and "resuming after round 2 " in out.out
    assert_same_metrics(run_metrics(tmp_path / "results" / "resume" / "full.h5"),
                        run_metrics(tmp_path / "results" / "resume" / "cut.h5"), exact=True)


class _Exploit:
    def __reduce__(self):
        return os.system, ("touch exploited",)


def test_a_checkpoint_holding_more_than_tensors_is_refused_not_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = _job(tmp_path)
    assert _interrupt(job, tmp_path, "cut", 2, signal.SIGUSR1) == 3
    exploit = pickle.dumps({"model.conv.0.weight": _Exploit()}, protocol=2)     # torch.save's protocol
    _replace_in_checkpoint(tmp_path, "server.pt", exploit)
    assert main(_args(job, tmp_path, "cut")) == 2
    assert "holds more than tensors" in capsys.readouterr().err
    assert not (tmp_path / "exploited").exists()


def _replace_in_checkpoint(tmp_path, name: str, data: bytes) -> None:
    """Put `data` in the newest checkpoint as file `name`, with a matching checksum in its manifest."""
    newest = sorted(checkpoint_root(tmp_path / "results" / "resume" / "cut.h5").glob("round-*"))[-1]
    (newest / name).write_bytes(data)
    files = json.loads((newest / MANIFEST).read_text())
    files["files"][name] = hashlib.sha256(data).hexdigest()
    (newest / MANIFEST).write_text(json.dumps(files))


def test_client_states_in_the_flat_table_of_hpcfl_0_1_are_refused_with_the_fix(tmp_path, capsys):
    job = _job(tmp_path)
    assert _interrupt(job, tmp_path, "cut", 2, signal.SIGUSR1) == 3
    newest = sorted(checkpoint_root(tmp_path / "results" / "resume" / "cut.h5").glob("round-*"))[-1]
    part = torch.load(newest / "clients-rank0.pt", weights_only=True)
    assert part["clients"] and all(set(kept["algorithm"]) == {"control"} and not kept["terms"]   # scaffold's own
                                   for kept in part["clients"].values())
    part["clients"] = {cid: {f"control.{n}": t for n, t in kept["algorithm"]["control"].items()}   # as 0.1 wrote
                       for cid, kept in part["clients"].items()}                                   # them, and
    manifest = json.loads((newest / MANIFEST).read_text())                                         # no format
    assert manifest.pop("format") == 2
    (newest / MANIFEST).write_text(json.dumps(manifest))
    buffer = io.BytesIO()
    torch.save(part, buffer)
    _replace_in_checkpoint(tmp_path, "clients-rank0.pt", buffer.getvalue())
    assert main(_args(job, tmp_path, "cut")) == 2
    assert "as earlier hpcfl did (0.1" in capsys.readouterr().err


def test_a_resume_refused_in_set_up_leaves_the_rounds_after_the_checkpoint_in_the_file(tmp_path, capsys):
    """The file is cut back to the checkpoint only once every rank is set up: a refused resume keeps them."""
    job = _job(tmp_path)
    assert _interrupt(job, tmp_path, "cut", 3, signal.SIGKILL) == -signal.SIGKILL
    path = tmp_path / "results" / "resume" / "cut.h5"
    newest = sorted(checkpoint_root(path).glob("round-*"))[-1]
    done = read_run(path).rounds
    assert done > int(newest.name.split("-")[1])                 # rounds after the checkpoint
    manifest = json.loads((newest / MANIFEST).read_text())
    (newest / MANIFEST).write_text(json.dumps({**manifest, "format": 1}))
    assert main(_args(job, tmp_path, "cut")) == 2
    assert "as earlier hpcfl did (0.1" in capsys.readouterr().err
    assert read_run(path).rounds == done


def test_a_result_file_of_another_configuration_is_not_resumed(tmp_path, capsys):
    job = _job(tmp_path)
    assert _interrupt(job, tmp_path, "cut", 2, signal.SIGUSR1) == 3
    assert main([*_args(job, tmp_path, "cut"), "--set", "train.lr=0.1"]) == 2
    err = capsys.readouterr().err
    assert "another configuration" in err and "(train.lr: 0.05 in the file, 0.1 here)" in err, err
    assert "and its checkpoints (cut.ckpt)" in err                 # there are some: they go with the file
    assert main([*_args(job, tmp_path, "cut"), "--set", "data.seed=5", "--set", "train.batch_size=8"]) == 2
    err = capsys.readouterr().err                                  # another split, and another batch size
    assert "another configuration" in err and "(data.seed: -1 in the file, 5 here; train.batch_size: 16 in " in err
    free = ["run.checkpoint_every=3", "run.device='cpu'", "run.placement='fixed'", "train.on_nonfinite='drop'"]
    assert main([*_args(job, tmp_path, "cut"), *(a for key in free for a in ("--set", key))]) == 0
    assert read_run(tmp_path / "results" / "resume" / "cut.h5").rounds == 6


def test_a_run_recorded_under_the_old_name_of_algorithm_terms_resumes(tmp_path):
    job = _job(tmp_path)
    assert _interrupt(job, tmp_path, "cut", 2, signal.SIGUSR1) == 3
    with h5py.File(tmp_path / "results" / "resume" / "cut.h5", "r+") as file:      # as hpcfl 0.1 wrote it
        config = json.loads(file.attrs["config"])
        config["algorithm"]["regularizers"] = config["algorithm"].pop("terms")
        file.attrs["config"] = json.dumps(config)
    assert main(_args(job, tmp_path, "cut")) == 0
    assert read_run(tmp_path / "results" / "resume" / "cut.h5").rounds == 6


class _StopAfter(logging.Handler):
    """Signals this rank (the server's) once it logs round `round`: the run stops after that round."""
    def __init__(self, round):
        super().__init__()
        self.round = round

    def emit(self, record):
        from hpcfl.runtime.resume import STOP

        if record.getMessage().startswith(f"round {self.round:>4}/"):
            STOP.set()


def _execute(job_file, results, name, transport, stop_after=None) -> bool:
    """Run the job in this process on `transport` (stopped after round `stop_after`); True if it finished."""
    from hpcfl.runtime.build import setup
    from hpcfl.runtime.loop import run
    from hpcfl.runtime.resume import STOP

    config = load_job(job_file, [f"run.results_root={str(results)!r}", f"run.name={name!r}"])
    configure(transport.rank, run=name)
    stopper = _StopAfter(stop_after) if stop_after and transport.is_server else None
    if stopper:
        LOG.addHandler(stopper)
    try:
        job = setup(resolve(config), transport, None)
        finished = run(job)
    finally:
        STOP.clear()
        if stopper:
            LOG.removeHandler(stopper)
    if job.recorder:
        job.recorder.set_attr("status", "completed" if finished else "interrupted")
        job.recorder.close()
    transport.close()
    return finished


def _lite_dropping(tmp_path):
    """FedFM-Lite sending models at rounds 0 and 4, where client 4 blows up in round 0 and is dropped: back
    to its state of before that round, it starts the next rounds from the latest global model."""
    job = tmp_path / "lite.toml"
    job.write_text(JOB.replace("clients_per_round = 4", "clients_per_round = 6").replace("lr = 0.05", "lr = 5.0")
                   + 'on_nonfinite = "drop"\n[algorithm]\nname = "fedfm_lite"\n'
                   'params = { model_every = 4, start_round = 1, weight = 1.0 }\n')
    return job


def _resumed_equals_uninterrupted(job, results, transport, server: bool, stop_after: int, dropped=None):
    """The job run whole, then stopped after round `stop_after` and resumed: exactly the same metrics."""
    assert _execute(job, results, "full", transport())
    assert not _execute(job, results, "cut", transport(), stop_after)
    assert _execute(job, results, "cut", transport())
    if server:
        full = run_metrics(results / "resume" / "full.h5")
        if dropped:                                 # the case the run is built for did happen
            assert full["client/nonfinite"][dropped].tolist() == [0, 0, 0, 0, 1, 0]
        assert_same_metrics(full, run_metrics(results / "resume" / "cut.h5"), exact=True)


def test_fedfm_lite_resumed_right_after_a_model_round_has_the_global_model_for_a_dropped_client(tmp_path):
    """Resumed at round 1, client 4 (dropped in round 0) starts from the model broadcast in round 0, which
    the resumed workers never received: the checkpoint keeps it (a resume used to crash here)."""
    from hpcfl.transport import LocalTransport

    _resumed_equals_uninterrupted(_lite_dropping(tmp_path), tmp_path / "results", lambda: LocalTransport({}), True,
                                  stop_after=1, dropped=0)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedfm_lite"])
def test_under_mpi_a_signalled_run_resumes_to_exactly_the_uninterrupted_metrics(algorithm, tmp_path):
    """fedfm_lite: the server, which trains no client, keeps the global model its workers lost."""
    from mpi4py import MPI

    from hpcfl.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD
    base = comm.bcast(str(tmp_path), root=0)
    job_file = None
    if comm.Get_rank() == 0:
        job_file = _lite_dropping(tmp_path) if algorithm == "fedfm_lite" else _job(tmp_path, algorithm)
    job_file = comm.bcast(str(job_file), root=0)
    lite = algorithm == "fedfm_lite"
    try:
        _resumed_equals_uninterrupted(job_file, Path(base) / "results", lambda: MpiTransport({}, comm),
                                      comm.Get_rank() == 0, stop_after=1 if lite else 3, dropped=0 if lite else None)
    finally:
        comm.Barrier()


def test_a_file_written_with_another_split_of_the_data_is_not_resumed(tmp_path, capsys):
    """The configuration matches, but the clients held other samples (an hpcfl that splits differently):
    its rounds and the resumed ones would not be one run."""
    job = _job(tmp_path, "fedavg")
    assert main(_args(job, tmp_path, "cut")) == 0
    path = tmp_path / "results" / "resume" / "cut.h5"
    with h5py.File(path, "r+") as file:                    # as if stopped after round 1, by another split
        file.attrs["status"], file.attrs["committed_rounds"] = "interrupted", 1
        counts = file["partition"][()]
        counts[0, :2] += [1, -1]                            # one sample of class 1 is of class 0 now
        file["partition"][...] = counts
    assert main(_args(job, tmp_path, "cut")) == 2
    assert (f"{path} was written with another split of the data (its clients' class counts, `partition`, differ"
            in capsys.readouterr().err)
    assert read_run(path).rounds == 1                       # left as it was
