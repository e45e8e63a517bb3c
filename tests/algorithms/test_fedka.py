"""FedKA: class categories, knowledge-anchor construction and its loss against direct computations,
the shared set, and the forgetting degree (eq. 1) in the result file."""
import numpy as np
import pytest
import torch
from torch import nn

from algorithms.helpers import client
from hpcfl.config import job_from_dict
from hpcfl.data.partition import shared_set
from hpcfl.errors import ConfigError
from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.regularizers import KnowledgeAnchor, class_categories
from hpcfl.runtime.job import FORGETTING_XI

COUNTS = np.array([50, 3, 0, 0, 47])            # gamma 0.1: dominant {0, 4}, non-dominant {1}, missing {2, 3}


def test_class_categories_follow_definition_1():
    dominant, non_dominant, missing = class_categories(COUNTS, 0.1)
    assert dominant.tolist() == [True, False, False, False, True]
    assert non_dominant.tolist() == [False, True, False, False, False]
    assert missing.tolist() == [False, False, True, True, False]
    assert class_categories(COUNTS, 0.6)[1].tolist() == [True, True, False, False, True]   # nothing dominant


def _client():
    me = client(3, samples=100)
    me.class_counts = COUNTS
    me.y = torch.tensor([0] * 50 + [1] * 3 + [4] * 47)
    me.x = torch.arange(100, dtype=torch.float32)[:, None].repeat(1, 2)      # x = its own index
    me.shared = torch.full((5, 2), -1.0) * torch.arange(1, 6)[:, None], torch.arange(5)   # class k: -(k + 1)
    return me


@pytest.mark.parametrize("classes, expected", [("all", [1, 2, 3]), ("missing", [2, 3]), ("non_dominant", [1])])
def test_anchor_holds_shared_samples_of_missing_and_own_samples_of_non_dominant_classes(classes, expected):
    term = KnowledgeAnchor(KnowledgeAnchor.Params(gamma=0.1, classes=classes))
    term.seed = 7
    x, y = term.anchor(_client(), round=2)
    assert sorted(y.tolist()) == expected
    for row, label in zip(x, y.tolist()):
        if label in (2, 3):
            assert row[0].item() == -(label + 1)                     # the shared sample of that class
        else:
            assert 50 <= row[0].item() < 53                          # one of the client's own class-1 samples
    again, _ = term.anchor(_client(), round=2)
    assert torch.equal(x, again)                                     # seeded by (seed, round, client)


def test_anchor_is_down_sampled_to_size():
    term = KnowledgeAnchor(KnowledgeAnchor.Params(gamma=0.1, size=2))
    x, y = term.anchor(_client(), round=0)
    assert len(y) == 2 and set(y.tolist()) <= {1, 2, 3}


def test_knowledge_anchor_loss_drops_dominant_logits_and_divides_by_the_anchor_size():
    model = nn.Linear(2, 5, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.arange(10, dtype=torch.float32).view(5, 2) / 10)
    received = {k: v + 0.5 for k, v in model.state_dict().items()}       # the round's global model
    term = KnowledgeAnchor(KnowledgeAnchor.Params(weight=0.3, gamma=0.1))
    me = _client()
    term.start(model, me, 1, {"model": received})
    x = term.x
    teacher = x @ received["weight"].T
    local = model(x)
    keep = [1, 2, 3]                                                  # the non-dominant and missing classes
    expected = 0.3 * ((teacher[:, keep] - local[:, keep]) ** 2).sum() / len(x)
    assert term.loss(model, None, None, None, None).item() == pytest.approx(expected.item(), rel=1e-6)


def test_shared_set_has_one_seeded_sample_per_class():
    labels = np.random.default_rng(0).integers(0, 4, 200)
    picked = shared_set(labels, 4, seed=3)
    assert labels[picked].tolist() == [0, 1, 2, 3]
    assert np.array_equal(picked, shared_set(labels, 4, seed=3))
    assert not np.array_equal(picked, shared_set(labels, 4, seed=4))


def test_forgetting_degree_is_recorded_per_client_and_class(tiny_job, tmp_path):
    assert main([str(tiny_job("fedka", rounds=2)), "--results-root", str(tmp_path), "--set", "run.name='ka'",
                 "--set", "eval.forgetting=true", "--set", "algorithm.params.gamma=0.1"]) == 0
    arrays = read_run(tmp_path / "test" / "ka.h5").arrays
    start, local = arrays["class/start_acc"], arrays["client_class/test_acc"]
    assert start.shape == (2, 10) and local.shape == (2, 6, 10)
    np.testing.assert_array_equal(start[1], arrays["class/test_acc"][0])   # round 1 starts from round 0's model
    assert np.isnan(local).any(axis=2).sum() == 2 * (6 - 4)           # 4 of 6 clients sampled per round
    np.testing.assert_allclose(arrays["client_class/forgetting"], (start[:, None] - local) / (start[:, None] + FORGETTING_XI))
    assert len(arrays["shared_samples"]) == 10


def test_forgetting_needs_a_global_model():
    with pytest.raises(ConfigError, match="eval.forgetting"):
        job_from_dict({"algorithm": {"name": "local_only"}, "data": {"local_test_ratio": 0.3},
                       "eval": {"forgetting": True}})
