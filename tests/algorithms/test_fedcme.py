"""FedCME: matching on hand-made evaluation vectors, the feature-alignment term against a direct
computation, the classifier swap through a worker, and the evaluation vector."""
import numpy as np
import pytest
import torch
from torch import nn

from algorithms.helpers import client, make
from hpcfl.algorithms.fedcme import FEATURES, OWN, FedCME, FeatureAlignment, make_matching, many_to_one
from hpcfl.runtime.worker import Worker
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


def test_many_to_one_lets_one_client_feed_several():
    sources = many_to_one(VECTORS, [0, 2, 3, 4])
    assert sources[0] == 4 and sources[2] == 4 and sources[3] == 4 and sources[4] == 0


def test_feature_alignment_matches_equation_9_and_accumulates_features():
    term = FeatureAlignment(FedCME.Params(mu=0.5))
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    me = client(0, samples=3)
    term.start(None, me, 0, {FEATURES: {"anchors": targets, "known": torch.tensor([1.0, 1.0, 0.0])}})
    features = torch.tensor([[2.0, 0.0], [0.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    y = torch.tensor([0, 0, 1, 2])
    # class 0: mean (1, 0) on target; class 1: (0, 3) vs (0, 1) -> 4; class 2 has no global feature yet
    assert term.loss(None, None, y, features, None).item() == pytest.approx(0.5 * 4.0)
    term.finish(None, me)
    assert torch.equal(me.state["fa.counts"], torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64))
    assert torch.equal(me.state["fa.sums"][2], torch.tensor([1.0, 1.0], dtype=torch.float64))


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.classifier = nn.Linear(1, 2), nn.Linear(2, 2)

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
        me.state = {OWN + n: torch.full_like(t, float(c)) for n, t in Two().state_dict().items()}
    algo.sources = {0: 3, 3: 0, 1: 2, 2: 1}
    worker = Worker(algo, clients, {"": Two()}, None, "cpu", 2, 10)
    worker.exchange(swap, 0, [0, 1, 2, 3], {}, LocalTransport({c: 0 for c in range(4)}))
    for c, partner in algo.sources.items():
        assert torch.equal(clients[c].state[OWN + "classifier.weight"], torch.full((2, 2), float(partner)))
        assert torch.equal(clients[c].state[OWN + "body.weight"], torch.full((2, 1), float(c)))   # kept


def test_evaluation_vector_is_per_class_accuracy_on_a_seeded_fifth():
    algo = make("fedcme", Two(), num_clients=3)
    me = client(1, samples=10)
    me.x, me.y = torch.zeros(10, 1), torch.tensor([0] * 5 + [1] * 5)
    model = Two()
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([1.0, 0.0]))       # always predicts class 0
        model.classifier.weight.zero_()
    row = algo.evaluation(model, me, round=0)
    assert row["evaluated"].tolist() == [0.0, 1.0, 0.0]
    picked = row["vectors"][1]
    assert set(picked.tolist()) <= {0.0, 1.0} and row["vectors"][[0, 2]].abs().sum() == 0
    assert torch.equal(row["vectors"], algo.evaluation(model, me, round=0)["vectors"])
