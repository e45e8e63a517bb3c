"""The runner end to end through its command line, on real data (scikit-learn digits, Fashion-MNIST)."""
import socket
import time
from dataclasses import asdict

import h5py
import numpy as np
import pytest
from helpers import FAULT_LAUNCHER, launch

from hpcfl.algorithms import ALGORITHMS
from hpcfl.errors import Exit
from hpcfl.metrics import read_run
from hpcfl.models import build_model, count_parameters, model_options
from hpcfl.testing import assert_same_metrics, run_metrics


def test_one_process_and_three_ranks_give_the_same_metrics(tiny_job, tmp_path):
    job = tiny_job(rounds=3)
    splits = ["--set", "data.validation_fraction=0.2", "--set", "data.local_test_ratio=0.3"]
    single = launch(job, *splits, "--results-root", tmp_path / "one")
    multi = launch(job, *splits, "--results-root", tmp_path / "three", ranks=3)
    assert single.returncode == 0, single.stderr
    assert multi.returncode == 0, multi.stderr
    name = "test/fedavg-dirichlet-seed0.h5"
    one, three = run_metrics(tmp_path / "one" / name), run_metrics(tmp_path / "three" / name)
    for key in ("round/test_acc", "client/train_loss", "client/val_acc", "client/local_test_acc",
                "round/personal_acc_mean"):
        assert key in one, key
    assert_same_metrics(one, three)
    ranks = read_run(tmp_path / "three" / name).arrays["client/rank"]
    assert set(ranks[np.isfinite(ranks)]) == {1, 2}              # the server trains no client


# The launcher with mpi4py made unimportable, as after `pip install hpcfl` without the `mpi` extra;
# it prints which imports of mpi4py were tried.
WITHOUT_MPI4PY = """
import atexit, sys
class NoMpi4py:
    tried = []
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mpi4py":
            NoMpi4py.tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoMpi4py())
atexit.register(lambda: print("mpi4py imports tried:", NoMpi4py.tried))
from hpcfl.launch import main
sys.exit(main(sys.argv[1:]))
"""


def test_one_process_runs_without_mpi4py_and_mpirun_without_it_stops_with_the_fix(tiny_job, tmp_path):
    job = tiny_job(rounds=1)
    alone = launch(job, "--results-root", tmp_path / "one", launcher=("-c", WITHOUT_MPI4PY))
    assert alone.returncode == Exit.DONE and "mpi4py imports tried: []" in alone.stdout, alone.stderr
    ranks = launch(job, "--results-root", tmp_path / "two", ranks=2, launcher=("-c", WITHOUT_MPI4PY))
    assert ranks.returncode == Exit.BAD_INPUT, ranks.stderr
    assert "mpi4py cannot be imported" in ranks.stderr and 'pip install "hpcfl[mpi]"' in ranks.stderr
    assert not (tmp_path / "two").exists()                      # refused before anything was written


def test_result_file_records_the_run(tiny_job, tmp_path):
    start = time.perf_counter()
    result = launch(tiny_job(rounds=2), "--results-root", tmp_path)
    wall = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert "round    2/2  test_acc" in result.stdout                   # one progress line per round
    run = read_run(tmp_path / "test" / "fedavg-dirichlet-seed0.h5")
    assert run.rounds == 2 and run.attrs["status"] == "completed"
    assert run.attrs["config"]["train"]["lr"] == 0.1 and run.attrs["world_size"] == 1
    assert run.attrs["hostnames"] == [socket.gethostname()] and run.attrs["versions"]["torch"]
    assert run.attrs["config"]["algorithm"]["params"] == {}                     # the job set none: the defaults
    assert run.attrs["resolved"] == {"algorithm": {"params": asdict(ALGORITHMS["fedavg"].Params()), "terms": {}},
                                     "model": {"params": asdict(model_options("fmnist_cnn")())},
                                     "data": {"partition_params": {"beta": 0.5}}}
    setup_peak = run.attrs["setup_max_rss_bytes"]
    assert len(setup_peak) == 1 and setup_peak[0] > 200 * 2 ** 20       # torch and the data are in set-up's peak
    setup_s = run.attrs["setup_s"]
    assert len(setup_s) == 1 and 0 < setup_s[0] < wall - run.arrays["round/time_s"].sum()   # within the process
    partition = run.arrays["partition"]
    assert partition.shape == (6, 10) and partition.sum() == 1438      # every digits training sample
    assert "client/val_acc" not in run.arrays                         # no validation split configured
    train_loss = run.arrays["client/train_loss"]
    assert train_loss.shape == (2, 6) and (np.isfinite(train_loss).sum(1) == 4).all()   # NaN = not sampled
    with h5py.File(tmp_path / "test" / "fedavg-dirichlet-seed0.h5", "r") as f:       # plain h5py reads it
        model_numel = count_parameters(build_model("fmnist_cnn", (1, 8, 8), 10))
        assert f["round/bytes_down/model"][0] == 4 * model_numel * 4           # 4 clients, float32
        assert f["round/bytes_up/model"][0] == 4 * (model_numel + 1) * 4       # plus the weight scalar
        assert f["class/test_acc"].shape == (2, 10)


