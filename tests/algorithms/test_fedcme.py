"""FedCME: matching on hand-made evaluation vectors, the feature-alignment term against a direct
computation, the classifier swap through a worker, the evaluation vector, whole rounds through the
algorithm's hooks (two rounds by hand with a stand-in trainer, the ablations, a round of SGD with
momentum against eq. 8-10 by hand) and the configuration rules."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from algorithms.helpers import client, make, sums
from torch import nn

from hpcfl.algorithms.base import Client
from hpcfl.algorithms.fedcme import (
    EVALUATION,
    FEATURES,
    PARTNERS,
    FeatureAlignment,
    FedCME,
    make_matching,
    many_to_one,
)
from hpcfl.algorithms.phases import SwapPhase
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.launch import main
from hpcfl.metrics.reader import read_run
from hpcfl.runtime.worker import Worker
from hpcfl.seeding import cohort_schedule
from hpcfl.training import LocalTrainer
from hpcfl.transport import LocalTransport

VECTORS = np.array([[1.0, 0.0, 0.0],     # client 0
                    [0.0, 1.0, 0.0],     # client 1
                    [1.0, 1.0, 0.0],     # client 2
                    [0.9, 0.1, 0.0],     # client 3
                    [0.0, 0.0, 1.0]])    # client 4


def test_matching_pairs_the_least_typical_client_with_its_least_similar_partner():
    # mean of 0..3 = (0.725, 0.525, 0); cosines: 0 -> .81, 1 -> .59, 2 -> .99, 3 -> .86, so 1 goes first,
    # and takes the remaining client least similar to it, 0 (cos 0); then 3 and 2 remain.
    assert make_matching(VECTORS, [0, 1, 2, 3]) == {1: 0, 0: 1, 3: 2, 2: 3}


def test_matching_leaves_the_odd_client_out_and_breaks_ties_by_order():
    # ascending similarity to the mean: 4, 1, 0, 3, 2. Client 4 is orthogonal to all: the tie goes to
    # the first in that order, 1. Then 0 takes 2 (cos .71 < .99 with 3), and 3 is left over.
    assert make_matching(VECTORS, [0, 1, 2, 3, 4]) == {4: 1, 1: 4, 0: 2, 2: 0}
    same = np.ones((5, 3))                                # never evaluated: all ties
    assert make_matching(same, [0, 2, 4]) == {0: 2, 2: 0}
    assert make_matching(same, [3]) == {}


def test_many_to_one_lets_one_client_feed_several_and_never_itself():
    sources = many_to_one(VECTORS, [0, 2, 3, 4])
    assert sources[0] == 4 and sources[2] == 4 and sources[3] == 4 and sources[4] == 0
    assert many_to_one(np.ones((5, 3)), [0, 2, 3]) == {0: 2, 2: 0, 3: 0}    # all ties: the first other client
    assert many_to_one(VECTORS, [1, 3]) == {1: 3, 3: 1}
    assert many_to_one(VECTORS, [3]) == {}                                   # nobody to take from


def _alignment(mu, known):
    term = FeatureAlignment(FedCME.Params(mu=mu))
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0], [7.0, 7.0]])
    me = client(0, samples=3)
    term.start(None, me, 0, {FEATURES: {"anchors": targets, "known": torch.tensor(known)}})
    return term, me


FEATURES_BATCH = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 4.0], [1.0, 1.0]])
LABELS_BATCH = torch.tensor([0, 0, 1, 2])


def test_feature_alignment_matches_equation_9_and_accumulates_features():
    term, me = _alignment(0.5, [1.0, 1.0, 0.0, 1.0])
    # class 0: mean (1, 0) on target; class 1: (0, 4) vs (0, 1) -> 9; class 2 has no global feature yet;
    # class 3 has one but is not in the batch (no 0/0 mean)
    assert term.loss(None, None, LABELS_BATCH, FEATURES_BATCH, None).item() == pytest.approx(0.5 * 9.0)
    term.finish(None, me)
    assert torch.equal(me.term_state["fa"]["counts"], torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    assert torch.equal(me.term_state["fa"]["sums"][2], torch.tensor([1.0, 1.0], dtype=torch.float64))
    term.start(None, me, 0, {FEATURES: {"anchors": torch.zeros(4, 2), "known": torch.zeros(4)}})
    assert term.loss(None, None, LABELS_BATCH, FEATURES_BATCH, None).item() == 0.0   # nothing known: no pull
    assert me.term_state["fa"]["counts"].tolist() == [4.0, 2.0, 2.0, 0.0]                # after the swap: summed on


def test_mu_0_adds_no_term_but_still_collects_the_local_features():
    """FedCME-OE (mu = 0): no alignment term in the loss, while the local features still go up."""
    term, me = _alignment(0.0, [1.0, 1.0, 1.0, 1.0])
    assert term.loss(None, None, LABELS_BATCH, FEATURES_BATCH, None) is None
    term.finish(None, me)
    assert me.term_state["fa"]["counts"].tolist() == [2.0, 1.0, 1.0, 0.0]
    assert set(me.kept()["terms"]) == {"fa"} and not me.kept()["algorithm"]    # its own, not the algorithm's


class Two(nn.Module):
    """A feature extractor `body` (1 -> 2) and a linear classifier (2 -> classes)."""

    def __init__(self, classes=2):
        super().__init__()
        self.body, self.classifier = nn.Linear(1, 2), nn.Linear(2, classes)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.classifier(self.features(x))


def test_the_swap_gives_each_partner_exactly_the_others_classifier():
    algo = make("fedcme", Two(), num_clients=4, train={"clients_per_round": 4, "local_epochs": 2})
    swap = algo.plan(0)[1]
    assert swap.exchange.names == ("classifier.weight", "classifier.bias")
    clients = {c: client(c) for c in range(4)}
    for c, me in clients.items():
        me.state = {"half": {n: torch.full_like(t, float(c)) for n, t in Two().state_dict().items()}}
    sources = algo.exchange_sources(0, {PARTNERS: {"source": torch.tensor([3.0, 2.0, 1.0, 0.0])}})
    assert sources == {0: 3, 3: 0, 1: 2, 2: 1}
    worker = Worker(algo, clients, {"": Two()}, None, "cpu", 2, 10)
    worker.exchange(swap, 0, [0, 1, 2, 3], LocalTransport({c: 0 for c in range(4)}), sources)
    for c, partner in sources.items():
        assert torch.equal(clients[c].state["half"]["classifier.weight"], torch.full((2, 2), float(partner)))
        assert torch.equal(clients[c].state["half"]["body.weight"], torch.full((2, 1), float(c)))   # kept


@pytest.mark.parametrize("exchange", ["classifier", "model"])
def test_a_half_that_is_not_finite_neither_gives_nor_takes_at_the_swap(exchange):
    algo = make("fedcme", Two(), {"exchange": exchange}, num_clients=4,
                train={"clients_per_round": 4, "local_epochs": 2})
    clients = {c: client(c) for c in range(4)}
    for c, me in clients.items():
        me.state = {"half": {n: torch.full_like(t, float(c)) for n, t in Two().state_dict().items()}}
    for name in ("body.bias", "classifier.bias"):                    # client 0 diverged in its first half
        clients[0].state["half"][name][0] = float("nan")
    sources = {0: 3, 3: 0, 1: 2, 2: 1}
    worker = Worker(algo, clients, {"": Two()}, None, "cpu", 2, 10)
    worker.exchange(algo.plan(0)[1], 0, [0, 1, 2, 3], LocalTransport({c: 0 for c in range(4)}), sources)
    half = {c: clients[c].state["half"] for c in range(4)}
    assert torch.equal(half[3]["classifier.weight"], torch.full((2, 2), 3.0))      # its partner keeps its own
    assert half[0]["body.bias"].isnan().any() and torch.equal(half[0]["classifier.weight"], torch.full((2, 2), 0.0))
    assert torch.equal(half[1]["classifier.weight"], torch.full((2, 2), 2.0))      # the others swap as ever
    assert torch.equal(half[2]["classifier.weight"], torch.full((2, 2), 1.0))


# -- the evaluation vector (eq. 4) -----------------------------------------------------------------
class Lookup(nn.Module):
    """features = BatchNorm(x) without weights, logits = features + a bias favouring class 1. In eval
    mode (running mean 0, variance 1) a one-hot x predicts its own class; in training mode the batch's
    own statistics would decide."""

    def __init__(self, classes):
        super().__init__()
        self.norm, self.classifier = nn.BatchNorm1d(classes, affine=False), nn.Linear(classes, classes)
        with torch.no_grad():
            self.classifier.weight.copy_(torch.eye(classes))
            self.classifier.bias.copy_(0.5 * F.one_hot(torch.tensor(1), classes))

    def features(self, x):
        return self.norm(x)

    def forward(self, x):
        return self.classifier(self.features(x))


def _predicting(cid, labels, predictions, classes):
    """Client `cid` whose sample i has label labels[i], and that a Lookup model predicts predictions[i]."""
    return Client(cid, F.one_hot(torch.tensor(predictions), classes).float(), torch.tensor(labels),
                  np.bincount(labels, minlength=classes))


def test_evaluation_vector_is_per_class_accuracy_and_0_for_absent_classes():
    algo = make("fedcme", Lookup(4), {"eval_fraction": 1.0}, num_clients=3, classes=4, eval={"batch_size": 3})
    me = _predicting(1, [0, 0, 1, 1, 1, 2, 2, 2], [0, 1, 1, 1, 0, 3, 0, 1], 4)
    model = Lookup(4).train()                 # as training leaves it: evaluated in eval mode
    row = algo.evaluation(model, me, round=0)
    # class 0: 1 of 2 right, class 1: 2 of 3, class 2: none of 3, class 3: not held
    assert torch.allclose(row["vectors"][1], torch.tensor([0.5, 2 / 3, 0.0, 0.0], dtype=torch.float64))
    assert row["vectors"][[0, 2]].abs().sum() == 0 and row["evaluated"].tolist() == [0.0, 1.0, 0.0]


def test_evaluation_uses_a_seeded_fifth_of_the_data_and_at_least_one_sample():
    """Each sample its own class, always predicted right: the vector marks the evaluated samples."""
    algo = make("fedcme", Lookup(10), num_clients=3, classes=10)
    me = _predicting(2, list(range(10)), list(range(10)), 10)
    picked = algo.evaluation(Lookup(10), me, round=0)["vectors"][2]
    assert picked.sum() == 2 and set(picked.tolist()) == {0.0, 1.0}              # 20 % of 10
    other_rank = make("fedcme", Lookup(10), num_clients=3, classes=10)           # the draw is keyed, not local
    assert torch.equal(other_rank.evaluation(Lookup(10), me, round=0)["vectors"][2], picked)
    later = [algo.evaluation(Lookup(10), me, round=r)["vectors"][2] for r in (1, 2, 3)]
    assert any(not torch.equal(v, picked) for v in later)
    small = _predicting(0, [3, 7], [3, 7], 10)                                    # 20 % of 2 rounds to 0
    assert algo.evaluation(Lookup(10), small, round=0)["vectors"][0].sum() == 1


# -- whole rounds through the hooks -----------------------------------------------------------------
LABELS = ([0, 1, 1], [1, 2], [0, 2, 2, 2], [0, 1, 2], [2], [0, 1])     # client k's labels; its inputs x = y
SHIFT = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]                                   # s_k
FAVOURITE = [0, 1, 2, 0, 1, 2]
SEED = 22          # cohorts of 5 of the 6 clients: [0, 1, 2, 3, 4], then [0, 1, 2, 4, 5]


class EpochTrainer:
    """Stands in for LocalTrainer, one full batch per epoch e of `epochs`: the terms get the batch's
    features (the alignment term collects them; its loss is logged), then client k's epoch adds s_k to
    body.bias[1] and to every classifier weight, and 2 - e to the classifier bias of its favourite
    class (so a classifier that trained epoch 0 elsewhere predicts that client's favourite). Reports
    the loss epochs.start + 1 over `steps` steps per epoch."""

    def __init__(self, steps=2):
        self.steps, self.log = steps, []

    def train(self, model, client, round, terms=(), epochs=None):
        for e in epochs:
            features = model.features(client.x)
            losses = [term.loss(model, client.x, client.y, features, None) for term in terms]
            self.log.append((round, client.id, e, [None if v is None else v.item() for v in losses]))
            with torch.no_grad():
                model.body.bias[1] += SHIFT[client.id]
                model.classifier.weight += SHIFT[client.id]
                model.classifier.bias[FAVOURITE[client.id]] += 2 - e
        return {"train_loss": epochs.start + 1.0 if len(epochs) else 0.0, "steps": float(self.steps * len(epochs))}

    def losses(self, round, cid):
        return [losses for r, c, _, losses in self.log if (r, c) == (round, cid)]


def _start():
    """The initial model: features (x, 0), a zero classifier."""
    net = Two(classes=3)
    with torch.no_grad():
        net.body.weight.copy_(torch.tensor([[1.0], [0.0]]))
        net.body.bias.zero_()
        net.classifier.weight.zero_()
        net.classifier.bias.zero_()
    return net


def _clients():
    return {k: Client(k, torch.tensor(y, dtype=torch.float32)[:, None], torch.tensor(y), np.bincount(y, minlength=3))
            for k, y in enumerate(LABELS)}


def _fedcme(params, epochs=2):
    """The server's and the clients' FedCME (as on two ranks) and the server's initial state."""
    sections = {"run": {"seed": SEED, "rounds": 3}, "eval": {"batch_size": 2},
                "train": {"clients_per_round": 5, "local_epochs": epochs}}
    server, side = (make("fedcme", _start(), {"mu": 0.5, "eval_fraction": 1.0, **params}, num_clients=len(LABELS),
                         classes=3, **sections) for _ in range(2))
    return server, side, server.init_server_state(_start())


def _round(server, side, clients, state, round, trainer):
    """One round as hpcfl.runtime.loop runs it: downlinks packed to float32, the swap through a Worker,
    the sampled clients' uplinks summed. Returns, per phase, each client's (contributions, metrics)
    and its state after the phase, and the partners payload as "partners"."""
    job = server.setup.job
    cohort = [int(c) for c in cohort_schedule(SEED, job.run.rounds, len(clients), job.train.clients_per_round)[round]]
    model, out, downlink = Two(classes=3), {}, {}          # downlink: the round's broadcasts so far
    for phase in server.plan(round):
        if isinstance(phase, SwapPhase):
            worker = Worker(side, clients, {"": model}, trainer, "cpu", 3, 2)
            out["sources"] = side.exchange_sources(round, downlink)
            worker.exchange(phase, round, cohort, LocalTransport({c: 0 for c in clients}), out["sources"])
            continue
        payloads = server.downlink(phase, round, state) if phase.downlink else {}
        downlink.update({n: layout.unpack(layout.pack(payloads[n], dtype=torch.float32))
                         for n, layout in phase.downlink.items()})
        if PARTNERS in phase.downlink:
            out[PARTNERS] = downlink[PARTNERS]["source"].tolist()
        side.receive(phase, round, downlink)
        updates = {}
        for c in cohort:             # the contributions hold the shared model's tensors: copied at once
            contributions, metrics = side.client_update(phase, round, clients[c], downlink, model, trainer)
            updates[c] = {n: ({k: v.clone() for k, v in t.items()}, w) for n, (t, w) in contributions.items()}, metrics
        out[phase.name] = {c: (*updates[c], {o: {k: v.clone() for k, v in t.items()}
                                             for o, t in clients[c].state.items()}) for c in cohort}
        if phase.uplink:
            server.aggregate(phase, round, state, {n: sums(layout, *(updates[c][0][n] for c in cohort))
                                                   for n, layout in phase.uplink.items()})
    return out


def _stale():
    """What a client dropped for a non-finite second half keeps (train.on_nonfinite = "drop" gives it
    back its state of before that phase): the next round it is sampled must not see any of it."""
    return {"algorithm": {"half_loss": {"sum": torch.tensor([50.0, 1.0])},
                          "half": {"classifier.bias": torch.full((3,), 9.0)}},
            "terms": {"fa": {"sums": torch.full((3, 2), 9.0, dtype=torch.float64),
                             "counts": torch.full((3,), 9.0, dtype=torch.float64)}}}


def _sent(update):
    """(body.bias[1], the classifier weight (all equal), classifier bias, weight) of a client's model."""
    tensors, weight = update[0]["model"]
    w = tensors["classifier.weight"]
    assert torch.all(w == w.flatten()[0]) and tensors["body.bias"][0] == 0
    return tensors["body.bias"][1].item(), w.flatten()[0].item(), tensors["classifier.bias"].tolist(), weight


def _close(tensor, expected):
    return torch.allclose(tensor.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-6)


def test_two_rounds_by_hand_the_evaluation_vectors_and_features_of_round_0_drive_round_1():
    server, side, state = _fedcme({})
    clients, trainer = _clients(), EpochTrainer()
    assert state[EVALUATION]["vectors"].tolist() == [[1.0] * 3] * 6            # never evaluated
    clients[3].keep(_stale())                                    # the numbers below are a clean start's
    assert [p.name for p in server.plan(0)] == ["first", "swap", "second"]

    # round 0, cohort 0..4: all vectors tie, so pairs in cohort order (0, 1), (2, 3); 4 trains alone
    out = _round(server, side, clients, state, 0, trainer)
    assert out[PARTNERS] == [1, 0, 3, 2, -1, -1]
    assert out["sources"] == {0: 1, 1: 0, 2: 3, 3: 2}
    contributions, metrics, held = out["first"][0]
    assert contributions == {} and metrics == {}                 # the half-trained model stays on the client
    half = held["half"]
    assert half["body.bias"].tolist() == [0.0, 1.0] and half["classifier.bias"].tolist() == [2.0, 0.0, 0.0]
    assert held["half_loss"]["sum"].tolist() == [1.0 * 2, 2.0]       # loss x steps, steps
    # epoch 1 on the partner's classifier: bias (0, 2 s_k), classifier weight s_j + s_k, bias 2 e_fav(j) + e_fav(k)
    assert [_sent(out["second"][k]) for k in range(5)] == [
        (2.0, 3.0, [1.0, 2.0, 0.0], 3.0), (4.0, 3.0, [2.0, 1.0, 0.0], 2.0), (6.0, 7.0, [2.0, 0.0, 1.0], 4.0),
        (8.0, 7.0, [1.0, 0.0, 2.0], 3.0), (10.0, 10.0, [0.0, 3.0, 0.0], 1.0)]
    assert all(out["second"][k][1] == {"train_loss": (1.0 * 2 + 2.0 * 2) / 4, "steps": 4.0} for k in range(5))
    assert all(clients[k].kept() == {"algorithm": {}, "terms": {}} for k in range(6))  # nothing of the round is kept
    assert [trainer.losses(0, k) for k in range(5)] == [[[0.0], [0.0]]] * 5     # no global feature yet: no pull
    # FedAvg over 3 + 2 + 4 + 3 + 1 = 13 samples
    assert _close(state["model"]["body.weight"], [[1.0], [0.0]]) and _close(state["model"]["body.bias"], [0.0, 72 / 13])
    assert _close(state["model"]["classifier.weight"], [[74 / 13] * 2] * 3)
    assert _close(state["model"]["classifier.bias"], [18 / 13, 11 / 13, 10 / 13])
    # features (y, 0) in epoch 0 and (y, s_k) in epoch 1: client means (c, s_k / 2), averaged over holders
    assert _close(state[FEATURES]["anchors"], [[0.0, (0.5 + 1.5 + 2.0) / 3], [1.0, (0.5 + 1.0 + 2.0) / 3],
                                                  [2.0, (1.0 + 1.5 + 2.0 + 2.5) / 4]])
    assert state[FEATURES]["known"].tolist() == [1.0, 1.0, 1.0]
    # predictions: 0 -> 1, 1 -> 0, 2 -> 0, 3 -> 2, 4 -> 1 (its own); client 5 was not sampled
    assert state[EVALUATION]["vectors"].tolist() == [[0, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0], [1, 1, 1]]

    # round 1, cohort 0, 1, 2, 4, 5: similarities to the mean (.4, .4, .2) rank 1, 4 (zero vectors), 0, 2, 5;
    # 1 takes 4 (all 0, first), 0 takes 2 (cos 0 < .58 with 5), and 5 trains alone
    g = 72 / 13                                                  # the global body.bias[1]
    out = _round(server, side, clients, state, 1, trainer)
    assert out[PARTNERS] == [2, 4, 0, -1, 1, -1]
    anchor = [4 / 3, 3.5 / 3, 7 / 4]                             # round 0's global features, second coordinate
    assert trainer.losses(1, 4) == [[pytest.approx(0.5 * (g - anchor[2]) ** 2)],            # eq. 9 with mu = 0.5
                                    [pytest.approx(0.5 * (g + 5 - anchor[2]) ** 2)]]
    assert trainer.losses(1, 0) == [[pytest.approx(0.5 * ((g - anchor[0]) ** 2 + (g - anchor[1]) ** 2))],
                                    [pytest.approx(0.5 * ((g + 1 - anchor[0]) ** 2 + (g + 1 - anchor[1]) ** 2))]]
    # FedAvg over 3 + 2 + 4 + 1 + 2 = 12 samples of global + own and partner's updates
    assert _close(state["model"]["body.bias"], [0.0, g + (3 * 2 + 2 * 4 + 4 * 6 + 1 * 10 + 2 * 12) / 12])
    assert _close(state["model"]["classifier.weight"],
                  [[74 / 13 + (3 * 4 + 2 * 7 + 4 * 4 + 1 * 7 + 2 * 12) / 12] * 2] * 3)
    assert _close(state["model"]["classifier.bias"], [18 / 13 + 11 / 12, 11 / 13 + 9 / 12, 10 / 13 + 16 / 12])
    # client means (c, g + s_k / 2); a client lacking class c sends round 0's global feature (eq. 6's memory)
    assert _close(state[FEATURES]["anchors"], [[0.0, (3 * g + 0.5 + 1.5 + 3.0 + 2 * anchor[0]) / 5],
                                                  [1.0, (3 * g + 0.5 + 1.0 + 3.0 + 2 * anchor[1]) / 5],
                                                  [2.0, (3 * g + 1.0 + 1.5 + 2.5 + 2 * anchor[2]) / 5]])
    # predictions: 0 -> 2, 1 -> 1, 2 -> 0, 4 -> 1, 5 -> 2; client 3 keeps round 0's vector
    assert state[EVALUATION]["vectors"].tolist() == [[0, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("params, phases, swapped, sources, sent, class_0", [
    ({"exchange": "none"}, ["train"], None, None,                  # FedCME-OL: E epochs on its own model
     [(2, 2, [3, 0, 0]), (4, 4, [0, 3, 0]), (6, 6, [0, 0, 3]), (8, 8, [3, 0, 0]), (10, 10, [0, 3, 0])], 4 / 3),
    ({"exchange": "model"}, ["first", "swap", "second"], ["body.weight", "body.bias", "classifier.weight",
                                                          "classifier.bias"], [1, 0, 3, 2, -1, -1],       # FedCME-WM
     [(3, 3, [1, 2, 0]), (3, 3, [2, 1, 0]), (7, 7, [2, 0, 1]), (7, 7, [1, 0, 2]), (10, 10, [0, 3, 0])], 1.5),
    ({"exchange": "features"}, ["first", "swap", "second"], ["body.weight", "body.bias"], [1, 0, 3, 2, -1, -1],
     [(3, 2, [3, 0, 0]), (3, 4, [0, 3, 0]), (7, 6, [0, 0, 3]), (7, 8, [3, 0, 0]), (10, 10, [0, 3, 0])], 1.5),
    ({"matching": "many_to_one"}, ["first", "swap", "second"], ["classifier.weight", "classifier.bias"],
     [1, 0, 0, 0, 0, -1],                                          # FedCME-MTO: 0 feeds 1, 2, 3 and 4
     [(2, 3, [1, 2, 0]), (4, 3, [2, 1, 0]), (6, 4, [2, 0, 1]), (8, 5, [3, 0, 0]), (10, 6, [2, 1, 0])], 4 / 3),
], ids=["none", "model", "features", "many_to_one"])
def test_ablations_swap_what_they_name_with_whom_they_match(params, phases, swapped, sources, sent, class_0):
    """Round 0 of each ablation (section V-B): (body.bias[1], classifier weight, classifier bias) sent by
    clients 0..4, and class 0's global feature (the features follow the extractor that trained)."""
    server, side, state = _fedcme(params)
    clients, trainer = _clients(), EpochTrainer()
    clients[2].keep(_stale())                                    # as in the test above
    plan = server.plan(0)
    assert [p.name for p in plan] == phases
    assert swapped is None or list(plan[1].exchange.names) == swapped
    assert (PARTNERS in plan[0].downlink) == (sources is not None) and set(plan[0].downlink) >= {"model", FEATURES}
    out = _round(server, side, clients, state, 0, trainer)
    assert out.get(PARTNERS) == sources
    last = out[phases[-1]]
    assert [_sent(last[k])[:3] for k in range(5)] == [(float(b), float(w), [float(v) for v in c]) for b, w, c in sent]
    loss = 1.0 if params.get("exchange") == "none" else (1.0 * 2 + 2.0 * 2) / 4
    assert all(last[k][1] == {"train_loss": loss, "steps": 4.0} for k in range(5))
    assert not any("half" in last[k][2] for k in range(5))          # the mid-round model is not kept past the round
    assert _close(state[FEATURES]["anchors"][0], [0.0, class_0])


def test_one_local_epoch_swaps_before_training():
    """E = 1: floor(E / 2) = 0 epochs before the swap, which exchanges the global classifier; the round's
    loss is the one epoch's, over its one step."""
    server, side, state = _fedcme({}, epochs=1)
    clients, trainer = _clients(), EpochTrainer(steps=1)
    out = _round(server, side, clients, state, 0, trainer)
    assert out["first"][0][2]["half_loss"]["sum"].tolist() == [0.0, 0.0]
    assert [(r, c, e) for r, c, e, _ in trainer.log] == [(0, k, 0) for k in range(5)]
    assert [_sent(out["second"][k]) for k in (0, 4)] == [(1.0, 1.0, [2.0, 0.0, 0.0], 3.0),
                                                         (5.0, 5.0, [0.0, 2.0, 0.0], 1.0)]
    assert out["second"][0][1] == {"train_loss": 1.0, "steps": 1.0}


LR, MOMENTUM, DECAY, MU = 0.1, 0.9, 0.01, 0.5


def _sgd(start, x, y, anchors, known, steps):
    """`steps` full-batch steps of torch.optim.SGD by hand from `start`, with a fresh momentum buffer:
    d = grad(CE + MU * eq. 9) + DECAY w, buf <- MOMENTUM buf + d, w <- w - LR buf (eq. 10). Returns
    the parameters and the per-class sums of the features each step saw."""
    w, bufs, seen = {k: v.double() for k, v in start.items()}, {}, torch.zeros(3, 2, dtype=torch.float64)
    for _ in range(steps):
        leaves = {k: v.clone().requires_grad_() for k, v in w.items()}
        z = x.double() @ leaves["body.weight"].T + leaves["body.bias"]
        loss = F.cross_entropy(z @ leaves["classifier.weight"].T + leaves["classifier.bias"], y)
        for c in sorted(set(y.tolist())):
            seen[c] += z[y == c].detach().sum(0)
            if known[c]:
                loss = loss + MU * ((z[y == c].mean(0) - anchors[c]) ** 2).sum()
        grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())), strict=True))
        for k in w:
            d = grads[k] + DECAY * w[k]
            bufs[k] = d if k not in bufs else MOMENTUM * bufs[k] + d
            w[k] = w[k] - LR * bufs[k]
    return w, seen


