"""Result files replayed into TensorBoard event files, read back with TensorBoard's own reader."""
import shutil

import h5py
import numpy as np
import pytest

import hpcfl
from hpcfl.analyze import main
from hpcfl.metrics import read_run

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


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
    assert main(["export", str(tmp_path / "results"), "--out", str(tmp_path / "tb")]) == 0
    out = capsys.readouterr()
    assert "2 run(s) written" in out.out and "corrupt.h5" in out.err
    recorded = read_run(done).arrays
    events = _read(tmp_path / "tb" / "test" / "fedavg-dirichlet-seed0")
    accuracy = events.Scalars("round/test_acc")
    assert [e.step for e in accuracy] == [2, 3]                     # round 1 was not evaluated: left out
    assert np.allclose([e.value for e in accuracy], recorded["round/test_acc"][1:])
    assert [e.step for e in events.Scalars("round/train_loss")] == [1, 2, 3]
    assert "config" in " ".join(events.Tags()["tensors"])
    assert [e.step for e in _read(tmp_path / "tb" / "test" / "crashed").Scalars("round/train_loss")] == [1]
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "tb2")]) == 2
