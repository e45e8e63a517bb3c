"""Result files: round trip, refusals, and readability while written and after SIGKILL."""
import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcfl.errors import ResultsError
from hpcfl.metrics import SCHEMA_VERSION, Recorder, compact, read_run

REPO = Path(__file__).resolve().parents[2]
ATTRS = {
    "name": "run1",
    "seed": 3,
    "lr": 0.1,
    "resumed": False,
    "config": {"fl": {"rounds": 4, "clients": [1, 2]}, "model": "cnn"},
    "hosts": ["node1", "node2"],
}


def _open_files() -> int:
    """HDF5 files this process holds open (a refused create or reopen must not leave one)."""
    return h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)


def write_run(path: Path) -> None:
    partition = np.arange(12, dtype=np.int64).reshape(4, 3)
    with Recorder.create(path, ATTRS) as rec:
        rec.write_array("partition", partition)
        for r in range(4):
            values = {
                "round/test_acc": r / 10,
                "client/train_loss": np.array([r, np.nan, r + 0.5, np.nan]),
                "class/test_acc": np.full(3, r / 2, dtype=np.float32),
            }
            if r != 3:
                values["client/samples"] = np.array([r, 2 * r, 0, 1])
            if r >= 2:
                values["round/bytes_up/model"] = 1000 * r
            rec.append_round(r, values)
        rec.set_attr("status", "completed")
        rec.close()  # closing twice is harmless


def test_round_trip(tmp_path):
    path = tmp_path / "results" / "study" / "run1.h5"
    write_run(path)
    run = read_run(path)

    assert run.rounds == 4
    for name, value in ATTRS.items():
        assert run.attrs[name] == value and type(run.attrs[name]) is type(value)
    assert run.attrs["status"] == "completed"
    assert run.attrs["schema_version"] == SCHEMA_VERSION and run.attrs["created"]

    a = run.arrays
    np.testing.assert_array_equal(a["partition"], np.arange(12).reshape(4, 3))
    np.testing.assert_array_equal(a["round/test_acc"], [0.0, 0.1, 0.2, 0.3])
    assert a["round/test_acc"].dtype == np.float64
    np.testing.assert_array_equal(a["client/train_loss"][2], [2, np.nan, 2.5, np.nan])
    assert a["client/train_loss"].shape == (4, 4)
    assert a["class/test_acc"].dtype == np.float64
    np.testing.assert_array_equal(a["class/test_acc"][:, 0], [0, 0.5, 1, 1.5])
    # First seen at round 2: NaN backfill; an int key missing in round 3: 0.
    np.testing.assert_array_equal(a["round/bytes_up/model"], [np.nan, np.nan, 2000, 3000])
    assert a["client/samples"].dtype == np.int64
    np.testing.assert_array_equal(a["client/samples"], [[0, 0, 0, 1], [1, 2, 0, 1], [2, 4, 0, 1], [0, 0, 0, 0]])


def test_missing_float_key_reads_nan(tmp_path):
    with Recorder.create(tmp_path / "r.h5", {}) as rec:
        rec.append_round(0, {"round/loss": 1.0, "round/acc": 0.5})
        rec.append_round(1, {"round/acc": 0.6})
    run = read_run(tmp_path / "r.h5")
    np.testing.assert_array_equal(run.arrays["round/loss"], [1.0, np.nan])


def test_rounds_out_of_order_and_changed_shape_are_refused(tmp_path):
    path = tmp_path / "r.h5"
    with Recorder.create(path, {}) as rec:
        with pytest.raises(ResultsError, match="expected 0, got 1"):
            rec.append_round(1, {"round/acc": 0.5})
        rec.append_round(0, {"client/loss": np.zeros(4)})
        with pytest.raises(ResultsError, match="expected 1, got 0"):
            rec.append_round(0, {"client/loss": np.zeros(4)})
        with pytest.raises(ResultsError, match="client/loss"):
            rec.append_round(1, {"client/loss": np.zeros(5)})
    assert read_run(path).rounds == 1  # the refused round was not committed


