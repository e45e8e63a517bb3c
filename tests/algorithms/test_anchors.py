"""FedFM's anchors, feature-matching losses and anchor phase against hand-computed values."""
import math

import pytest
import torch
from algorithms.helpers import Scalar, make, sums
from torch import nn

from hpcfl.algorithms.anchored import WithAnchors, wrap
from hpcfl.algorithms.anchors import ANCHORS, anchor_layouts, initial_anchors, local_anchors, update_anchors
from hpcfl.algorithms.base import ONE, WEIGHT
from hpcfl.algorithms.base import Client as Record
from hpcfl.terms import ContrastiveGuiding, L2Matching


class Identity(nn.Module):
    """features(x) = x: local anchors are plain class means of x."""

    def features(self, x):
        return x


X = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0]])
Y = torch.tensor([0, 0, 2])                         # class 1 missing


def test_local_anchors_weighted_are_sums_and_counts():
    out = local_anchors(Identity(), X, Y, 2, (3, 2), "samples")
    assert torch.equal(out["sums"], torch.tensor([[4.0, 2.0], [0.0, 0.0], [0.0, 4.0]], dtype=torch.float64))
    assert torch.equal(out["counts"], torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64))
    empty = local_anchors(Identity(), X[:0], Y[:0], 2, (3, 2), "samples")          # a client with no samples
    assert torch.equal(empty["sums"], torch.zeros(3, 2, dtype=torch.float64)) and not empty["counts"].any()


def test_local_anchors_uniform_are_means_with_the_global_anchor_for_a_missing_class():
    current = {"anchors": torch.tensor([[9.0, 9.0], [5.0, 6.0], [7.0, 7.0]]), "known": torch.tensor([1.0, 1.0, 0.0])}
    out = local_anchors(Identity(), X, Y, 2, (3, 2), "uniform", current)
    assert torch.equal(out["sums"], torch.tensor([[2.0, 1.0], [5.0, 6.0], [0.0, 4.0]], dtype=torch.float64))
    assert torch.equal(out["counts"], torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64))
    unknown = local_anchors(Identity(), X, Y, 2, (3, 2), "uniform", initial_anchors(3, 2))
    assert unknown["counts"][1] == 0 and torch.equal(unknown["sums"][1], torch.zeros(2, dtype=torch.float64))


def test_global_anchors_are_count_weighted_and_a_class_nobody_holds_keeps_its_anchor():
    current = {"anchors": torch.tensor([[0.0, 0.0], [5.0, 5.0], [0.0, 0.0]]), "known": torch.tensor([0.0, 1.0, 0.0])}
    a = local_anchors(Identity(), X, Y, 2, (3, 2), "samples")
    b = local_anchors(Identity(), torch.tensor([[2.0, 2.0]]), torch.tensor([0]), 2, (3, 2), "samples")
    update_anchors(current, {k: a[k] + b[k] for k in a})
    # class 0: (1 + 3 + 2, 0 + 2 + 2) / 3 samples; class 1: nobody -> kept; class 2: (0, 4) / 1
    assert torch.allclose(current["anchors"], torch.tensor([[2.0, 4 / 3], [5.0, 5.0], [0.0, 4.0]]))
    assert torch.equal(current["known"], torch.tensor([1.0, 1.0, 1.0]))
    assert torch.isfinite(current["anchors"]).all()


def _matching(cls, **params):
    term = cls(cls.Params(**params))
    anchors = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]])
    term.start(None, None, 5, {"anchors": {"anchors": anchors, "known": torch.ones(3)}})
    return term, anchors


def test_contrastive_guiding_is_cross_entropy_over_cosine_similarities():
    term, anchors = _matching(ContrastiveGuiding, weight=2.0, tau=0.5, start_round=5)
    z = torch.tensor([[3.0, 4.0]])
    # cosines of (0.6, 0.8) with the normalised anchors: 0.6, 0.8, -(0.6 + 0.8)/sqrt(2)
    s = torch.tensor([0.6, 0.8, -1.4 / math.sqrt(2)]) / 0.5
    expected = 2.0 * (torch.logsumexp(s, 0) - s[1])
    assert term.loss(None, None, torch.tensor([1]), z, None).item() == pytest.approx(expected.item(), rel=1e-6)


def test_l2_matching_pulls_features_to_their_class_anchor_after_the_start_round():
    term, anchors = _matching(L2Matching, weight=0.5, start_round=5)
    z, y = torch.tensor([[3.0, 4.0], [0.0, 0.0]]), torch.tensor([0, 2])
    # normalised: (0.6, 0.8) against (1, 0), and the zero feature against (-1, -1) / sqrt(2);
    # squared distances 0.8 and 1.0, averaged over 2 samples x 2 dimensions
    assert term.loss(None, None, y, z, None).item() == pytest.approx(0.5 * (0.8 + 1.0) / 4)
    term.start(None, None, 4, {})                     # before T_s: no anchors needed, no loss
    assert term.loss(None, None, y, z, None) is None


