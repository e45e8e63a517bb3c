"""The worker: a phase's weighted sums, metric rows and evaluation blocks, the NaN/Inf check of a
client's loss and contributions (train.on_nonfinite), errors named by client, matching and swap
phases, and its host reads."""
import time

import numpy as np
import pytest
import torch

from hpcfl.algorithms.phases import MATCHED, MatchPhase, Phase, SwapPhase
from hpcfl.errors import HpcflError
from hpcfl.payload import Layout
from hpcfl.runtime.worker import _finite
from hpcfl.transport import LocalTransport

BIG = torch.finfo(torch.float32).max


def contribution(value, dtype=torch.float32, weight=1.0):
    tensor = torch.zeros(1000, dtype=dtype)
    tensor[517] = value
    return {"model": ({"w": tensor, "steps": torch.tensor(3, dtype=torch.int64)}, weight)}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_any_nonfinite_element_is_caught(value):
    assert not _finite(contribution(value), {"train_loss": 1.0})
    assert not _finite(contribution(value, torch.float16), {})
    assert not _finite(contribution(0.0, weight=value), {"train_loss": 1.0})
    assert not _finite(contribution(0.0), {"train_loss": value})


def test_finite_extremes_pass_and_opposite_infinities_are_still_caught():
    huge = torch.full((4096,), BIG)                        # a float32 sum of these would overflow; float64 does not
    assert _finite({"model": ({"w": huge, "v": -huge}, 1e30)}, {"train_loss": 1e30})
    assert _finite(contribution(-BIG), {})
    both = torch.tensor([float("inf"), -float("inf")])    # their sum is NaN, not a finite number
    assert not _finite({"model": ({"w": both}, 1.0)}, {})
    assert _finite({}, {})                                 # a phase that contributes nothing


HOST_READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy", "nonzero"}


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts the tensor operations that make a GPU run wait for the device (a value read on the host)."""
    count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in HOST_READS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold", "moon"])
def test_local_training_never_reads_the_device_per_batch(algorithm, tiny_job, tmp_path):
    """Host reads (each drains a GPU's queue) come per client (FedAvg: its loss and the NaN/Inf check;
    state moved to the CPU: one per tensor) and per round, never per batch: 1 and 4 epochs read alike."""
    from hpcfl.jobs import load_job, resolve
    from hpcfl.runtime.build import setup
    from hpcfl.runtime.loop import run
    from hpcfl.transport import LocalTransport

    reads = {}
    for epochs in (1, 4):
        config = load_job(tiny_job(algorithm, rounds=1), [f"train.local_epochs={epochs}", "eval.every=2",
                                                          f"run.results_root='{tmp_path}'", f"run.name='e{epochs}'"])
        job = setup(resolve(config), LocalTransport({}), None)
        with _HostReads() as counter:
            run(job)
        job.recorder.close()
        reads[epochs] = counter.count
    assert reads[1] == reads[4]                       # none per batch: per client, per state tensor, per round
    if algorithm == "fedavg":                         # 4 clients a round, and the round's bookkeeping
        assert reads[1] <= 2 * 4 + 10


class _Scripted:
    """An algorithm whose client updates are scripted per client: (contribution, weight, metrics, or an
    exception to raise); each update leaves its client's state at 99 and records what it received."""
    name = "scripted"
    traits = type("Traits", (), {"batched": False})()

    def __init__(self, script):
        self.script, self.received, self.handed, self.taken = script, {}, [], {}

    def receive(self, phase, round, downlink):
        self.received["round"] = (round, downlink)

    def client_model(self, client, model):
        return model

    def client_update(self, phase, round, client, received, model, trainer):
        contribution, weight, metrics = self.script[client.id]
        if isinstance(metrics, Exception):
            raise metrics
        client.state = {"scripted": {"c": torch.full((2,), 99.0, requires_grad=True)}}
        self.received[client.id] = received
        return ({} if contribution is None else {"model": ({"w": torch.tensor(contribution)}, weight)}), dict(metrics)

    def gather_out(self, phase, round, client):
        return torch.full((2, 2), float(client.id), dtype=torch.float32)

    def exchange_out(self, phase, client):
        self.handed.append(client.id)
        return {"w": torch.full((3,), float(client.id))}

    def exchange_in(self, phase, client, received):
        self.taken[client.id] = received["w"].clone()


