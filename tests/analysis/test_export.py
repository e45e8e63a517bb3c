"""Result files replayed into an offline tracker (TensorBoard, MLflow, W&B), read back with each one's own reader
(W&B: its record protobufs, from the LevelDB-style log it writes)."""
import json
import shutil
import struct
import time

import h5py
import numpy as np
import pytest

import hpcfl
from hpcfl.analyze import main
from hpcfl.metrics import read_run

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


@pytest.fixture(scope="module")
def finished_and_crashed(tmp_path_factory):
    """A finished 3-round run evaluated after rounds 2 and 3, and a copy cut to one committed round."""
    folder = tmp_path_factory.mktemp("runs")
    job = folder / "job.toml"
    from conftest import TINY_JOB
    job.write_text(TINY_JOB.format(algorithm="fedavg", rounds=3, seed=0) + "[eval]\nevery = 2\n")
    done = hpcfl.run(job, [f"run.results_root={str(folder / 'results')!r}"], quiet=True)
    crashed = done.with_name("crashed.h5")
    shutil.copy(done, crashed)
    with h5py.File(crashed, "r+") as file:
        file.attrs["status"], file.attrs["committed_rounds"], file.attrs["run"] = "running", 1, "crashed"
    return done, crashed


def _read(folder):
    events = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_export_writes_every_evaluated_round_and_a_crashed_runs_committed_ones(tiny_job, tmp_path, capsys):
    job = tiny_job(rounds=3, extra="[eval]\nevery = 2\n")          # test accuracy after rounds 2 and 3 only
    done = hpcfl.run(job, [f"run.results_root={str(tmp_path / 'results')!r}"], quiet=True)
    crashed = done.with_name("crashed.h5")
    shutil.copy(done, crashed)
    with h5py.File(crashed, "r+") as file:                          # killed after its first round
        file.attrs["status"], file.attrs["committed_rounds"], file.attrs["run"] = "running", 1, "crashed"
    (tmp_path / "results" / "test" / "corrupt.h5").write_bytes(b"not HDF5")
    for _ in range(2):                                             # a second export replaces the first
        assert main(["export", str(tmp_path / "results"), "--out", str(tmp_path / "tb")]) == 0
    out = capsys.readouterr()
    assert "2 run(s) written" in out.out and "corrupt.h5" in out.err
    recorded = read_run(done).arrays
    events = _read(tmp_path / "tb" / "test" / "fedavg-dirichlet-seed0")
    accuracy = events.Scalars("round/test_acc")
    assert [e.step for e in accuracy] == [2, 3]                     # round 1 was not evaluated: left out
    assert np.allclose([e.value for e in accuracy], recorded["round/test_acc"][1:])
    assert [e.step for e in events.Scalars("round/train_loss")] == [1, 2, 3]
    assert {"config/text_summary", "status/text_summary"} <= set(events.Tags()["tensors"])
    assert [e.step for e in _read(tmp_path / "tb" / "test" / "crashed").Scalars("round/train_loss")] == [1]
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "tb2")]) == 2
    assert f"hpcfl: error: no result file to export in {tmp_path / 'nothing'}" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert main(["export", str(tmp_path / "results"), "--out", str(tmp_path / "afile")]) == 2     # not a folder
    assert "hpcfl: error: " in capsys.readouterr().err