def test_a_round_of_sgd_is_equations_8_to_10_with_the_classifier_swapped_halfway():
    """Two paired clients, E = 4 full-batch epochs of SGD (momentum, weight decay), mu = 0.5, global
    features known for classes 0 and 2: two steps, the swap (the optimizer rebuilt: ours), two steps
    on the partner's classifier; then FedAvg, and the local features averaged over the 4 epochs."""
    train = {"lr": LR, "momentum": MOMENTUM, "weight_decay": DECAY, "batch_size": 8, "local_epochs": 4,
             "clients_per_round": 2}
    torch.manual_seed(3)
    net = Two(classes=3)
    server, side = (make("fedcme", net, {"mu": MU}, num_clients=2, classes=3, train=train) for _ in range(2))
    state = server.init_server_state(net)
    anchors, known = torch.tensor([[0.2, -0.1], [0.0, 0.0], [-0.3, 0.4]]), torch.tensor([1.0, 0.0, 1.0])
    state[FEATURES]["anchors"].copy_(anchors)
    state[FEATURES]["known"].copy_(known)
    data = {0: (torch.tensor([[0.5], [-1.0], [2.0]]), torch.tensor([0, 1, 1])),
            1: (torch.tensor([[1.5], [0.3]]), torch.tensor([2, 0]))}
    clients = {k: Client(k, x, y, np.bincount(y, minlength=3)) for k, (x, y) in data.items()}
    out = _round(server, side, clients, state, 0, LocalTrainer(server.setup.job.train, seed=0))

    start = {k: v.clone() for k, v in net.state_dict().items()}
    half = {k: _sgd(start, *data[k], anchors.double(), known, 2) for k in data}
    finals, means = {}, {}
    for k, partner in ((0, 1), (1, 0)):
        swapped = {n: (half[partner] if n.startswith("classifier.") else half[k])[0][n] for n in start}
        finals[k], seen = _sgd(swapped, *data[k], anchors.double(), known, 2)
        sent = out["second"][k][0]["model"][0]
        assert all(torch.allclose(sent[n].double(), finals[k][n], rtol=1e-5, atol=1e-6) for n in start)
        counts = torch.bincount(data[k][1], minlength=3).double()[:, None] * 4
        means[k] = (half[k][1] + seen) / counts.clamp(min=1)
    for n in start:                                   # 3 and 2 samples
        assert torch.allclose(state["model"][n].double(), (3 * finals[0][n] + 2 * finals[1][n]) / 5, rtol=1e-5,
                              atol=1e-6)
    # class 0: both clients; class 1: client 0 only (not known before); class 2: client 1 and, for
    # client 0 that lacks it, the known global feature
    expected = torch.stack([(means[0][0] + means[1][0]) / 2, means[0][1], (means[1][2] + anchors[2].double()) / 2])
    assert torch.allclose(state[FEATURES]["anchors"].double(), expected, rtol=1e-5, atol=1e-6)