def _worker(script, drop=False, moving=False, clients=3):
    from hpcfl.data.client import Client
    from hpcfl.runtime.worker import Worker

    model = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
    population = {c: Client(c, torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64), np.ones(3),
                            state={"scripted": {"c": torch.full((2,), 7.0)}}) for c in range(clients)}
    return Worker(_Scripted(script), population, {"": model}, None, "cpu", num_classes=3, eval_batch=2,
                  drop_nonfinite=drop, moving=moving)


METRICS = ("train_loss", "nonfinite", "val_acc", "val_loss", "steps")
PHASE = Phase("train", uplink={"model": Layout.of({"w": torch.zeros(2)})})


def test_a_phase_sums_the_finite_weighted_updates_and_flags_the_others(tmp_path):
    """Client 0 adds 2 x [1, 2], client 2 0.5 x [100, 200]; client 1's loss is NaN: left out of the sum,
    flagged with its loss kept, and (on_nonfinite = 'drop') back to its state of before the round."""
    worker = _worker({0: ([1.0, 2.0], 2.0, {"train_loss": 0.5, "steps": 4}),
                      1: ([10.0, 20.0], 1.0, {"train_loss": float("nan")}),
                      2: ([100.0, 200.0], 0.5, {"train_loss": 0.25, "steps": 2})}, drop=True)
    x = torch.tensor([[2.0, 1.0], [0.0, 1.0], [-1.0, -2.0], [1.0, 3.0]])     # predicted 0, 1, 2, 1
    y = torch.tensor([0, 1, 1, 1])
    worker.clients[0].eval_sets = {"val": (x, y)}
    for client in worker.clients.values():
        client.test_set = (x[:2], y[:2])
    rows = np.zeros((3, len(METRICS)))
    blocks = {"val_correct": np.zeros((3, 4), np.uint8), "class_acc": np.zeros((3, 3))}
    start = time.perf_counter()
    sums = worker.run_phase(PHASE, 2, [0, 1, 2], {"down": 1}, rows, METRICS, blocks)
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(sums["model"], [52.0, 104.0])
    assert sums["model"].dtype == np.float64 and worker.algorithm.received["round"] == (2, {"down": 1})
    np.testing.assert_array_equal(rows[0, [0, 2, 4]], [0.5, 0.75, 4])            # 3 of 4 right
    assert rows[0, 3] == pytest.approx(np.mean([-np.log(np.exp(2) / (np.exp(2) + np.exp(1) + np.exp(-3))),
                                                np.log(np.exp(0) + np.exp(1) + np.exp(-1)) - 1,
                                                np.log(np.exp(-1) + np.exp(-2) + np.exp(3)) + 2,
                                                np.log(np.exp(1) + np.exp(3) + np.exp(-4)) - 3]))
    assert rows[0, 1] == 0.0 and rows[1, 1] == 1.0 and np.isnan(rows[1, 0]) and np.isnan(rows[1, 2:]).all()
    np.testing.assert_array_equal(rows[2, [0, 4]], [0.25, 2])
    np.testing.assert_array_equal(blocks["val_correct"][0], [1, 1, 0, 1])
    np.testing.assert_array_equal(blocks["class_acc"][0], [1.0, 1.0, np.nan])     # classes 0 and 1 right, 2 unseen
    assert blocks["val_correct"][1:].sum() == 0
    assert worker.clients[1].state["scripted"]["c"].tolist() == [7.0, 7.0]          # dropped: as before the round
    kept = worker.clients[0].state["scripted"]["c"]
    assert kept.tolist() == [99.0, 99.0] and not kept.requires_grad                 # kept, detached, on the CPU
    assert 0 < worker.compute_s <= elapsed                                          # the phase's own time