def test_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "run1.h5"
    write_run(path)
    before = path.read_bytes()
    with pytest.raises(ResultsError) as err:
        Recorder.create(path, {"name": "other"})
    assert str(path) in str(err.value) and "run.name" in str(err.value)
    assert path.read_bytes() == before


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from hpcfl.metrics import Recorder
    rec = Recorder.create(sys.argv[1], {"name": "live"})
    for r in range(100):
        rec.append_round(r, {"round/acc": r / 100, "client/loss": np.arange(1000) + r})
        print(r, flush=True)
        sys.stdin.readline()  # keep the file open until the test says go on
    """
)


def test_readable_while_open_and_after_sigkill(tmp_path):
    path = tmp_path / "live.h5"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        for r in range(3):
            assert writer.stdout.readline().strip() == str(r)
            with h5py.File(path, "r") as f:  # default arguments, writer alive and holding the file
                committed = int(f.attrs["committed_rounds"])
                assert committed == r + 1
                np.testing.assert_array_equal(f["client/loss"][r], np.arange(1000) + r)
            writer.stdin.write("\n")
            writer.stdin.flush()
        assert writer.stdout.readline().strip() == "3"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL

    with h5py.File(path, "r") as f:
        assert f.attrs["committed_rounds"] == 4
    run = read_run(path)
    assert run.rounds == 4 and run.attrs["name"] == "live"
    np.testing.assert_array_equal(run.arrays["round/acc"], [0, 0.01, 0.02, 0.03])
    np.testing.assert_array_equal(run.arrays["client/loss"], np.arange(1000) + np.arange(4)[:, None])


def test_corrupt_files_are_refused(tmp_path):
    noise = tmp_path / "noise.h5"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    half = tmp_path / "half.h5"
    write_run(half)
    half.write_bytes(half.read_bytes()[: half.stat().st_size // 2])
    for path in (noise, half, tmp_path / "missing.h5"):
        with pytest.raises(ResultsError, match=re.escape(str(path))):
            read_run(path)


def test_foreign_and_newer_files_are_refused(tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(ResultsError, match="no schema_version"):
        read_run(foreign)

    newer = tmp_path / "newer.h5"
    write_run(newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ResultsError, match=f"schema_version {SCHEMA_VERSION + 1}.*newer hpcfl"):
        read_run(newer)


def test_reader_trusts_only_committed_rows(tmp_path):
    path = tmp_path / "r.h5"
    write_run(path)
    with h5py.File(path, "r+") as f:  # as if the writer died inside round 2
        f.attrs["committed_rounds"] = 2
    run = read_run(path)
    assert run.rounds == 2 and run.arrays["client/train_loss"].shape == (2, 4)
    assert run.arrays["partition"].shape == (4, 3)


def test_a_round_array_shorter_than_the_committed_rounds_makes_the_file_damaged(tmp_path):
    path = tmp_path / "r.h5"
    write_run(path)
    with h5py.File(path, "r+") as f:  # a flush cut short: the array's size reached the disk, the count did not
        rounds = int(f.attrs["committed_rounds"])
        f["round/test_acc"].resize(1, axis=0)
    with pytest.raises(ResultsError, match=rf"r.h5: round/test_acc holds 1 rounds but the file says {rounds} are "
                                           "committed: it is damaged"):
        read_run(path)


def test_reading_named_arrays_reads_those_alone_cut_at_the_committed_rounds(tmp_path):
    path = tmp_path / "r.h5"
    write_run(path)
    with h5py.File(path, "r+") as f:  # as if the writer died inside round 2
        f.attrs["committed_rounds"] = 2
    run = read_run(str(path), keys=["partition", "round/test_acc", "round/absent"])
    assert sorted(run.arrays) == ["partition", "round/test_acc"] and run.rounds == 2
    np.testing.assert_array_equal(run.arrays["round/test_acc"], [0.0, 0.1])
    np.testing.assert_array_equal(run.arrays["partition"], np.arange(12).reshape(4, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.rounds = 5                          # a file's contents, read: not a place to keep edits


def test_bad_attribute_leaves_no_file(tmp_path):
    path = tmp_path / "r.h5"
    with pytest.raises(ResultsError, match="when") as refused:
        Recorder.create(path, {"when": object()})
    assert not path.exists() and _open_files() == 0 and refused.traceback    # closed, not left to the collector
    Recorder.create(path, {"when": "now"}).close()


def test_compact_keeps_every_value_of_a_completed_run_in_a_smaller_file(tmp_path):
    path = tmp_path / "run.h5"
    with Recorder.create(path, {"config": {"run": {"seed": 3}}, "note": "x"}) as recorder:
        recorder.write_array("partition", np.arange(12).reshape(4, 3))
        recorder.write_array("shared_samples", np.arange(1000))                 # 8,000 bytes
        for round in range(5):
            recorder.append_round(round, {"round/test_acc": 0.1 * round, "client/train_loss": np.full(40, round + 0.5),
                                          **({"round/val_acc": 0.2} if round % 2 else {})})
    running = path.read_bytes()
    assert not compact(path) and path.read_bytes() == running           # not completed: may be resumed, untouched
    with h5py.File(path, "r+", locking=False) as file:
        file.attrs["status"] = "completed"
    before = read_run(path)
    size = path.stat().st_size
    assert compact(path) and path.stat().st_size < size / 3
    after = read_run(path)
    assert after.attrs == before.attrs and after.rounds == 5 and set(after.arrays) == set(before.arrays)
    for name, values in before.arrays.items():
        np.testing.assert_array_equal(after.arrays[name], values)       # NaN where a key was absent, too
    assert np.isnan(after.arrays["round/val_acc"][0]) and after.arrays["client/train_loss"].shape == (5, 40)
    assert not compact(path)                                            # once is enough
    with h5py.File(path, "r") as file:                                  # compressed from 4 KiB, contiguous below
        assert file["shared_samples"].compression == "gzip" and file["client/train_loss"].compression is None
        assert file["client/train_loss"].chunks is None


def test_create_writes_the_fixed_arrays_and_a_bad_one_leaves_no_file(tmp_path):
    path = tmp_path / "r.h5"
    Recorder.create(path, {"name": "x"}, {"partition": np.arange(6).reshape(2, 3), "example/test_size": np.int64(7)}
                    ).close()
    run = read_run(path)
    np.testing.assert_array_equal(run.arrays["partition"], [[0, 1, 2], [3, 4, 5]])
    assert int(run.arrays["example/test_size"]) == 7 and run.attrs["name"] == "x"
    with pytest.raises(ResultsError, match="cannot store array 'bad'"):
        Recorder.create(tmp_path / "s.h5", {}, {"partition": np.arange(3), "bad": np.array([object()])})
    assert not (tmp_path / "s.h5").exists()         # the corrected retry is not refused


def test_reopen_drops_the_rows_after_the_checkpoint_and_continues_from_there(tmp_path):
    """A resumed run's checkpoint is after round 2 of 4 written: rows 2 and 3 go (they will be written
    again), fixed arrays stay, the next round must be 2, and the file reads as 2 rounds in between."""
    path = tmp_path / "r.h5"
    write_run(path)
    recorder = Recorder.reopen(path, 2)
    assert read_run(path).rounds == 2
    with h5py.File(path, "r", locking=False) as file:
        assert file["client/train_loss"].shape == (2, 4) and file["round/test_acc"].shape == (2,)
    with pytest.raises(ResultsError, match="expected 2, got 3"):
        recorder.append_round(3, {"round/test_acc": 0.9})
    recorder.append_round(2, {"round/test_acc": 0.7, "client/train_loss": np.ones(4)})
    recorder.close()
    run = read_run(path)
    assert run.rounds == 3 and run.arrays["partition"].shape == (4, 3)
    np.testing.assert_array_equal(run.arrays["round/test_acc"], [0.0, 0.1, 0.7])
    np.testing.assert_array_equal(run.arrays["class/test_acc"][2], [np.nan] * 3)    # a key round 2 did not write
    with pytest.raises(ResultsError, match=r"holds 3 rounds but its checkpoint is after round 4") as refused:
        Recorder.reopen(path, 4)
    assert _open_files() == 0 and refused.traceback      # the refused reopen closed the file
    Recorder.reopen(path, 3).close()            # a checkpoint after the last committed round: nothing to drop


def test_reopen_lowers_the_committed_count_before_it_cuts_any_row(tmp_path, monkeypatch):
    """A resume killed while it cuts the rows must leave a readable file: the count is on disk first,
    so rows beyond it are ignored, never a count beyond the rows."""
    path = tmp_path / "r.h5"
    write_run(path)

    def killed(self, size, axis=None):
        raise RuntimeError("killed while cutting")

    monkeypatch.setattr(h5py.Dataset, "resize", killed)
    with pytest.raises(RuntimeError, match="killed while cutting"):
        Recorder.reopen(path, 2)
    monkeypatch.undo()
    run = read_run(path)
    assert run.rounds == 2 and run.arrays["round/test_acc"].tolist() == [0.0, 0.1]


def test_reopen_drops_the_final_figures_a_run_wrote_before_it_died_so_the_resumed_run_writes_them_again(tmp_path):
    path = tmp_path / "r.h5"
    write_run(path)
    with Recorder.reopen(path, 4) as recorder:
        recorder.write_array("final/feature_nmi", np.float64(0.25))     # then killed before "completed"
    with Recorder.reopen(path, 2) as recorder:
        assert "final/feature_nmi" not in read_run(path).arrays and read_run(path).arrays["partition"].shape == (4, 3)
        recorder.append_round(2, {"round/test_acc": 0.7})
        recorder.write_array("final/feature_nmi", np.float64(0.5))
    assert float(read_run(path).arrays["final/feature_nmi"]) == 0.5


def test_each_append_leaves_the_file_exactly_at_its_committed_rounds(tmp_path):
    """No row past the committed ones, a fresh file commits 0, and each key's chunks hold about 64 KiB
    of rows, between 1 and 1024 rows."""
    path = tmp_path / "r.h5"
    with Recorder.create(path, {}) as recorder:
        assert read_run(path).rounds == 0
        for round in range(3):
            recorder.append_round(round, {"round/acc": 0.5, "client/loss": np.zeros(1000), "rank/big": np.zeros(4097)})
            with h5py.File(path, "r", locking=False) as file:
                assert file.attrs["committed_rounds"] == round + 1
                assert {file[k].shape[0] for k in ("round/acc", "client/loss", "rank/big")} == {round + 1}
                chunks = {k: file[k].chunks[0] for k in ("round/acc", "client/loss", "rank/big")}
        assert chunks == {"round/acc": 1024, "client/loss": 8, "rank/big": 1}      # 8 B, 8,000 B, 32,776 B rows


def test_what_a_recorder_refuses_and_that_it_refuses_after_closing(tmp_path):
    path = tmp_path / "r.h5"
    with Recorder.create(path, {}) as recorder:
        with pytest.raises(ResultsError, match="'round/name' must be a number"):
            recorder.append_round(0, {"round/name": "fedavg"})
        with pytest.raises(ResultsError, match="'committed_rounds' is reserved"):
            recorder.set_attr("committed_rounds", 3)
        with pytest.raises(ResultsError, match="'config' cannot be stored as JSON"):
            recorder.set_attr("config", {"lr": object()})
        recorder.write_array("partition", np.zeros(3))
        with pytest.raises(ResultsError, match="'partition' already exists"):
            recorder.write_array("partition", np.ones(3))
        with pytest.raises(ResultsError, match="'partition' clashes with an existing entry"):
            recorder.append_round(0, {"partition": 1.0})
        with pytest.raises(ResultsError, match="cannot create round value 'round/acc'"):
            recorder.append_round(0, {"round": 1.0, "round/acc": 0.5})            # "round" cannot be both
        recorder.set_attr("note", {"a": 1})
        recorder.set_attr("note", "plain text now")          # no longer JSON: read back as written
    assert read_run(path).attrs["note"] == "plain text now"
    for write in (lambda: recorder.append_round(0, {"round/acc": 0.5}), lambda: recorder.set_attr("status", "x"),
                  lambda: recorder.write_array("other", np.zeros(2))):
        with pytest.raises(ResultsError, match="already closed"):
            write()


def test_compact_compresses_from_4096_bytes_and_keeps_each_arrays_attributes(tmp_path):
    path = tmp_path / "run.h5"
    with Recorder.create(path, {}) as recorder:
        recorder.write_array("at", np.zeros(512))              # 4,096 bytes
        recorder.write_array("below", np.zeros(511))           # 4,088 bytes
        recorder.append_round(0, {"round/acc": 0.5})
        recorder.set_attr("status", "completed")
    assert compact(str(path))
    with h5py.File(path, "r") as file:
        assert file["at"].compression == "gzip" and file["below"].compression is None
        assert file["round/acc"].attrs["axis0"] == "round"     # still a per-round series: a later reopen finds it
        assert file.attrs["schema_version"] == 1               # the format this reader's files carry


STEPS = textwrap.dedent(
    """
    import sys
    import numpy as np
    from hpcfl.metrics import Recorder
    def step(name):
        print(name, flush=True)
        sys.stdin.readline()       # the file stays open while the test reads it from outside
    rec = Recorder.create(sys.argv[1], {"name": "live"})
    step("created")
    rec.write_array("partition", np.arange(4))
    rec.write_array("example/test_size", np.int64(7))
    step("array")
    rec.append_round(0, {"round/acc": 0.5})
    rec.append_round(1, {"round/acc": 0.6})
    rec.set_attr("status", "completed")
    step("status")
    rec.close()
    rec = Recorder.reopen(sys.argv[1], 1)
    step("reopened")
    """
)


def test_every_write_reaches_the_file_before_the_writer_goes_on(tmp_path):
    """Another process sees each step while the writer still holds the file: what `hpcfl status`
    and a crash after that step would see."""
    path = tmp_path / "live.h5"
    writer = subprocess.Popen([sys.executable, "-c", STEPS, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        seen = {}
        for _ in range(4):
            step = writer.stdout.readline().strip()
            seen[step] = read_run(path)
            writer.stdin.write("\n")
            writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
    assert seen["created"].attrs["name"] == "live" and seen["created"].rounds == 0 and not seen["created"].arrays
    assert int(seen["array"].arrays["example/test_size"]) == 7
    assert list(seen["array"].arrays["partition"]) == [0, 1, 2, 3]
    assert seen["status"].attrs["status"] == "completed" and seen["status"].rounds == 2
    assert seen["reopened"].rounds == 1 and list(seen["reopened"].arrays["round/acc"]) == [0.5]