def test_fedavg_learns_on_real_data(tiny_job, tmp_path):
    result = launch(tiny_job(rounds=8), "--set", "train.local_epochs=2", "--results-root", tmp_path)
    assert result.returncode == 0, result.stderr
    acc = read_run(tmp_path / "test" / "fedavg-dirichlet-seed0.h5").arrays["round/test_acc"]
    assert acc[-1] > 0.8, acc          # 10 classes: chance is 0.1; an unnormalised average diverges


def test_never_overwrites_a_result(tiny_job, tmp_path):
    job = tiny_job(rounds=1)
    assert launch(job, "--results-root", tmp_path).returncode == 0
    path = tmp_path / "test" / "fedavg-dirichlet-seed0.h5"
    before = path.read_bytes()
    again = launch(job, "--results-root", tmp_path)                       # complete: nothing to do
    assert again.returncode == 0 and "already complete" in again.stdout
    other = launch(job, "--results-root", tmp_path, "--set", "train.lr=0.2")
    assert other.returncode == 2 and "another configuration" in other.stderr and "run.name" in other.stderr
    assert path.read_bytes() == before


@pytest.mark.parametrize("ranks", [0, 3])
def test_missing_data_root_is_named(tiny_job, tmp_path, ranks):
    missing = tmp_path / "nowhere"
    result = launch(tiny_job(), "--set", "data.dataset=fashion_mnist", "--data-root", missing,
                    "--results-root", tmp_path, ranks=ranks, timeout=120)
    assert result.returncode == 2
    assert str(missing) in result.stderr and "dataset-fashion-mnist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("*.h5"))                                    # nothing trained or written


@pytest.mark.parametrize("failure", ["setup", "completed"])
def test_the_transport_is_closed_when_set_up_ends_the_run(tiny_job, tmp_path, monkeypatch, failure):
    """A set-up failure (exit 2) or a run already complete (exit 0) still closes the transport: MPI's
    pending note receives are cancelled and the communicator freed, on every rank alike."""
    import hpcfl.launch
    import hpcfl.runtime.build
    from hpcfl.errors import DataError
    from hpcfl.runtime.resume import RunCompleted
    from hpcfl.transport import LocalTransport

    closed = []

    class Spy(LocalTransport):
        def close(self):
            closed.append(True)

    def fail(*args, **kwargs):
        raise DataError("no data") if failure == "setup" else RunCompleted("done already")

    monkeypatch.setattr(hpcfl.launch, "make_transport", lambda: (Spy({}), 0))
    monkeypatch.setattr(hpcfl.runtime.build, "setup", fail)
    assert hpcfl.launch.main([str(tiny_job()), "--results-root", str(tmp_path)]) == (2 if failure == "setup" else 0)
    assert closed == [True]


def test_bad_config_exits_2_naming_the_key(tiny_job, tmp_path):
    result = launch(tiny_job(), "--set", "train.optimiser=adam", "--results-root", tmp_path)
    assert result.returncode == 2 and "optimiser" in result.stderr and "Traceback" not in result.stderr
    assert launch(tiny_job(), "--check").returncode == 0


def test_a_results_root_reaches_the_job_as_written(tiny_job):
    """--results-root becomes run.results_root exactly: quotes, a backslash, a character past U+FFFF."""
    from hpcfl.jobs import prepare
    from hpcfl.launch import parser, run_overrides

    for root in ("/scratch/me/fl\U0001f600", '/a "b"\\c'):
        options = parser().parse_args([str(tiny_job()), "--results-root", root])
        assert prepare(options.job, run_overrides(options)).config.run.results_root == root


def test_help_documents_the_options():
    result = launch("--help")
    assert result.returncode == 0
    for option in ("--set", "--data-root", "--results-root", "--check", "exit status:"):
        assert option in result.stdout


def test_exception_in_a_client_on_rank_2_ends_the_job(tiny_job, tmp_path):
    result = launch(tiny_job(rounds=3), "--results-root", tmp_path, ranks=3, timeout=90,
                    launcher=FAULT_LAUNCHER, env={"HPCFL_FAULT": "raise"})
    assert result.returncode != 0
    assert f"rank 2 on {socket.gethostname()} failed in round 1" in result.stderr
    assert "injected failure in client" in result.stderr and "in client" in result.stderr