def test_a_client_flagged_in_one_phase_stays_flagged_when_a_later_phase_of_the_round_is_finite():
    worker = _worker({0: ([1.0, 2.0], 1.0, {"train_loss": float("nan")})}, drop=True)
    rows = np.zeros((3, len(METRICS)))
    worker.run_phase(PHASE, 0, [0], {}, rows, METRICS)
    worker.algorithm.script[0] = ([1.0, 2.0], 1.0, {"train_loss": 0.5, "steps": 4})
    worker.run_phase(PHASE, 0, [0], {}, rows, METRICS)
    assert rows[0, 1] == 1.0 and rows[0, 0] == 0.5            # the second phase's figures, the round's flag


def test_a_phase_without_training_sums_and_writes_no_row():
    worker = _worker({0: ([1.0, 1.0], 1.0, {}), 1: ([2.0, 2.0], 1.0, {}), 2: (None, 0.0, {})})
    rows = np.full((3, len(METRICS)), -1.0)
    sums = worker.run_phase(PHASE, 0, [0, 1], {}, rows, METRICS)
    np.testing.assert_array_equal(sums["model"], [3.0, 3.0])
    assert (rows == -1).all()


def test_without_drop_a_faulty_client_keeps_what_its_update_left():
    worker = _worker({0: ([1.0, 2.0], 1.0, {"train_loss": float("inf")})})
    rows = np.zeros((3, len(METRICS)))
    worker.run_phase(PHASE, 0, [0], {}, rows, METRICS)
    assert rows[0, 1] == 1.0 and rows[0, 0] == float("inf")
    assert worker.clients[0].state["scripted"]["c"].tolist() == [99.0, 99.0]


def test_a_failing_update_names_its_client_round_and_phase():
    worker = _worker({0: ([1.0, 2.0], 1.0, {"train_loss": 1.0}), 1: (None, 0.0, ValueError("boom"))})
    with pytest.raises(ValueError, match="boom") as err:
        worker.run_phase(PHASE, 4, [0, 1], {}, np.zeros((3, len(METRICS))), METRICS)
    assert err.value.__notes__ == ["hpcfl: in client 1, round 5, phase 'train'"]


def test_moving_clients_must_keep_nothing():
    worker = _worker({0: ([1.0, 2.0], 1.0, {"train_loss": 1.0})}, moving=True)
    with pytest.raises(HpcflError, match=r"'scripted' declares stateless clients, but client 0 kept \['scripted: c'\]"):
        worker.run_phase(PHASE, 0, [0], {}, np.zeros((3, len(METRICS))), METRICS)


def test_a_matching_phase_opens_with_each_clients_tensor_and_each_gets_its_reply():
    worker = _worker({0: ([1.0, 2.0], 1.0, {"train_loss": 1.0}), 1: ([1.0, 2.0], 1.0, {"train_loss": 1.0})})
    start = time.perf_counter()
    gathered = worker.gather(MatchPhase("match"), 0, [0, 1])
    assert 0 < worker.compute_s <= time.perf_counter() - start
    assert {c: v.tolist() for c, v in gathered.items()} == {0: [0.0] * 4, 1: [1.0] * 4}
    assert all(v.dtype == np.float64 for v in gathered.values())
    downlink = {MATCHED: {"global": torch.ones(1)}}
    replies = {0: torch.zeros(1), 1: torch.full((1,), 5.0)}
    worker.run_phase(PHASE, 0, [0, 1], downlink, np.zeros((3, len(METRICS))), METRICS, replies=replies)
    assert worker.algorithm.received[1][MATCHED]["reply"].item() == 5.0
    assert worker.algorithm.received[1][MATCHED]["global"].item() == 1.0


def test_a_swap_hands_over_the_involved_clients_tensors_only():
    worker, start = _worker({}, clients=3), time.perf_counter()
    worker.exchange(SwapPhase("swap", Layout.of({"w": torch.zeros(3)})), 0, [0, 1, 2], LocalTransport({}), {0: 1, 1: 0})
    assert 0 < worker.compute_s <= time.perf_counter() - start
    assert sorted(worker.algorithm.handed) == [0, 1]                       # client 2 is in no pair
    assert {c: t.tolist() for c, t in worker.algorithm.taken.items()} == {0: [1.0] * 3, 1: [0.0] * 3}


def test_the_clients_kept_state_is_counted_in_bytes():
    worker = _worker({}, clients=2)                                        # two 2-element float32 states
    worker.clients[1].term_state = {"moon": {"prev": torch.zeros(3, dtype=torch.int64)}}
    assert worker.client_state_bytes() == 2 * 2 * 4 + 3 * 8