# -- configuration ------------------------------------------------------------------------------------
def _job(params=None, terms=(), **run):
    return job_from_dict({"algorithm": {"name": "fedcme", "params": params or {}, "terms": list(terms)},
                          "data": {"num_clients": 4, "local_test_ratio": 0.3}, "train": {"clients_per_round": 2},
                          "run": run})


def test_params_default_to_the_paper_and_are_frozen():
    params = FedCME.Params()
    assert (params.mu, params.exchange, params.matching, params.eval_fraction) == (0.01, "classifier", "pairs", 0.2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.mu = 0.1
    job = _job({"mu": 0.0, "exchange": "none", "matching": "many_to_one", "eval_fraction": 1.0}, ["prox"])
    assert job.algorithm.params["eval_fraction"] == 1.0 and "prox" in job.algorithm.terms


@pytest.mark.parametrize("params, terms, run, message", [
    ({"exchange": "classifiers"}, [], {}, r"\[algorithm.params\]: exchange = 'classifiers'; choose one of"),
    ({"matching": "one_to_one"}, [], {}, r"\[algorithm.params\]: matching = 'one_to_one'; choose"),
    ({"eval_fraction": 0.0}, [], {}, r"\[algorithm.params\]: eval_fraction = 0.0 must be in \(0, 1\]"),
    ({"eval_fraction": 1.5}, [], {}, r"eval_fraction = 1.5 must be in \(0, 1\]"),
    ({}, ["fm_cg"], {}, r"drop \['fm_cg'\] from algorithm.terms"),
    ({}, ["prox", "fm_l2"], {}, r"drop \['fm_l2'\] from algorithm.terms"),
    ({}, ["hpcfl.terms.matching:L2Matching"], {}, r"drop \['hpcfl.terms.matching:L2Matching'\]"),
    ({}, [], {"placement": "per_round"}, r"run.placement = 'per_round'"),      # FedAvg's rules hold too
    ({}, ["moon"], {}, r"moon contrasts with the client's model of its previous round, .* two halves .* drop moon"),
], ids=["exchange", "matching", "eval_fraction_0", "eval_fraction_above_1", "fm_cg", "fm_l2", "plugin_matching",
        "placement", "moon_across_halves"])
def test_bad_configuration_names_the_key(params, terms, run, message):
    with pytest.raises(ConfigError, match=message):
        _job(params, terms, **run)


def test_the_contracts_rules_hold_too():
    """FedCME's check adds to FedAvg's and the contract's: clients of several architectures are refused."""
    with pytest.raises(ConfigError, match="algorithm 'fedcme' shares whole models, so every client needs the same"):
        job_from_dict({"algorithm": {"name": "fedcme"}, "model": {"architectures": ["fmnist_cnn_narrow", "fmnist_cnn"]},
                       "data": {"num_clients": 4}, "train": {"clients_per_round": 2}})
    assert FedCME.traits.batched and FeatureAlignment.batchable      # tests/training/test_batched.py: its numbers


def test_moon_is_taken_where_a_client_trains_once_a_round():
    assert "moon" in _job({"exchange": "none"}, ["moon"]).algorithm.terms


def test_the_byte_counts_take_what_a_client_sends_not_every_clients_slot(tiny_job, tmp_path):
    """The evaluation uplink and the pairing travel as dense (clients x classes) and (clients,) buffers,
    but a client sends only its own row and needs only its partner's id: that is what the FL bytes count."""
    assert main([str(tiny_job("fedcme", rounds=1)), "--results-root", str(tmp_path), "--set", "run.name='run'"]) == 0
    arrays = read_run(tmp_path / "test" / "run.h5").arrays
    cohort, classes, features = 4, 10, 128                                       # digits on fmnist_cnn
    assert arrays["round/bytes_up/evaluation"][0] == 4 * classes * cohort
    assert arrays["round/bytes_down/partners"][0] == 4 * 1 * cohort
    assert arrays["round/bytes_up/features"][0] == 4 * (classes * features + classes) * cohort   # sums and counts