def test_local_anchors_use_the_model_in_evaluation_mode_whatever_mode_it_arrives_in():
    """Anchors are class means of the received model's features: dropout off and BatchNorm on its
    running statistics, even if the model comes straight from training (FedFM-Lite)."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))

        def features(self, x):
            return self.body(x)

    model, x, y = Net(), torch.randn(8, 3) * 3 + 1, torch.tensor([0, 1, 0, 1, 1, 1, 0, 0])
    model.train()
    got = local_anchors(model, x, y, 3, (2, 4), "samples")
    with torch.no_grad():
        model.eval()
        features = model.features(x).double()
    # float32 products in batches of 3 and of 8 differ in rounding (the BLAS kernel follows the batch)
    torch.testing.assert_close(got["sums"][0], features[y == 0].sum(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got["sums"][1], features[y == 1].sum(0), rtol=1e-6, atol=1e-6)
    assert ANCHORS == "anchors" and anchor_layouts(2, 4)[0].names == ("anchors", "known")   # the result files' names


def test_the_anchor_phase_wraps_fedfm_round_by_round_against_hand_computed_anchors():
    """From start_round on a round opens with the anchor phase: the global model goes down (and the
    anchors, which only `uniform` weighting needs before it sends), each client sends its class feature
    sums under that model (weight 1), the server turns them into anchors; the algorithm's own phase then
    carries the anchors instead of the model and is the algorithm's own."""
    def net(w):
        net = Scalar(w)
        net.classifier = nn.Linear(1, 2)          # features 1 wide (Setup reads the classifier's in_features)
        return net

    inner = make("fedfm", net(1.0), {"start_round": 1})
    algo = wrap(inner)
    assert isinstance(algo, WithAnchors) and algo.plan(0) == inner.plan(0)         # before T_s: FedAvg alone
    opening, train = algo.plan(1)
    assert opening.name == ANCHORS and set(opening.downlink) == {"model"} and set(opening.uplink) == {ANCHORS}
    assert set(wrap(make("fedfm", net(1.0), {"start_round": 1, "anchor_weighting": "uniform"})).plan(1)[0].downlink) \
        == {"model", ANCHORS}
    assert set(train.downlink) == {ANCHORS} and train.uplink == inner.plan(1)[0].uplink
    state = algo.init_server_state(net(1.0))
    assert state[ANCHORS]["known"].tolist() == [0.0, 0.0] and float(state["model"]["w"]) == 1.0
    down = algo.downlink(opening, 1, state)
    assert float(down["model"]["w"]) == 1.0 and down.keys() == {"model"}
    model, record = net(1.0), Record(0, torch.tensor([[2.0], [3.0], [5.0]]), torch.tensor([0, 1, 1]), [1, 2])
    start = {**down["model"], "w": torch.tensor(0.5)}
    up, metrics = algo.client_update(opening, 1, record, {"model": start}, model, None)
    tensors, weight = up[ANCHORS]
    assert float(model.w.detach()) == 0.5 and weight == 1.0 and metrics == {}         # features 0.5 x
    assert tensors["sums"].flatten().tolist() == [1.0, 4.0] and tensors["counts"].tolist() == [1.0, 2.0]
    algo.aggregate(opening, 1, state, {ANCHORS: sums(opening.uplink[ANCHORS], up[ANCHORS])})
    assert state[ANCHORS]["anchors"].flatten().tolist() == [1.0, 2.0] and state[ANCHORS]["known"].tolist() == [1, 1]
    assert float(state["model"]["w"]) == 1.0                                         # the anchor phase moves no model
    assert algo.downlink(train, 1, state).keys() == {ANCHORS}                        # the model went down already
    received = []
    inner.receive = lambda *args: received.append(args[0].name)
    algo.receive(opening, 1, {})
    algo.receive(train, 1, {})
    assert received == [train.name]
    model_up = {**state["model"], "w": torch.tensor(3.0), WEIGHT: ONE}
    algo.aggregate(train, 1, state, {"model": sums(train.uplink["model"], (model_up, 2.0))})
    assert float(state["model"]["w"]) == 3.0 and state[ANCHORS]["anchors"].flatten().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("name", ["fedfm", "fedfm_lite"])
def test_a_preset_that_brings_its_own_matching_term_refuses_another(name):
    """fedfm with algorithm.terms = ["fm_l2"] trained with both losses, and the second's start round
    could come before the anchors it reads."""
    from hpcfl.errors import ConfigError
    from hpcfl.jobs import job_from_dict

    with pytest.raises(ConfigError, match=rf"has \['fm_cg', 'fm_l2'\]: use one feature-matching term \(algorithm "
                                          rf"'{name}' brings 'fm_cg' itself\)"):
        job_from_dict({"algorithm": {"name": name, "terms": ["fm_l2"]}})
    job_from_dict({"algorithm": {"name": "fedavg", "terms": ["fm_l2"]}})          # one term: fine