def test_validation_split_and_personalised_evaluation(tiny_job, tmp_path):
    result = launch(tiny_job(rounds=2), "--set", "data.validation_fraction=0.2", "--set", "data.local_test_ratio=0.3",
                    "--results-root", tmp_path)
    assert result.returncode == 0, result.stderr
    run = read_run(tmp_path / "test" / "fedavg-dirichlet-seed0.h5")
    assert 0.75 * 1438 < run.arrays["partition"].sum() < 0.85 * 1438    # 20 % held out per client
    local = run.arrays["client/local_test_acc"]
    assert (np.isfinite(local).sum(1) == 4).all() and np.nanmax(local) <= 1.0
    assert np.allclose(run.arrays["round/personal_acc_mean"], np.nanmean(local, axis=1))
    assert np.allclose(run.arrays["round/personal_acc_std"], np.nanstd(local, axis=1))


def test_a_pathological_partition_is_recorded_exactly(tiny_job, tmp_path):
    result = launch(tiny_job(rounds=1), "--set", "data.partition=classes_per_client",
                    "--set", "data.partition_params={k = 2}", "--results-root", tmp_path)
    assert result.returncode == 0, result.stderr
    counts = read_run(tmp_path / "test" / "fedavg-classes_per_client-seed0.h5").arrays["partition"]
    assert ((counts > 0).sum(axis=1) == 2).all()          # each client holds exactly two classes


def test_augmentation_changes_training_but_not_reproducibility(tiny_job, tmp_path):
    runs = [launch(tiny_job(rounds=1), "--set", f"train.augment={aug}", "--set", f"run.name={name}",
                   "--results-root", tmp_path) for aug, name in (("crop_flip", "a"), ("crop_flip", "b"), ("none", "c"))]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    loss = [read_run(tmp_path / "test" / f"{n}.h5").arrays["client/train_loss"] for n in "abc"]
    np.testing.assert_array_equal(loss[0], loss[1])                     # seeded per (round, client)
    assert not np.allclose(loss[0], loss[2], equal_nan=True)            # the crops really were applied


def test_a_symbolic_link_out_of_the_results_root_is_refused(tiny_job, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "test").symlink_to(outside)                 # run.study "test" leads elsewhere
    result = launch(tiny_job(rounds=1), "--results-root", tmp_path / "results")
    assert result.returncode == 2 and "outside run.results_root" in result.stderr
    assert not list(outside.iterdir())                                     # nothing written there


def test_log_lines_carry_time_rank_and_host_and_each_round_its_elapsed_time_and_eta(tiny_job, tmp_path):
    host = socket.gethostname()
    default = launch(tiny_job(rounds=3), "--results-root", tmp_path / "a", ranks=3)
    assert default.returncode == 0, default.stderr
    rounds = [line for line in default.stdout.splitlines() if " round " in line]          # workers: WARNING+
    assert len(rounds) == 3 and all(f" rank 0 {host} INFO round " in line for line in rounds)   # rank 0 alone
    assert rounds[-1].endswith("eta 0:00:00") and all(" elapsed 0:0" in line for line in rounds)
    assert rounds[0][:4].isdigit() and rounds[0][4] == "-" and rounds[0][13] == ":"      # 2026-11-24 17:05:01
    logs = tmp_path / "logs"
    every = launch(tiny_job(rounds=2), "--results-root", tmp_path / "b", "--log-level", "INFO", "--log-dir", logs,
                   "--set", "run.name='logged'", ranks=3)
    assert every.returncode == 0, every.stderr
    files = sorted(p.name for p in logs.iterdir())
    assert files == [f"logged-rank{r}.log" for r in range(3)]
    for r in range(3):
        lines = (logs / f"logged-rank{r}.log").read_text().splitlines()
        assert lines and all(f" rank {r} {host} " in line for line in lines)
    assert "INFO round    2/2" in (logs / "logged-rank0.log").read_text()
    assert f" rank 2 {host} WARNING run.device = 'auto' found no GPU" in default.stderr      # a worker's warning


def test_the_library_entry_point_runs_every_round_after_a_run_in_the_process_was_stopped(tiny_job, tmp_path):
    import hpcfl
    from hpcfl.runtime.resume import STOP

    STOP.set()                          # what a signal to an earlier run in this process (a notebook's) left
    try:
        path = hpcfl.run(tiny_job(rounds=2), [f"run.results_root='{tmp_path}'"], quiet=True)
    finally:
        STOP.clear()
    run = read_run(path)
    assert run.attrs["status"] == "completed" and run.rounds == 2


def test_a_first_ctrl_c_after_slurms_signal_still_waits_for_the_checkpoint_and_a_second_aborts():
    import signal

    from hpcfl.launch import _stop, _stop_signals
    from hpcfl.runtime.resume import STOP

    with _stop_signals():
        _stop(signal.SIGUSR1, None)
        _stop(signal.SIGINT, None)                  # the first Ctrl-C: the checkpoint SLURM's signal asked for
        assert STOP.is_set()
        with pytest.raises(KeyboardInterrupt):
            _stop(signal.SIGINT, None)
    with _stop_signals():                           # a new run starts with no Ctrl-C counted
        assert not STOP.is_set()
        _stop(signal.SIGINT, None)
    STOP.clear()
