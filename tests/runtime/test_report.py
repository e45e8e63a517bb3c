"""A round's report on its own: the rows, blocks and rank figures that go up in one reduce and come
apart again on the server, and the values `record` writes and logs from them, hand-computed."""
from types import SimpleNamespace

import numpy as np
import pytest

from hpcfl.config import read_job
from hpcfl.runtime import report
from hpcfl.runtime.forgetting import Forgetting
from hpcfl.runtime.report import (
    CLIENT_COLUMN,
    CLIENT_METRICS,
    RANK_METRICS,
    client_blocks,
    gather_report,
    local_test_bits,
    record,
    split_report,
)
from hpcfl.transport import LocalTransport, Traffic

CONFIG = read_job({"run": {"rounds": 3}, "data": {"num_clients": 4}, "train": {"clients_per_round": 3},
                   "eval": {"every": 2}})


class _Recorder:
    def __init__(self):
        self.rounds = []

    def append_round(self, round, values):
        self.rounds.append((round, values))


def _job(size=1, client_metrics=(), local_test_sizes=None, extensions=(), global_model=False):
    return SimpleNamespace(config=CONFIG, transport=SimpleNamespace(size=size), num_classes=3,
                           local_test_sizes=local_test_sizes, extensions=list(extensions),
                           client_metrics=client_metrics, recorder=_Recorder(),
                           algorithm=SimpleNamespace(traits=SimpleNamespace(global_model=global_model)))


def test_the_blocks_are_the_extensions_then_each_clients_own_test_examples():
    job = _job(local_test_sizes=np.array([2, 3, 1, 0]), extensions=[Forgetting()])
    assert {name: block.shape for name, block in client_blocks(job).items()} == {"class_acc": (4, 3),
                                                                                 "local_test_correct": (4, 3)}
    assert list(client_blocks(job)) == ["class_acc", "local_test_correct"]
    assert all(not block.any() for block in client_blocks(job).values())
    assert client_blocks(_job()) == {}
    assert client_blocks(_job(local_test_sizes=np.zeros(4, dtype=int)))["local_test_correct"].shape == (4, 0)


def test_a_rank_reports_its_clients_sizes_and_its_figures_and_the_server_takes_them_apart(monkeypatch):
    """One rank hosting clients 0 and 2: their sizes go in the rows, the rank's compute (worker and
    server, then reset), wait, wire bytes, state and peak memory in its rank row; split_report gives
    back exactly the rows, the blocks and the rank rows."""
    monkeypatch.setattr(report, "peak_bytes", lambda: 1234)
    clients = {c: SimpleNamespace(num_samples=n) for c, n in ((0, 10), (2, 30))}
    worker = SimpleNamespace(clients=clients, compute_s=1.5, client_state_bytes=lambda: 64)
    server = SimpleNamespace(compute_s=0.5)
    job = _job(local_test_sizes=np.array([2, 3, 1, 0]), extensions=[Forgetting()])
    job.transport, job.worker, job.server = LocalTransport({}), worker, server
    rows = np.zeros((4, len(CLIENT_METRICS)))
    rows[0, CLIENT_COLUMN["train_loss"]], rows[2, CLIENT_COLUMN["steps"]] = 0.5, 6
    blocks = client_blocks(job)
    blocks["class_acc"][2] = [1.0, 0.5, 0.0]
    blocks["local_test_correct"][0, :2] = [1, 0]
    stats = Traffic(wait_s=0.25)
    stats.sent.update(a=100, b=20)
    stats.received.update(a=7)
    flat = gather_report(job, rows, blocks, [0, 2], stats)
    assert flat.shape == (4 * (len(CLIENT_METRICS) + 3 + 3) + len(RANK_METRICS),)
    back, back_blocks, ranks = split_report(job, flat)
    np.testing.assert_array_equal(back[:, CLIENT_COLUMN["num_samples"]], [10, 0, 30, 0])
    assert back[0, CLIENT_COLUMN["train_loss"]] == 0.5 and back[2, CLIENT_COLUMN["steps"]] == 6
    assert back_blocks.keys() == blocks.keys()
    for name, block in blocks.items():
        np.testing.assert_array_equal(back_blocks[name], block)
    np.testing.assert_array_equal(ranks, [[2.0, 0.25, 120, 7, 64, 1234]])
    assert worker.compute_s == server.compute_s == 0.0                      # each round counts its own


