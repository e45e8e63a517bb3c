"""The server on its own, with a stub algorithm: the state it starts from, what each phase packs,
unpacks and answers, which sets it evaluates on, and the time it counts as its own."""
import time

import numpy as np
import pytest
import torch

from hpcfl.algorithms.phases import MatchPhase, Phase
from hpcfl.errors import HpcflError, PayloadError
from hpcfl.payload import Layout
from hpcfl.runtime.server import Server

PHASE = Phase("train", downlink={"model": Layout.of({"w": torch.zeros(2, 2), "b": torch.zeros(1)})},
              uplink={"model": Layout.of({"w": torch.zeros(2, 2), "b": torch.zeros(1)})})


class _Stub:
    """Holds `w` and `b` under "model"; aggregates by storing the sums; matching answers each client with
    its own buffer doubled; evaluation reports the set's size and mean label."""
    name = "stub"

    def __init__(self, state=None):
        self.calls, self.state = [], state

    def init_server_state(self, model):
        return self.state or {"model": {"w": torch.arange(4.0).reshape(2, 2), "b": torch.tensor([0.5])}}

    def downlink(self, phase, round, state):
        self.calls.append(("downlink", round))
        return {"model": {"w": state["model"]["w"].double() / 3, "b": state["model"]["b"]}}

    def aggregate(self, phase, round, state, uplink):
        self.calls.append(("aggregate", round))
        state["model"] = {k: v.clone() for k, v in uplink["model"].items()}

    def match(self, phase, round, state, gathered):
        return torch.ones(3, dtype=torch.float32), {c: 2 * t for c, t in gathered.items()}

    def evaluate(self, state, model, x, y, batch):
        return {"size": len(y), "mean_label": y.double().mean().item(), "batch": batch}


def _server(state=None, validation=None):
    return Server(_Stub(state), torch.nn.Linear(1, 1), torch.zeros(5, 1), torch.tensor([0, 1, 1, 2, 2]), 7,
                  torch.device("cpu"), validation=validation)


def _timed(server, call, *args):
    """`call(*args)`, checking that the server counts its time as compute: more than nothing, no more
    than the call took."""
    before, start = server.compute_s, time.perf_counter()
    out = call(*args)
    assert 0 < server.compute_s - before <= time.perf_counter() - start
    return out


def test_the_server_starts_from_its_algorithms_state_and_refuses_one_without_owners():
    server = _server()
    assert server.state["model"]["w"].tolist() == [[0.0, 1.0], [2.0, 3.0]] and server.compute_s == 0.0
    with pytest.raises(HpcflError, match=r"stub.init_server_state returned \['w'\] as tensors of their own"):
        _server(state={"w": torch.zeros(1)})


def test_a_phase_packs_its_downlink_as_float32_and_aggregates_the_unpacked_sums():
    server = _server()
    out = _timed(server, server.downlink, PHASE, 3)
    assert out["model"].dtype == np.float32
    np.testing.assert_allclose(out["model"], np.float32([0, 1 / 3, 2 / 3, 1, 0.5]))   # layout order: w, then b
    _timed(server, server.aggregate, PHASE, 3, {"model": np.array([1.0, 2.0, 3.0, 4.0, 5.0])})
    assert server.state["model"]["w"].tolist() == [[1.0, 2.0], [3.0, 4.0]] and server.state["model"]["b"].item() == 5
    assert server.algorithm.calls == [("downlink", 3), ("aggregate", 3)]
    assert server.downlink(Phase("local"), 4) == {} and server.algorithm.calls[-1] == ("aggregate", 3)


def test_a_matching_phase_answers_every_rank_and_each_client_in_float64():
    server = _server()
    shared, replies = _timed(server, server.match, MatchPhase("match"), 0, {4: np.array([1.5, 2.0]),
                                                                           9: np.array([[1.0]])})
    assert shared.dtype == np.float64 and shared.tolist() == [1.0, 1.0, 1.0]
    assert {c: r.tolist() for c, r in replies.items()} == {4: [3.0, 4.0], 9: [2.0]}
    assert replies[4].dtype == np.float64
    server.algorithm.match = lambda phase, round, state, gathered: (torch.ones(1), {4: gathered[4]})
    with pytest.raises(PayloadError, match=r"stub.match answered clients \[4\], not the gathered \[4, 9\]"):
        server.match(MatchPhase("match"), 0, {4: np.array([1.5]), 9: np.array([1.0])})


def test_the_server_evaluates_on_the_test_set_and_on_the_clients_held_out_samples_when_it_has_them():
    server = _server()
    assert _timed(server, server.evaluate) == {"size": 5, "mean_label": 1.2, "batch": 7}
    assert server.evaluate("validation") is None
    held_out = _server(validation=(torch.zeros(2, 1), torch.tensor([1, 0])))
    assert held_out.evaluate("validation") == {"size": 2, "mean_label": 0.5, "batch": 7}


def test_feature_quality_is_measured_on_the_global_models_test_features(monkeypatch):
    from types import SimpleNamespace

    from hpcfl.runtime import server as module
    server = _server()
    server.algorithm.setup = SimpleNamespace(num_classes=3)
    server.algorithm.global_module = lambda state, model: ("global", state["model"]["b"].item(), model)
    seen = []
    monkeypatch.setattr(module, "feature_quality", lambda *args: seen.append(args) or {"nmi": 0.5})
    assert server.feature_quality(11) == {"nmi": 0.5}
    [(model, x, y, classes, seed)] = seen
    assert model == ("global", 0.5, server.model) and (classes, seed) == (3, 11)
    assert x is server.test_x and y is server.test_y