def test_mlflow_export_holds_every_figure_the_configuration_and_replaces_an_earlier_export(finished_and_crashed,
                                                                                          tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    done, crashed = finished_and_crashed
    for _ in range(2):                                  # a second export replaces the first
        assert main(["export", str(done.parent), "--to", "mlflow", "--out", str(tmp_path / "ml")]) == 0
    client = MlflowClient(tracking_uri=(tmp_path / "ml").as_uri())
    found = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert sorted(r.info.run_name for r in found) == ["crashed", "fedavg-dirichlet-seed0"]     # none twice
    runs = {r.info.run_name: r for r in found}
    run = runs["fedavg-dirichlet-seed0"]
    recorded = read_run(done).arrays
    accuracy = client.get_metric_history(run.info.run_id, "round/test_acc")
    assert sorted(m.step for m in accuracy) == [2, 3]
    assert np.allclose([m.value for m in sorted(accuracy, key=lambda m: m.step)], recorded["round/test_acc"][1:])
    assert run.data.params["train.lr"] == str(read_run(done).attrs["config"]["train"]["lr"])
    assert run.data.tags["hpcfl.status"] == "completed" and run.info.status == "FINISHED"
    crashed_run = runs["crashed"]
    assert [m.step for m in client.get_metric_history(crashed_run.info.run_id, "round/train_loss")] == [1]
    assert crashed_run.data.tags["hpcfl.committed_rounds"] == "1" and crashed_run.info.status == "FAILED"


def _wandb_records(path):
    """The records of a W&B offline run file: a 7-byte W&B header, then LevelDB log blocks of 32 KiB whose
    records (7-byte header: CRC, length, type 1 full / 2 first / 3 middle / 4 last) hold protobufs."""
    from wandb.proto import wandb_internal_pb2
    data, position, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:                # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        chunk, position = data[position + 7:position + 7 + length], position + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _finished(path, timeout: float = 60.0) -> list:
    """The records of a W&B offline run file once it holds its exit record, the last W&B writes. The
    file is written by W&B's own service process; in one CI run it held no run record when read
    just after the export (cause not isolated): wait for the file to end before reading it, and
    give up after `timeout`, so a run record that never comes still fails the test."""
    from google.protobuf.message import DecodeError

    end = time.monotonic() + timeout
    while True:
        try:
            records = list(_wandb_records(path))
        except DecodeError:                             # a record cut short: still being written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > end:
            return records
        time.sleep(0.2)


def test_wandb_export_writes_an_offline_run_per_result_file_with_every_figure(finished_and_crashed, tmp_path):
    pytest.importorskip("wandb")
    done, crashed = finished_and_crashed
    for _ in range(2):                                  # a second export replaces the first
        assert main(["export", str(done), str(crashed), "--to", "wandb", "--out", str(tmp_path / "wb")]) == 0
    runs = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    history, config, summary = {}, {}, {}
    for folder in runs:
        (log,) = folder.glob("run-*.wandb")
        records = _finished(log)                      # W&B may log a history record before the run record
        run = [r.run for r in records if r.WhichOneof("record_type") == "run"][-1]
        assert run.project == "test"                    # the run's study
        config[run.display_name] = {i.key: json.loads(i.value_json) for i in run.config.update}
        history[run.display_name] = [{i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                      for i in r.history.item}
                                     for r in records if r.WhichOneof("record_type") == "history"]
        summary[run.display_name] = {i.key: json.loads(i.value_json) for r in records
                                     if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
    recorded = read_run(done).arrays
    rounds = history["fedavg-dirichlet-seed0"]
    assert [r["_step"] for r in rounds] == [1, 2, 3]
    assert "round/test_acc" not in rounds[0]            # round 1 was not evaluated: left out, not NaN
    assert np.allclose([r["round/test_acc"] for r in rounds[1:]], recorded["round/test_acc"][1:])
    assert np.allclose([r["round/train_loss"] for r in rounds], recorded["round/train_loss"])
    assert config["fedavg-dirichlet-seed0"]["train"]["lr"] == read_run(done).attrs["config"]["train"]["lr"]
    assert [r["_step"] for r in history["crashed"]] == [1]
    assert {k: summary["crashed"][k] for k in ("status", "committed_rounds")} == {"status": "running",
                                                                                  "committed_rounds": 1}


def test_an_export_whose_tracker_is_not_installed_names_the_package(finished_and_crashed, tmp_path, monkeypatch,
                                                                    capsys):
    import builtins
    real_import = builtins.__import__

    def without_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without_wandb)
    assert main(["export", str(finished_and_crashed[0]), "--to", "wandb", "--out", str(tmp_path)]) == 2
    assert "pip install wandb (or, in hpcfl's checkout, pip install '.[wandb]')" in capsys.readouterr().err


def test_mlflow_takes_a_long_configuration_in_batches_of_100_each_value_cut_to_its_limit(tmp_path, monkeypatch):
    """250 parameters and 230 steps go up in batches MLflow accepts, every one once; a value longer than
    MLflow's 6000 characters is cut; each figure is stamped with the export's time. The export allows
    MLflow's file store itself."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hpcfl.analysis.export import Replay, export, to_mlflow
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")                  # unset, and restored after the test
    config = {"t": {f"k{i:03d}": i for i in range(249)}, "long": "x" * 7000}
    replay = Replay("study", "run", config, "completed", 230, [("round/train_loss", s, s / 10) for s in range(1, 231)])
    before = int(time.time() * 1000)
    to_mlflow(replay, tmp_path / "ml")
    client = MlflowClient(tracking_uri=(tmp_path / "ml").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("study").experiment_id])
    assert len(run.data.params) == 250 and run.data.params["long"] == "x" * 6000 and run.data.params["t.k248"] == "248"
    history = client.get_metric_history(run.info.run_id, "round/train_loss")
    assert sorted(m.step for m in history) == list(range(1, 231))
    assert all(before <= m.timestamp <= time.time() * 1000 for m in history)
    written, problems = export([], str(tmp_path / "new" / "folder"), to="mlflow")         # a folder it makes
    assert (written, problems) == ([], []) and (tmp_path / "new" / "folder").is_dir()
    quoted = Replay("study", "bob's", {}, "completed", 1, [("round/train_loss", 1, 0.5)])
    for _ in range(2):                                  # a quote in the name; the second export replaces the first
        to_mlflow(quoted, tmp_path / "ml")
    study = client.get_experiment_by_name("study").experiment_id
    names = [r.data.tags["hpcfl.run"] for r in client.search_runs([study])]
    assert sorted(names) == ["bob's", "run"]


def test_only_a_runs_series_and_final_figures_are_replayed(tmp_path):
    """Per-round scalars by round (1, 2, ...), final figures at the last committed round, finite values
    only; a per-round array of several values per round is not a series and is left out."""
    from hpcfl.analysis.export import Replay
    from hpcfl.metrics import Recorder
    recorder = Recorder.create(tmp_path / "r.h5", {"study": "s", "run": "r", "config": {"x": 1}})
    for round, loss in enumerate((0.5, float("nan"), 0.25)):
        recorder.append_round(round, {"round/train_loss": loss, "round/pair": np.array([1.0, 2.0]),
                                      "client/train_loss": np.array([loss, loss])})
    recorder.write_array("final/feature_nmi", np.float64(0.75))
    recorder.close()
    replay = Replay.of(tmp_path / "r.h5")
    assert replay.scalars == [("final/feature_nmi", 3, 0.75), ("round/train_loss", 1, 0.5),
                              ("round/train_loss", 3, 0.25)]
    assert (replay.study, replay.name, replay.status, replay.rounds) == ("s", "r", "running", 3)
    assert replay.config == {"x": 1}
    assert replay.by_step() == {1: {"round/train_loss": 0.5}, 3: {"final/feature_nmi": 0.75, "round/train_loss": 0.25}}


def test_a_tracker_is_given_the_job_as_it_ran_with_the_defaults_it_left_out(tmp_path):
    """The job wrote no FedProx mu; the run used the default, which the `resolved` tables record."""
    from hpcfl.analysis.export import Replay
    from hpcfl.metrics import Recorder
    config = {"run": {"seed": 0}, "algorithm": {"name": "fedprox", "params": {}}}
    resolved = {"algorithm": {"params": {"mu": 0.01}, "terms": {}}}
    Recorder.create(tmp_path / "r.h5", {"run": "r", "config": config, "resolved": resolved}).close()
    ran = {"run": {"seed": 0}, "algorithm": {"name": "fedprox", "params": {"mu": 0.01}, "terms": {}}}
    assert Replay.of(tmp_path / "r.h5").config == ran


def test_files_of_one_export_with_the_same_study_and_run_keep_a_run_each(tmp_path, capsys):
    """Two results roots holding study s, run r with different losses: each gets its own folder, named
    after its resolved path, which a second export replaces rather than adds to; a run whose name no
    other file shares keeps it."""
    import hashlib

    from hpcfl.metrics import Recorder
    losses = {"a": 0.5, "b": 0.25}
    for root, loss in losses.items():
        with Recorder.create(tmp_path / root / "s" / "r.h5", {"study": "s", "run": "r", "config": {}}) as recorder:
            recorder.append_round(0, {"round/train_loss": loss})
    with Recorder.create(tmp_path / "a" / "s" / "q.h5", {"study": "s", "run": "q", "config": {}}) as recorder:
        recorder.append_round(0, {"round/train_loss": 1.0})
    for _ in range(2):
        assert main(["export", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "tb")]) == 0
        assert "3 run(s) written" in capsys.readouterr().out
    named = {root: "r-" + hashlib.sha256(str((tmp_path / root / "s" / "r.h5").resolve()).encode()).hexdigest()[:8]
             for root in losses}
    assert sorted(p.name for p in (tmp_path / "tb" / "s").iterdir()) == sorted([*named.values(), "q"])
    for root, loss in losses.items():
        folder = tmp_path / "tb" / "s" / named[root]
        assert len(list(folder.iterdir())) == 1                     # one event file: replaced, not added to
        assert [e.value for e in _read(folder).Scalars("round/train_loss")] == [loss]
    with Recorder.create(tmp_path / "a" / "s" / "torn.h5", {"study": "s", "run": "torn", "config": {}}) as recorder:
        recorder.append_round(0, {"round/train_loss": 1.0})
    with h5py.File(tmp_path / "a" / "s" / "torn.h5", "r+") as file:    # its attributes read, its rounds do not
        file.attrs["committed_rounds"] = 5
    from hpcfl.analysis.export import export
    written, problems = export([tmp_path / "a"], tmp_path / "tb3")
    assert len(written) == 2 and len(problems) == 1 and "torn.h5: round/train_loss holds 1 rounds" in problems[0]
