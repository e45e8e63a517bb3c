"""FedClassAvg and FedProto (personalised, heterogeneous clients) against hand-computed numbers, and
their terms (SupCon, the classifier-only proximal term) against direct formulas; FedClassAvg as its
authors ran it (warm-up, temperature 100 on unnormalised pre-activation features)."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from algorithms.helpers import client, make, sums
from torch import nn

from hpcfl.algorithms.anchors import ANCHORS
from hpcfl.algorithms.base import WEIGHT, Client
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.models import build_model
from hpcfl.models.common import HeadOptions
from hpcfl.seeding import torch_seed
from hpcfl.terms import Prox, SupCon
from hpcfl.testing import StepTrainer
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
    assert sorted(server["model"]) == ["classifier.bias", "classifier.weight"]     # no feature extractor
    phase = algo.plan(0)[0]
    down = algo.downlink(phase, 0, server)
    a, b = client(0, samples=1), client(1, samples=3)
    for me, own in ((a, 1.0), (b, 2.0)):
        algo.init_client_state(me, Tiny())
        me.state = {"model": _state(own)}         # each client's own model
    trainers = [StepTrainer(shift=0.25), StepTrainer(shift=1.0)]
    ups = [algo.client_update(phase, 0, me, down, Tiny(), trainer)[0]
           for me, trainer in zip((a, b), trainers, strict=True)]
    for me, own, shift in ((a, 1.0, 0.25), (b, 2.0, 1.0)):       # the extractor is the client's own, trained, kept
        assert torch.equal(me.state["model"]["body.weight"], torch.full((2, 2), own + shift))
        assert torch.equal(me.state["model"]["classifier.bias"], torch.full((2,), 0.5 + shift))   # from the global
    assert sorted(ups[0]["shared"][0]) == [WEIGHT, "classifier.bias", "classifier.weight"]
    algo.aggregate(phase, 0, server, {"shared": sums(phase.uplink["shared"], ups[0]["shared"], ups[1]["shared"])})
    # 1 and 3 samples: (1 x 0.75 + 3 x 1.5) / 4 (a plain mean would give 1.125)
    assert torch.allclose(server["model"]["classifier.weight"], torch.full((2, 2), 1.3125))
    trainer = trainers[0]
    assert [type(t).__name__ for t in trainer.terms] == ["SupCon", "Prox"]
    assert trainer.terms[1].params.scope == "classifier" and trainer.terms[1].params.reduction == "mean"


def test_share_all_keeps_a_clients_own_batchnorm_layers_under_local_batchnorm():
    """FedBN under share = 'all': the whole model arrives, but the client starts from its own BN layers."""
    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.bn, self.classifier = nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Linear(2, 2)

        def features(self, x):
            return self.bn(self.body(x))

        def forward(self, x):
            return self.classifier(self.features(x))

    algo = make("fedclassavg", Normed(), {"share": "all"}, model={"batchnorm": "local"})
    server, phase, me = algo.init_server_state(Normed()), algo.plan(0)[0], client(0, samples=2)
    me.state = algo.init_client_state(me, Normed())
    for round, trained in ((0, 2.0), (1, 3.0)):         # the server's bn.weight stays 1: no aggregation here
        model = Normed()
        algo.client_update(phase, round, me, algo.downlink(phase, round, server), model, StepTrainer(shift=1.0))
        assert torch.equal(model.bn.weight.data, torch.full((2,), trained)) and \
            torch.equal(me.state["bn"]["bn.weight"], torch.full((2,), trained))


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
    algo = make("fedproto", Tiny(), {"weight": 2.0, "init": "shared"})       # the client starts from Tiny(1.0)
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
    assert torch.allclose(server[ANCHORS]["anchors"], torch.tensor([[1.0, 1.0], [1.0, 2.0]]))
    term = algo.terms[0]
    term.start(None, me, 1, {ANCHORS: server[ANCHORS]})
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



# -- the authors' setting: warm-up, temperature 100 on unnormalised pre-activation features ----------
AUTHORS = {"rho": 0.1, "temperature": 100.0, "base_temperature": 0.07, "normalize": False}
TRAIN = {"clients_per_round": 1, "optimizer": "adam", "lr": 1e-3, "betas": [0.5, 0.999], "weight_decay": 1e-4,
         "batch_size": 16}


def _digits_client(cid, samples):
    data = load_dataset("digits", resolve_data_root(None))
    idx = torch.from_numpy(np.random.default_rng(cid).permutation(len(data.train_y))[:samples])
    y = data.train_y[idx]
    return Client(cid, data.train_x[idx], y, np.bincount(y.numpy(), minlength=10)), (data.mean, data.std)


def _net(seed):
    torch.manual_seed(seed)
    return build_model("fmnist_cnn", (1, 8, 8), 10, HeadOptions(preactivation=True))


def _by_hand(initial, classifier, me, normalization, rounds):
    """The authors' order, spelled out: warm up the own initial model (prox towards its own initial
    classifier; draws keyed by the warm-up seed and client, round 0), take the global classifier,
    then train each round in `rounds` from the kept model (prox towards the global classifier)."""
    cfg = job_from_dict({"train": TRAIN}).train
    model = _net(0)
    model.load_state_dict(initial)

    def train(trainer, round, reference, epochs=None):
        prox = Prox(Prox.Params(AUTHORS["rho"], scope="classifier", reduction="mean"))
        prox.start(model, me, round, {"model": reference})
        supcon = SupCon(SupCon.Params(1.0, 100.0, 0.07, False))
        trainer.train(model, me, round, [supcon, prox], epochs)

    train(LocalTrainer(cfg, torch_seed(0, "fedclassavg.warmup"), normalization), 0, initial, range(1))
    for round in rounds:
        model.load_state_dict({**model.state_dict(), **classifier})
        train(LocalTrainer(cfg, 0, normalization), round, {k: v.clone() for k, v in model.state_dict().items()})
    return model.state_dict()


def test_warm_up_runs_once_per_client_keyed_by_the_client_and_uploads_nothing():
    algo = make("fedclassavg", _net(0), {**AUTHORS, "warmup_epochs": 1, "init": "shared"}, num_clients=4, train=TRAIN)
    initial = {k: v.clone() for k, v in _net(0).state_dict().items()}
    server = algo.init_server_state(_net(5))            # a global classifier unlike the clients' initial one
    classifier = {n: server["model"][n].clone() for n in ("classifier.weight", "classifier.bias")}
    phase = algo.plan(0)[0]
    kept = {}
    for torch_state in (11, 12):                        # two "workers": torch's global generator plays no part
        me, normalization = _digits_client(2, 96)
        trainer = LocalTrainer(algo.setup.job.train, 0, normalization)
        algo.init_client_state(me, _net(0))
        torch.manual_seed(torch_state)
        for round in (3, 6):                            # first sampled in round 3, then in round 6
            up, _ = algo.client_update(phase, round, me, algo.downlink(phase, round, server), _net(9), trainer)
            sent = {n: up["shared"][0][n] for n in classifier}
        kept[torch_state] = me.state["model"]
    expected = _by_hand(initial, classifier, me, normalization, rounds=(3, 6))
    for state in kept.values():
        assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in expected)
    assert all(torch.equal(sent[n], expected[n]) for n in classifier)       # the round's classifier, no warm-up's
    once = _by_hand(initial, classifier, me, normalization, rounds=(3,))
    assert not torch.equal(once["classifier.weight"], expected["classifier.weight"])     # round 6 trained on
    plain = make("fedclassavg", _net(0), {**AUTHORS, "init": "shared"}, num_clients=4, train=TRAIN)
    me, normalization = _digits_client(2, 96)
    plain.init_client_state(me, _net(0))
    plain.client_update(phase, 3, me, plain.downlink(phase, 3, server), _net(9), trainer)
    assert not torch.equal(me.state["model"]["fc.0.weight"], once["fc.0.weight"])          # the warm-up acts


def test_warm_up_runs_on_an_independently_initialised_model_too():
    """With init = "independent" the client holds its own model from the start: the warm-up must still
    run, once, on that model (it was skipped when the held model stood for "warmed up")."""
    algo = make("fedclassavg", _net(0), {**AUTHORS, "warmup_epochs": 1, "init": "independent"}, num_clients=4,
                train=TRAIN)
    server = algo.init_server_state(_net(5))
    classifier = {n: server["model"][n].clone() for n in ("classifier.weight", "classifier.bias")}
    phase = algo.plan(0)[0]
    me, normalization = _digits_client(2, 96)
    me.state = algo.init_client_state(me, _net(0))
    initial = {k: v.clone() for k, v in me.state["model"].items()}
    trainer = LocalTrainer(algo.setup.job.train, 0, normalization)
    for round in (3, 6):
        algo.client_update(phase, round, me, algo.downlink(phase, round, server), _net(9), trainer)
    expected = _by_hand(initial, classifier, me, normalization, rounds=(3, 6))
    assert all(torch.equal(me.state["model"][k], expected[k]) for k in expected)


def test_warm_up_parameters_are_checked():
    for params, message in (({"warmup_epochs": -1}, "warmup_epochs = -1 must be >= 0"),
                            ({"warmup_epochs": 1, "share": "all"}, "replaces the whole warmed-up model")):
        with pytest.raises(ConfigError, match=message):
            job_from_dict({"algorithm": {"name": "fedclassavg", "params": params}, "data": {"local_test_ratio": 0.3}})


def test_the_authors_setting_learns_on_heterogeneous_clients(tiny_job, tmp_path):
    """Temperature 100 on unnormalised pre-activation features (the loss x 1429) with the warm-up: the
    clients beat always answering their own majority class by a margin after 3 rounds."""
    arrays = _run(tiny_job("fedclassavg", rounds=3), tmp_path, *HETEROGENEOUS, "model.params.preactivation=true",
                  'train.optimizer="adam"', "train.lr=0.003", "train.betas=[0.5, 0.999]",
                  "algorithm.params.temperature=100.0", "algorithm.params.normalize=false",
                  "algorithm.params.warmup_epochs=1")
    counts = arrays["partition"]
    majority = float(np.mean(counts.max(1) / counts.sum(1)))           # about 0.32 on this split
    assert arrays["round/personal_acc_mean"][-1] > majority + 0.15, (arrays["round/personal_acc_mean"], majority)


PERSONAL = {"data": {"local_test_ratio": 0.3}}


def test_fedclassavg_defaults_and_rules_name_their_keys():
    from hpcfl.algorithms import ALGORITHMS, algorithm_params

    params = algorithm_params("fedclassavg", {})
    assert (params.rho, params.temperature, params.base_temperature, params.normalize) == (0.1, 0.07, 0.07, True)
    assert (params.share, params.warmup_epochs, params.supcon_weight) == ("classifier", 0, 1.0)
    with pytest.raises(ConfigError, match="supcon_weight = -0.5 must be >= 0"):
        algorithm_params("fedclassavg", {"supcon_weight": -0.5})
    with pytest.raises(ConfigError, match="share = 'some'"):
        algorithm_params("fedclassavg", {"share": "some"})
    with pytest.raises(ConfigError, match="already has its supcon"):
        job_from_dict({"algorithm": {"name": "fedclassavg", "terms": ["prox"]}, **PERSONAL})
    with pytest.raises(ConfigError, match="one feature-matching term"):          # the base rules still run
        job_from_dict({"algorithm": {"name": "fedclassavg", "terms": ["fm_cg", "fm_l2"]}, **PERSONAL})
    with pytest.raises(ConfigError, match="share = 'all' averages whole models"):
        job_from_dict({"algorithm": {"name": "fedclassavg", "params": {"share": "all"}},
                       "model": {"architectures": ["fmnist_cnn", "fmnist_cnn_narrow"]}, **PERSONAL})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.rho = 1.0
    from hpcfl.algorithms.base import Setup

    job = job_from_dict({"algorithm": {"name": "fedclassavg", "terms": ["fedrs"]}, **PERSONAL})
    net = build_model("fmnist_cnn", (1, 8, 8), 10)
    algorithm = ALGORITHMS["fedclassavg"](params, Setup.of(job, net, np.ones((20, 10), dtype=np.int64)))
    assert [t.name for t in algorithm.terms] == ["supcon", "prox", "fedrs"]     # its own terms, then the job's
    ablation = ALGORITHMS["fedclassavg"](algorithm_params("fedclassavg", {"supcon_weight": 0.0}),
                                         Setup.of(job, net, np.ones((20, 10), dtype=np.int64)))
    assert ablation.terms[0].params.weight == 0.0 and algorithm.terms[0].params.weight == 1.0


def test_fedproto_skips_classes_without_a_prototype_keeps_each_clients_model_and_checks_its_params():
    algo = make("fedproto", Tiny(), {"init": "shared"}, algorithm={"name": "fedproto", "terms": ["prox"]})
    assert algo.params.weight == 1.0 and [t.name for t in algo.terms] == ["proto", "prox"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        algo.params.weight = 2.0
    term = algo.terms[0]
    known = {"anchors": torch.tensor([[1.0, 1.0], [0.0, 0.0]]), "known": torch.tensor([1.0, 0.0])}
    term.start(None, client(0), 0, {ANCHORS: known})
    features = torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    # class 1 has no prototype yet: only sample 0 counts, (0, 2) off -> MSE 2
    assert term.loss(None, None, torch.tensor([0, 1]), features, None).item() == pytest.approx(2.0)
    assert term.loss(None, None, torch.tensor([1, 1]), features, None).item() == 0.0     # no prototype: no pull
    phase, me = algo.plan(0)[0], client(0, samples=2)
    me.x, me.y = torch.ones(2, 2), torch.tensor([0, 1])
    algo.init_client_state(me, Tiny(1.0))
    server = algo.init_server_state(Tiny())
    for round in range(2):                           # the client's own model carries over: 1 -> 1.5 -> 2
        model = Tiny(-9.0)
        algo.client_update(phase, round, me, algo.downlink(phase, round, server), model, StepTrainer(shift=0.5))
    assert torch.equal(me.state["model"]["classifier.bias"], torch.full((2,), 2.0))


@pytest.mark.parametrize("data, ok", [({}, False), ({"validation_fraction": 0.2}, True),
                                      ({"local_test_ratio": 0.3}, True)])
def test_personalised_accuracy_needs_held_out_data_of_the_clients(data, ok):
    job = {"algorithm": {"name": "local_only"}, "data": {"num_clients": 4, **data}, "train": {"clients_per_round": 2}}
    if ok:
        job_from_dict(job)
    else:
        with pytest.raises(ConfigError, match="set data.local_test_ratio"):
            job_from_dict(job)
    job_from_dict({**job, "algorithm": {"name": "ensemble"}, "train": {"clients_per_round": 4}})   # tests globally


@pytest.mark.parametrize("term", ["fm_l2", "hpcfl.terms.matching:ContrastiveGuiding"])
def test_personalised_algorithms_refuse_feature_matching_by_name_or_import_path(term):
    with pytest.raises(ConfigError, match=r"no global model to compute FedFM's anchors with: drop \["):
        job_from_dict({"algorithm": {"name": "local_only", "terms": [term]},
                       "data": {"num_clients": 4, "local_test_ratio": 0.3}, "train": {"clients_per_round": 2}})


@pytest.mark.parametrize("name", ["fedclassavg", "fedproto", "local_only"])
def test_each_client_starts_from_its_own_initialisation_unless_shared(name):
    """FedClassAvg's Algorithm 1 initialises each client's w_k^0, and both authors' codes build each
    client's model anew: clients of one architecture must not start alike; local training, their
    baseline, neither (its clients share nothing, an initial model included)."""
    from hpcfl.algorithms.initial import independent_init

    net = build_model("fmnist_cnn", (1, 8, 8), 2)
    algo = make(name, net, {})
    first, second = algo.init_client_state(client(0), net)["model"], algo.init_client_state(client(1), net)["model"]
    own = independent_init(net, algo.setup.job.run.seed, 0)
    assert algo.params.init == "independent" and all(torch.equal(first[k], own[k]) for k in own)
    assert not torch.equal(first["classifier.weight"], second["classifier.weight"])
    assert not torch.equal(first["classifier.weight"], net.state_dict()["classifier.weight"])
    shared = make(name, net, {"init": "shared"})
    assert shared.init_client_state(client(0), net) == {}                 # the architecture's one model, then


def test_fedprotos_term_runs_batched_its_params_are_frozen_and_one_sample_one_feature_is_not_halved():
    from hpcfl.algorithms.fedproto import PrototypeDistance

    assert PrototypeDistance.batchable
    with pytest.raises(dataclasses.FrozenInstanceError):
        PrototypeDistance.Params().weight = 2.0
    term = PrototypeDistance(PrototypeDistance.Params(weight=1.0))
    prototypes = {"anchors": torch.tensor([[0.0], [1.0]]), "known": torch.tensor([1.0, 0.0])}   # class 0 only
    term.start(None, client(0), 0, {ANCHORS: prototypes})
    # one sample with a prototype, one feature: (3 - 0)^2 / (1 x 1)
    assert term.loss(None, None, torch.tensor([0, 1]), torch.tensor([[3.0], [5.0]]), None).item() == pytest.approx(9.0)