def test_the_server_takes_apart_every_ranks_row_of_a_summed_report():
    flat = np.arange(4 * len(CLIENT_METRICS) + 3 * len(RANK_METRICS), dtype=float)
    rows, blocks, ranks = split_report(_job(size=3), flat)
    assert rows.shape == (4, len(CLIENT_METRICS)) and blocks == {} and rows[3, -1] == 4 * len(CLIENT_METRICS) - 1
    np.testing.assert_array_equal(ranks[2], flat[-len(RANK_METRICS):])


def test_the_cohorts_local_test_examples_are_packed_in_client_order_zeros_for_the_others():
    correct = np.array([[1, 0, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=float)
    job = _job(local_test_sizes=np.array([2, 3, 1, 0]))
    bits = local_test_bits(job, correct, [0, 2])
    np.testing.assert_array_equal(np.unpackbits(bits)[:6], [1, 0, 0, 0, 0, 1])     # 2 + 3 + 1 + 0 examples
    assert bits.tolist() == [0b10000100]


def _round_rows():
    """Clients 0, 2, 3 trained on 10, 30 and 20 examples, 3 dropped (its update not finite, its loss is: the
    worker gives it no other figure); client 1 did not."""
    rows = np.zeros((4, len(CLIENT_METRICS)))
    for c, values in {0: (0.5, 4, 0.8, 0.6, 1.0, 0.0, 0, 10), 2: (1.0, 6, 0.6, 0.9, 0.5, 0.0, 0, 30),
                      3: (3.0, np.nan, np.nan, np.nan, np.nan, np.nan, 1, 20)}.items():
        rows[c] = values
    ranks = np.zeros((3, len(RANK_METRICS)))
    ranks[:, RANK_METRICS.index("compute_s")] = [0.1, 2.0, 4.0]
    ranks[1, RANK_METRICS.index("client_state_bytes")] = 2**20
    return np.concatenate([rows.ravel(), ranks.ravel()])


def test_a_round_records_the_cohorts_metrics_the_sample_weighted_loss_and_the_workers_imbalance(hpcfl_log):
    metrics = ("train_loss", "steps", "val_acc", "local_test_acc", "local_test_loss", "nonfinite")
    job = _job(size=3, client_metrics=metrics)
    record(job, 1, {0: 1, 2: 2, 3: 1}, _round_rows(), {"round/test_acc": 0.7, "round/test_loss": 0.9},
           {"train": 1.25}, {"up": {"model": 400}, "down": {"model": 800}}, 3.5, "eta 1 min")
    [(round, values)] = job.recorder.rounds
    assert round == 1
    expected = {"client/rank": [1, np.nan, 2, 1], "client/train_loss": [0.5, np.nan, 1.0, 3.0],
                "client/steps": [4, np.nan, 6, np.nan], "client/val_acc": [0.8, np.nan, 0.6, np.nan],
                "client/local_test_acc": [0.6, np.nan, 0.9, np.nan],
                "client/local_test_loss": [1.0, np.nan, 0.5, np.nan], "client/nonfinite": [0, np.nan, 0, 1]}
    for key, value in expected.items():
        np.testing.assert_array_equal(values.pop(key), value, err_msg=key)
    for j, key in enumerate(RANK_METRICS):
        np.testing.assert_array_equal(values.pop(f"rank/{key}"), _round_rows()[-3 * len(RANK_METRICS):]
                                      .reshape(3, -1)[:, j])
    assert values == pytest.approx({
        "round/personal_acc_mean": 0.75, "round/personal_acc_std": 0.15,   # the models kept: 0 and 2
        "round/val_acc": 0.7,                                  # the clients' own models (no global model)
        "round/train_loss": (0.5 * 10 + 1.0 * 30) / 40,        # client 3's left out
        "round/test_acc": 0.7, "round/test_loss": 0.9, "round/bytes_up/model": 400.0,
        "round/bytes_down/model": 800.0, "round/phase_s/train": 1.25, "round/time_s": 3.5,
        "round/imbalance_s": 4.0 - 3.0})                       # the workers' (ranks 1, 2), not the server's
    assert hpcfl_log.messages == ["round    2/3  test_acc 0.7000  test_loss 0.9000  personal_acc 0.7500  "
                               "val_acc 0.7000  train_loss 0.8750    3.50 s  eta 1 min"]


def test_a_client_that_took_no_step_has_no_loss_in_the_round_or_its_own():
    """A BatchNorm model skips a one-sample batch: its client trains no step and its trainer's 0.0 is no loss.
    A client reporting no steps at all (a plug-in's own loop: NaN) still counts."""
    flat = _round_rows()
    flat[2 * len(CLIENT_METRICS) + CLIENT_COLUMN["steps"]], flat[2 * len(CLIENT_METRICS)] = 0, 0.0    # client 2
    flat[CLIENT_COLUMN["steps"]] = np.nan                                                               # client 0
    job = _job(size=3, client_metrics=("train_loss", "steps"))
    record(job, 1, {0: 1, 2: 2, 3: 1}, flat, {}, {}, {}, 1.0)
    [(_, values)] = job.recorder.rounds
    np.testing.assert_array_equal(values["client/train_loss"], [0.5, np.nan, np.nan, 3.0])
    assert values["client/steps"][2] == 0 and values["round/train_loss"] == 0.5      # client 0's alone


def test_the_last_round_logs_the_state_the_workers_hold_and_a_global_model_has_no_client_val_acc(hpcfl_log):
    job = _job(size=3, client_metrics=("train_loss", "val_acc"), global_model=True)
    record(job, 2, {0: 1, 2: 2, 3: 1}, _round_rows(), {}, {}, {}, 1.0)
    [(_, values)] = job.recorder.rounds
    assert "round/val_acc" not in values and "round/personal_acc_mean" not in values
    assert {"client/val_acc", "client/train_loss"} <= set(values) and "client/steps" not in values
    assert hpcfl_log.messages == ["round    3/3  train_loss 0.8750    1.00 s",
                               "per-client state held on the workers' CPUs: rank 1 1.0 MiB"]


def test_one_rank_has_no_imbalance_and_a_cohort_of_dropped_clients_no_loss():
    rows = np.zeros((4, len(CLIENT_METRICS)))
    rows[:, CLIENT_COLUMN["train_loss"]] = np.nan
    ranks = np.zeros(len(RANK_METRICS))
    ranks[RANK_METRICS.index("compute_s")] = 2.0
    job = _job(client_metrics=("train_loss", "val_acc", "local_test_acc"),
               local_test_sizes=np.array([1, 1, 1, 1]))
    rows[:, CLIENT_COLUMN["val_acc"]] = 0.5
    correct = np.array([[1.0], [1.0], [0.0], [1.0]])
    flat = np.concatenate([np.concatenate([rows, correct], axis=1).ravel(), ranks])    # its block follows a row
    record(job, 0, {1: 0, 3: 0}, flat, {}, {}, {}, 1.0)
    [(_, values)] = job.recorder.rounds
    assert np.isnan(values["round/train_loss"]) and values["round/imbalance_s"] == 0.0
    assert "round/val_acc" not in values                        # round 1 of eval.every = 2: not evaluated
    np.testing.assert_array_equal(np.unpackbits(values["example/local_test_correct"])[:4], [0, 1, 0, 1])


def test_the_server_of_several_ranks_reports_its_own_figures_and_no_clients(monkeypatch):
    monkeypatch.setattr(report, "peak_bytes", lambda: 99)
    job = _job(size=2)
    job.transport = SimpleNamespace(rank=0, size=2, reduce_sum=lambda name, array: array)
    job.worker, job.server = None, SimpleNamespace(compute_s=0.75)
    rows = np.zeros((4, len(CLIENT_METRICS)))
    stats = Traffic(wait_s=2.0)
    stats.sent.update(model=8)
    _, _, ranks = split_report(job, gather_report(job, rows, {}, [], stats))
    np.testing.assert_array_equal(ranks, [[0.75, 2.0, 8, 0, 0, 99], [0] * len(RANK_METRICS)])
    flat = np.zeros(4 * len(CLIENT_METRICS) + 2 * len(RANK_METRICS))
    flat[CLIENT_COLUMN["num_samples"]] = 10                                   # client 0 trained on 10 examples
    flat[-2 * len(RANK_METRICS)] = 5.0                                       # the server's compute_s: not a worker's
    record(job, 0, {0: 1}, flat, {}, {}, {}, 1.0)
    assert job.recorder.rounds[0][1]["round/imbalance_s"] == 0.0           # one worker waits for no other