class _Counting(_Scripted):
    """A batched scripted algorithm: each update adds 1 to its client's state in place, then (the clients
    in `trains`) trains the model and contributes its weights; `updates` counts the client_update calls."""
    traits = type("Traits", (), {"batched": True})()

    def __init__(self, trains):
        super().__init__({})
        self.trains, self.updates = trains, 0

    def client_update(self, phase, round, client, received, model, trainer):
        self.updates += 1
        client.state["scripted"]["c"].add_(1.0)
        if client.id not in self.trains:
            return {}, {}
        metrics = trainer.train(model, client, round)
        return {"model": ({"w": model.weight.detach()[0].clone()}, 1.0)}, metrics


class _GroupTrainer:
    """Stands in for BatchedTrainer: 'trains' client k's model to weights all k + 10, once per request."""

    def __init__(self):
        self.calls = []

    def train(self, requests):
        from hpcfl.training.recording import key
        self.calls.append([r.client.id for r in requests])
        return {key(r.client, r.round, r.epochs, r.seed): ({"weight": torch.full((3, 2), r.client.id + 10.0)},
                                                            {"train_loss": 0.5}, r.contexts, r.cfg)
                for r in requests}


def _batched_worker(trains):
    worker = _worker({})
    worker.algorithm, worker.batched = _Counting(trains), _GroupTrainer()
    worker.trainer = type("Trainer", (), {"seed": 5, "cfg": None})()
    return worker


def test_batched_clients_train_in_one_group_and_an_in_place_state_change_happens_once():
    """The recording pass runs every update up to its `train` call, each client's state put back after
    it, so an update that changes its state in place (7 -> 8) changes it once, not once per pass (the
    second pass finds every call trained and ends the recording); the group trains once and each update
    goes on from its own client's trained model."""
    worker = _batched_worker(trains={0, 1, 2})
    rows = np.zeros((3, len(METRICS)))
    sums = worker.run_phase(PHASE, 0, [0, 1, 2], {}, rows, METRICS)
    assert worker.batched.calls == [[0, 1, 2]]
    assert worker.algorithm.updates == 3 * 3      # recorded, run through on the trained models, then for real
    np.testing.assert_array_equal(sums["model"], [10.0 + 11.0 + 12.0] * 2)
    assert all(c.state["scripted"]["c"].tolist() == [8.0, 8.0] for c in worker.clients.values())
    np.testing.assert_array_equal(rows[:, 0], [0.5] * 3)


def test_the_recording_passes_leave_each_clients_state_as_it_was_on_the_cpu():
    """The passes run the updates on the worker's device (a stand-in here) and put each client's own
    CPU state back: a client dropped after the round starts from it, not from a copy left on the GPU."""
    worker = _batched_worker(trains={0, 1, 2})
    worker.device = torch.device("meta")
    worker._trainer(PHASE, 0, [0, 1, 2], {}, None)
    assert worker.algorithm.updates == 3 * 2
    for client in worker.clients.values():
        kept = client.state["scripted"]["c"]
        assert kept.device.type == "cpu" and kept.tolist() == [7.0, 7.0]


def test_a_phase_without_training_is_recorded_for_its_first_client_only():
    """No `train` call in the first update: nothing to batch, the clients run one after another (the
    recording pass stops at once: one update more than the clients), and each state changes once."""
    worker = _batched_worker(trains=())
    worker.run_phase(PHASE, 0, [0, 1, 2], {}, np.zeros((3, len(METRICS))), METRICS)
    assert worker.batched.calls == [] and worker.algorithm.updates == 3 + 1
    assert all(c.state["scripted"]["c"].tolist() == [8.0, 8.0] for c in worker.clients.values())


def test_a_client_that_does_not_train_leaves_the_others_batched():
    worker = _batched_worker(trains={0, 2})
    sums = worker.run_phase(PHASE, 0, [0, 1, 2], {}, np.zeros((3, len(METRICS))), METRICS)
    assert worker.batched.calls == [[0, 2]]
    np.testing.assert_array_equal(sums["model"], [10.0 + 12.0] * 2)
