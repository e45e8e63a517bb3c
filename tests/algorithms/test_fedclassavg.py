"""FedClassAvg and FedProto (personalised, heterogeneous clients) against hand-computed numbers, and
their terms (SupCon, the classifier-only proximal term) against direct formulas."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from algorithms.helpers import StepTrainer, client, make, sums
from hpcfl.algorithms.base import WEIGHT
from hpcfl.anchors import ANCHORS
from hpcfl.config import job_from_dict
from hpcfl.errors import ConfigError
from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.regularizers import Prox, SupCon
from hpcfl.training import LocalTrainer


class Tiny(nn.Module):
    """features = body(x) (2 -> 2, no bias), classifier = Linear(2, 2), every weight set to `value`."""

    def __init__(self, value=0.0):
        super().__init__()
        self.body, self.classifier = nn.Linear(2, 2, bias=False), nn.Linear(2, 2)
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(value)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.classifier(self.features(x))


def _state(value):
    return {k: torch.full_like(v, value) for k, v in Tiny().state_dict().items()}


def test_only_the_classifier_travels_and_is_averaged_by_samples():
    algo = make("fedclassavg", Tiny())
    server = algo.init_server_state(Tiny(0.5))
    assert sorted(server) == ["model.classifier.bias", "model.classifier.weight"]     # no feature extractor
    phase = algo.plan(0)[0]
    down = algo.downlink(phase, 0, server)
    a, b = client(0, samples=1), client(1, samples=3)
    for me, own in ((a, 1.0), (b, 2.0)):
        algo.init_client_state(me, Tiny())
        me.state = {f"model.{k}": v for k, v in _state(own).items()}          # each client's own model
    trainer = StepTrainer(shift=0.25)
    ups = [algo.client_update(phase, 0, me, down, Tiny(), trainer)[0] for me in (a, b)]
    for me, own in ((a, 1.0), (b, 2.0)):       # the extractor is the client's own, trained and kept
        assert torch.equal(me.state["model.body.weight"], torch.full((2, 2), own + 0.25))
        assert torch.equal(me.state["model.classifier.bias"], torch.full((2,), 0.5 + 0.25))   # started from global
    assert sorted(ups[0]["shared"][0]) == [WEIGHT, "classifier.bias", "classifier.weight"]
    algo.aggregate(phase, 0, server, {"shared": sums(phase.uplink["shared"], ups[0]["shared"], ups[1]["shared"])})
    assert torch.allclose(server["model.classifier.weight"], torch.full((2, 2), 0.75))
    assert [type(t).__name__ for t in trainer.terms] == ["SupCon", "Prox"]
    assert trainer.terms[1].params.scope == "classifier" and trainer.terms[1].params.reduction == "mean"


def test_share_all_sends_the_whole_model_and_requires_one_architecture():
    algo = make("fedclassavg", Tiny(), {"share": "all"})
    assert set(algo.plan(0)[0].downlink["shared"].names) == {"body.weight", "classifier.weight", "classifier.bias"}
    with pytest.raises(ConfigError, match="same architecture"):
        job_from_dict({"algorithm": {"name": "fedclassavg", "params": {"share": "all"}},
                       "data": {"local_test_ratio": 0.3},
                       "model": {"architectures": ["fmnist_cnn", "fmnist_cnn_wide"]}})


def test_whole_model_algorithms_refuse_heterogeneous_clients():
    with pytest.raises(ConfigError, match="heterogeneous"):
        job_from_dict({"algorithm": {"name": "fedavg"}, "model": {"architectures": ["fmnist_cnn", "fmnist_cnn_wide"]}})
    with pytest.raises(ConfigError, match="model.architectures"):
        job_from_dict({"algorithm": {"name": "local_only"}, "data": {"local_test_ratio": 0.3},
                       "model": {"architectures": ["fmnist_cnn", "resnet19"]}})


def test_supcon_matches_its_definition():
    z = torch.tensor([[[1.0, 0.0], [0.8, 0.6]], [[0.0, 2.0], [0.6, 0.8]], [[-1.0, 0.5], [1.0, 1.0]]])  # 3 x 2 views
    y = torch.tensor([0, 0, 1])
    for normalize, temperature in ((True, 0.5), (False, 2.0)):
        term = SupCon(SupCon.Params(weight=1.5, temperature=temperature, base_temperature=0.07, normalize=normalize))
        flat = torch.cat([z[:, 0], z[:, 1]])
        flat = flat / flat.norm(dim=1, keepdim=True) if normalize else flat
        labels = torch.cat([y, y])
        per_anchor = []
        for i in range(6):
            others = [a for a in range(6) if a != i]
            denominator = sum(math.exp(float(flat[i] @ flat[a]) / temperature) for a in others)
            positives = [p for p in others if labels[p] == labels[i]]
            per_anchor.append(-sum(float(flat[i] @ flat[p]) / temperature - math.log(denominator)
                                   for p in positives) / len(positives))
        expected = 1.5 * temperature / 0.07 * sum(per_anchor) / 6
        assert term.loss(None, None, y, z, None).item() == pytest.approx(expected, rel=1e-5)


def test_classifier_prox_takes_each_tensors_mean_and_ignores_the_extractor():
    model, reference = Tiny(1.0), _state(0.0)
    reference["classifier.weight"][0, 0] = 3.0
    term = Prox(Prox.Params(mu=0.4, scope="classifier", reduction="mean"))
    term.start(model, None, 0, {"model": reference})
    # weight: (4 + 1 + 1 + 1) / 4 = 1.75, bias: 1; the body's distance (1 per entry) is not counted
    assert term.loss(model, None, None, None, None).item() == pytest.approx(0.2 * (1.75 + 1.0))
    full = Prox(Prox.Params(mu=0.4))
    full.start(model, None, 0, {"model": reference})
    assert full.loss(model, None, None, None, None).item() == pytest.approx(0.2 * (4 + 3 + 2 + 4))


def test_two_view_terms_get_both_views_and_the_task_loss_the_first():
    seen = []

    class Probe(SupCon):
        def loss(self, model, x, y, features, logits):
            seen.append((x, features.detach(), torch.allclose(logits, model.classifier(features[:, 0]))))
            return super().loss(model, x, y, features, logits)

    from hpcfl.models import build_model
    torch.manual_seed(0)
    model = build_model("fmnist_cnn", (1, 8, 8), 3)
    job = job_from_dict({"train": {"batch_size": 4}})
    me = client(0, samples=4)
    me.x, me.y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    trainer = LocalTrainer(job.train, seed=0, normalization=((0.5,), (0.25,)))
    trainer.train(model, me, 0, [Probe(SupCon.Params())])
    x, features, task_sees_view_one = seen[0]
    assert features.shape == (4, 2, 128) and task_sees_view_one
    assert not torch.equal(x, me.x) and not torch.equal(features[:, 0], features[:, 1])     # augmented views


def test_fedproto_trains_towards_the_global_prototypes_and_sends_class_sums():
    algo = make("fedproto", Tiny(), {"weight": 2.0})
    server = algo.init_server_state(Tiny())
    phase = algo.plan(0)[0]
    me = client(0, samples=3)
    me.x, me.y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    algo.init_client_state(me, Tiny(1.0))
    up, _ = algo.client_update(phase, 0, me, algo.downlink(phase, 0, server), Tiny(), StepTrainer(shift=0.0))
    # the model is the client's initial one (all ones): features (1, 1), (1, 1), (2, 2)
    assert torch.allclose(up[ANCHORS][0]["sums"].float(), torch.tensor([[1.0, 1.0], [3.0, 3.0]]))
    assert torch.equal(up[ANCHORS][0]["counts"], torch.tensor([1.0, 2.0], dtype=torch.float64))
    other = {"sums": torch.tensor([[0.0, 0.0], [0.0, 3.0]], dtype=torch.float64),
             "counts": torch.tensor([0.0, 1.0], dtype=torch.float64)}
    algo.aggregate(phase, 0, server, {ANCHORS: sums(phase.uplink[ANCHORS], up[ANCHORS], (other, 1.0))})
    assert torch.allclose(server["anchors.anchors"], torch.tensor([[1.0, 1.0], [1.0, 2.0]]))
    term = algo.regularizers[0]
    term.start(None, me, 1, {ANCHORS: algo.anchor_state(server)})
    features = torch.tensor([[2.0, 1.0], [1.0, 2.0]])
    # class 0: (1, 0) off its prototype, class 1: on it -> MSE = 1 / 4, times lambda = 2
    assert term.loss(None, None, torch.tensor([0, 1]), features, None).item() == pytest.approx(0.5)


def _run(job, root, *overrides):
    assert main([str(job), "--results-root", str(root), "--set", "run.name='run'",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return read_run(root / "test" / "run.h5").arrays


HETEROGENEOUS = ['model.architectures=["fmnist_cnn_narrow", "fmnist_cnn", "fmnist_cnn_wide"]',
                 "data.local_test_ratio=0.3", "train.clients_per_round=6"]


def test_heterogeneous_clients_send_only_the_classifier(tiny_job, tmp_path):
    arrays = _run(tiny_job("fedclassavg", rounds=2), tmp_path, *HETEROGENEOUS)
    classifier_floats = 128 * 10 + 10
    assert (arrays["round/bytes_down/shared"] == 4 * classifier_floats * 6).all()       # 6 clients per round
    assert (arrays["round/bytes_up/shared"] == 4 * (classifier_floats + 1) * 6).all()   # + the weight
    assert "round/test_acc" not in arrays and np.isfinite(arrays["round/personal_acc_std"]).all()


def test_heterogeneous_feature_widths_are_refused_before_training(tiny_job, tmp_path, capsys):
    assert main([str(tiny_job("local_only")), "--results-root", str(tmp_path), "--set", "data.local_test_ratio=0.3",
                 "--set", 'model.architectures=["fmnist_cnn", "alexnet_cifar"]']) == 2
    assert "same width" in capsys.readouterr().err
