"""FedMA through its own hooks, in the order the runtime calls them: a network matched against a copy
of itself with permuted hidden units comes back whole (conv, FC and LSTM), the last layer is the
class-weighted average and is retrained alone at lr/10 for 3x the epochs, independent networks kept
apart combine one-shot into the class-share-weighted sum of their logits, on real data one-shot
matching beats coordinate-wise averaging of the same independently initialised local models, the
baselines of its comparison start from the same independent initialisations, and gamma's prior alone
sets the global widths as the module docstring says."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from algorithms.helpers import client, make
from torch import nn

from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.base import Client, Setup
from hpcfl.algorithms.bbp_map import Prior, match_neurons
from hpcfl.algorithms.neurons import chain, place, place_inputs, width
from hpcfl.algorithms.phases import MATCHED
from hpcfl.config import TrainConfig
from hpcfl.data.datasets import load_dataset
from hpcfl.data.leaf import SHAKESPEARE_VOCAB
from hpcfl.data.partition import count_matrix, partition
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.models import build_model
from hpcfl.models.evaluation import evaluate
from hpcfl.testing import StepTrainer
from hpcfl.training import LocalTrainer


def _fedma(net, counts, **params):
    job = job_from_dict({"algorithm": {"name": "fedma", "params": params},
                         "data": {"num_clients": counts.shape[0]}, "train": {"clients_per_round": counts.shape[0]}})
    return ALGORITHMS["fedma"](algorithm_params("fedma", params), Setup.of(job, net, counts))


def _client(cid, state, counts):
    client = Client(cid, torch.zeros(0), torch.zeros(0, dtype=torch.long), counts[cid])
    client.state = {"model": {k: v.clone() for k, v in state.items()}}
    return client


def _match_all(algorithm, clients, template, round=0, trainer=None, metrics=None):
    """Every matching phase of a round, as the runtime runs it; returns the server state and replies
    (and puts the clients' metrics of each phase in `metrics`, if given)."""
    server_state, replies = algorithm.init_server_state(template), {}
    for phase in algorithm.plan(round)[1:]:
        gathered = {c.id: algorithm.gather_out(phase, round, c).double() for c in clients}
        shared, replies[phase.name] = algorithm.match(phase, round, server_state, gathered)
        algorithm.receive(phase, round, {MATCHED: {"global": shared}})
        for c in clients:
            received = {MATCHED: {"global": shared, "reply": replies[phase.name][c.id]}}
            _, out = algorithm.client_update(phase, round, c, received, algorithm.client_model(c, template), trainer)
            if metrics is not None:
                metrics.setdefault(phase.name, []).append(out)
    return server_state, replies


def _permuted_copy(net, seed):
    """The same network with the hidden units of every layer but the last permuted; and the permutations."""
    state, layers, perms = dict(net.state_dict()), chain(net), []
    for i, layer in enumerate(layers[:-1]):
        n = width(state, layer)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + i))
        state = place_inputs(place(state, layer, perm, n), layers[i + 1], perm, n, n)
        perms.append(perm)
    return state, perms


@pytest.mark.parametrize("name, shape, classes", [("fmnist_cnn", (1, 12, 12), 10), ("char_lstm", (6,), 12)])
def test_a_network_and_its_permuted_copy_match_back_to_the_network(name, shape, classes):
    torch.manual_seed(0)
    net = build_model(name, shape, classes).eval()
    for p in net.parameters():
        nn.init.normal_(p)                       # neurons far from the prior's 0: matching them pays
    counts = np.array([[5] * classes, [1] * classes])
    algorithm = _fedma(net, counts, sigma=1e-6, retrain=False)    # tight sigma: the mean is the network itself
    copied, perms = _permuted_copy(net, seed=3)
    clients = [_client(0, net.state_dict(), counts), _client(1, copied, counts)]
    server_state, replies = _match_all(algorithm, clients, net)
    for layer, perm in zip(chain(net)[:-1], perms, strict=True):
        assert torch.equal(replies[f"match_{layer.name}"][0], torch.arange(len(perm)))
        assert torch.equal(replies[f"match_{layer.name}"][1], torch.argsort(perm))   # copy's unit m is unit perm^-1[m]
    for key, value in net.state_dict().items():
        torch.testing.assert_close(server_state["model"][key], value, rtol=1e-5, atol=1e-5)
    x = torch.randint(0, classes, (4, *shape)) if len(shape) == 1 else torch.randn(4, *shape)
    torch.testing.assert_close(algorithm.global_module(server_state, net)(x), net(x), rtol=1e-4, atol=1e-3)
    assert algorithm.server_metrics(server_state)["growth_rate"] == pytest.approx(1.0)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.classifier = nn.Linear(2, 3)

    def forward(self, x):
        return self.classifier(torch.relu(self.fc(x)))


def test_the_last_layer_is_averaged_per_class_by_each_clients_share_of_the_class():
    counts = np.array([[3, 1, 0], [1, 1, 0]])
    algorithm = _fedma(Tiny(), counts)
    a = torch.arange(9, dtype=torch.float64).reshape(3, 3)        # client rows: 2 weights + bias per class
    b = 10 + a
    server_state = algorithm.init_server_state(Tiny())
    last = algorithm.plan(0)[-1]
    shared, replies = algorithm.match(last, 0, server_state, {0: a.reshape(-1), 1: b.reshape(-1)})
    assert shared.numel() == 0 and all(r.numel() == 0 for r in replies.values())   # nothing goes back down
    expected = torch.stack([0.75 * a[0] + 0.25 * b[0], 0.5 * a[1] + 0.5 * b[1], 0.5 * a[2] + 0.5 * b[2]])
    torch.testing.assert_close(server_state["model"]["classifier.weight"], expected[:, :2].float())
    torch.testing.assert_close(server_state["model"]["classifier.bias"], expected[:, 2].float())


def test_a_class_with_one_sample_in_the_federation_takes_its_holders_row():
    counts = np.array([[3, 1, 1], [1, 1, 0]])                    # class 2: one sample, client 0's
    algorithm = _fedma(Tiny(), counts)
    a, b = torch.arange(9, dtype=torch.float64).reshape(3, 3), 10 + torch.arange(9, dtype=torch.float64).reshape(3, 3)
    server_state = algorithm.init_server_state(Tiny())
    algorithm.match(algorithm.plan(0)[-1], 0, server_state, {0: a.reshape(-1), 1: b.reshape(-1)})
    torch.testing.assert_close(server_state["model"]["classifier.weight"][2], a[2, :2].float())
    torch.testing.assert_close(server_state["model"]["classifier.bias"][2], a[2, 2].float())


def test_one_shot_lenets_kept_apart_give_the_class_share_weighted_sum_of_the_clients_logits():
    """retrain = false with a tight sigma: distinct neurons never join (the gain of a new neuron beats
    joining by |w - u|^2 / (2 sigma)), so every layer is the clients' layers side by side, the next
    layer's inputs permuted and zero-padded to match, and the class-averaged last layer makes logit k
    the sum over clients of share_jk * (client j's logit k); class 9, held by nobody: the plain mean."""
    counts = np.array([[6, 1, 0, 2, 5, 1, 1, 3, 2, 0], [2, 3, 4, 2, 0, 1, 1, 1, 2, 0], [0, 4, 4, 4, 5, 2, 6, 1, 4, 0]])
    torch.manual_seed(0)
    template = build_model("lenet", (1, 16, 16), 10).eval()
    algorithm = _fedma(template, counts, sigma=1e-6, sweeps=1, max_width=2000, retrain=False)
    clients = [_client(c, algorithm.init_client_state(client(c), template)["model"], counts)
               for c in range(3)]                                                  # independent initialisations
    locals_ = [copy.deepcopy(template) for _ in clients]
    for model, c in zip(locals_, clients, strict=True):
        model.load_state_dict(c.state["model"])
    server_state, _ = _match_all(algorithm, clients, template)
    assert algorithm.widths == [60, 150, 1500, 10]
    x = torch.randn(8, 1, 16, 16)
    share = torch.tensor(counts / np.maximum(counts.sum(0), 1), dtype=torch.float32)
    share[:, 9] = 1 / 3
    expected = sum(share[j] * model(x) for j, model in enumerate(locals_))
    torch.testing.assert_close(algorithm.global_module(server_state, template)(x), expected, rtol=1e-4, atol=1e-4)


def test_one_shot_matching_beats_coordinate_wise_averaging_of_the_same_local_models(tmp_path):
    data = load_dataset("digits", tmp_path)
    labels = data.train_y.numpy()
    parts = partition(labels, 4, "dirichlet", {"beta": 0.5}, seed=0, min_samples=10)
    counts = count_matrix(labels, parts, data.num_classes)
    torch.manual_seed(0)
    template = build_model("fmnist_cnn", data.input_shape, data.num_classes)
    algorithm = _fedma(template, counts, retrain=False)
    trainer = LocalTrainer(TrainConfig(local_epochs=5, batch_size=16, lr=0.05, momentum=0.5), seed=0)
    clients = []
    for cid, idx in enumerate(parts):
        client = Client(cid, data.train_x[idx], data.train_y[idx], counts[cid])
        client.state = algorithm.init_client_state(client, template)          # independent initialisations
        algorithm.client_update(algorithm.plan(0)[0], 0, client, {}, algorithm.client_model(client, template), trainer)
        clients.append(client)
    local = [{k: v.clone() for k, v in c.state["model"].items()} for c in clients]
    assert not torch.equal(local[0]["conv.0.weight"], local[1]["conv.0.weight"])
    averaged = copy.deepcopy(template)
    averaged.load_state_dict({k: sum(s[k] for s in local) / len(local) for k in local[0]})
    server_state, _ = _match_all(algorithm, clients, template)
    test = data.test_x, data.test_y, data.num_classes, 256
    matched_acc = evaluate(algorithm.global_module(server_state, template), *test)["acc"]
    averaged_acc = evaluate(averaged, *test)["acc"]
    assert matched_acc > averaged_acc + 0.15, (matched_acc, averaged_acc)      # measured: 0.33 vs 0.10


def test_partial_participation_terms_dropping_a_client_and_forgetting_are_refused():
    base = {"algorithm": {"name": "fedma"}, "data": {"num_clients": 4}}
    with pytest.raises(ConfigError, match="clients_per_round = data.num_clients = 4"):
        job_from_dict({**base, "train": {"clients_per_round": 2}})
    with pytest.raises(ConfigError, match="terms"):
        job_from_dict({**base, "train": {"clients_per_round": 4},
                       "algorithm": {"name": "fedma", "terms": {"prox": {}}}})
    with pytest.raises(ConfigError, match="a client cannot be left out of it: set train.on_nonfinite = 'stop'"):
        job_from_dict({**base, "train": {"clients_per_round": 4, "on_nonfinite": "drop"}})
    with pytest.raises(ConfigError, match="starts from its own-width slice of the global model .*: set "
                                          "eval.forgetting = false"):
        job_from_dict({**base, "train": {"clients_per_round": 4}, "eval": {"forgetting": True}})


def test_a_client_whose_model_is_not_finite_stops_the_run_before_its_neurons_are_matched():
    from hpcfl.errors import TrainingFault

    torch.manual_seed(0)
    net = MLP()
    fedma = make("fedma", net, {}, train={"clients_per_round": 4})
    me = client(2)
    me.state = fedma.init_client_state(me, net)
    with pytest.raises(TrainingFault, match=r"round 1, phase 'train': client 2's model is not finite \(NaN/Inf\) "
                                            r"after training, and fedma cannot match its neurons"):
        fedma.client_update(fedma.plan(0)[0], 0, me, {}, net, StepTrainer(target=float("nan")))


def test_the_shakespeare_job_matches_lstms_of_speaking_roles(tmp_path, capsys):
    """jobs/fedma/shakespeare-lstm.toml, shrunk, on LEAF-format files: each client one role (natural
    partition), its embedding and LSTM units matched, the global model's growth recorded; its last layer
    retrains like the others (the lr / 10, 3x epochs of the authors' CNN code is VGG-9's, Appendix A)."""
    rng = np.random.default_rng(0)
    vocab = list(SHAKESPEARE_VOCAB[:30])
    users = {f"ROLE_{k}": ["".join(rng.choice(vocab, 80)) for _ in range(24 + 6 * k)] for k in range(4)}
    for split, part in (("train", slice(0, -4)), ("test", slice(-4, None))):
        blob = {"users": list(users), "user_data": {u: {"x": x[part], "y": [s[0] for s in x[part]]}
                                                     for u, x in users.items()}}
        (tmp_path / "shakespeare" / split).mkdir(parents=True)
        (tmp_path / "shakespeare" / split / "all.json").write_text(json.dumps(blob))
    job = Path(__file__).resolve().parents[2] / "jobs" / "fedma" / "shakespeare-lstm.toml"
    sets = ["data.num_clients=3", "train.clients_per_round=3", "data.partition_params={min_owner_samples = 25}",
            "run.rounds=2", "train.local_epochs=1", "algorithm.params.retrain_epochs=1", "train.lr=0.5",
            "run.name='small'"]
    assert main([str(job), "--data-root", str(tmp_path), "--results-root", str(tmp_path / "results"),
                 *(a for s in sets for a in ("--set", s))]) == 0
    run = read_run(tmp_path / "results" / "fedma-shakespeare-lstm" / "small.h5")
    params = run.attrs["resolved"]["algorithm"]["params"]
    assert (params["last_lr_scale"], params["last_epochs_scale"]) == (1.0, 1)
    arrays = run.arrays
    sizes = np.asarray(arrays["partition"]).sum(1)
    assert sorted(sizes.tolist()) == [26, 32, 38]                     # roles 1-3 (role 0 has 20 < 25 samples)
    assert (arrays["round/width/lstm"] >= 256).all() and (arrays["round/width/encoder"] >= 8).all()
    assert (arrays["round/growth_rate"] >= 1.0).all() and (arrays["round/bytes_up/match_lstm"] > 0).all()
    assert np.isfinite(arrays["round/test_loss"]).all()
    sets[-1] = "run.name='augmented'"
    assert main([str(job), "--data-root", str(tmp_path), "--results-root", str(tmp_path / "results"),
                 *(a for s in [*sets, "train.augment='crop_flip'"] for a in ("--set", s))]) == 2
    assert "train.augment = 'crop_flip' crops and flips images, but data set 'shakespeare' holds sequences" in \
        capsys.readouterr().err


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.classifier = nn.Linear(4, 6), nn.Linear(6, 5), nn.Linear(5, 3)

    def features(self, x):
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))

    def forward(self, x):
        return self.classifier(self.features(x))


class LrTrainer(LocalTrainer):
    """The real trainer, noting the learning rate of every optimiser it makes."""

    def __init__(self, cfg, seed):
        super().__init__(cfg, seed)
        self.lrs = []

    def optimizer(self, params):
        opt = super().optimizer(params)
        self.lrs.append(opt.param_groups[0]["lr"])
        return opt


@pytest.mark.parametrize("params, last_lr, last_steps", [({}, 0.005, 24),             # the authors': lr/10, 3x
                                                         ({"last_lr_scale": 0.5, "last_epochs_scale": 2}, 0.025, 16),
                                                         ({"last_lr_scale": 1.0, "last_epochs_scale": 1}, 0.05, 8)])
def test_the_last_layer_is_retrained_alone_at_a_tenth_of_the_lr_for_three_times_the_epochs(params, last_lr, last_steps):
    torch.manual_seed(0)
    net, counts = MLP(), np.array([[10, 5, 5], [4, 8, 8]])
    algorithm = _fedma(net, counts, retrain_epochs=2, **params)
    trainer = LrTrainer(TrainConfig(local_epochs=1, batch_size=5, lr=0.05, momentum=0.9, weight_decay=1e-4), seed=0)
    gen, clients = torch.Generator().manual_seed(1), []
    for cid in range(2):                     # 20 samples, batches of 5: 4 steps an epoch
        y = torch.repeat_interleave(torch.arange(3), torch.as_tensor(counts[cid]))
        client = Client(cid, torch.randn(20, 4, generator=gen), y, counts[cid])
        client.state = algorithm.init_client_state(client, net)
        _, trained = algorithm.client_update(algorithm.plan(0)[0], 0, client, {}, algorithm.client_model(client, net),
                                             trainer)
        assert trained["steps"] == 4
        clients.append(client)
    before = {"model": {k: v.clone() for k, v in clients[0].state["model"].items()}}
    metrics = {}
    _match_all(algorithm, clients, net, trainer=trainer, metrics=metrics)
    assert [m["steps"] for m in metrics["match_fc1"]] == [8, 8]                 # fc2 and classifier: 2 epochs
    assert [m["steps"] for m in metrics["match_fc2"]] == [last_steps] * 2       # the classifier alone
    assert metrics["match_classifier"] == [{}, {}]
    assert trainer.lrs == pytest.approx([0.05] * 4 + [last_lr] * 2)
    assert not torch.equal(clients[0].state["model"]["classifier.weight"], before["model"]["classifier.weight"])


def test_retraining_parameters_are_checked():
    with pytest.raises(ConfigError, match="last_lr_scale = 0.0 must be > 0"):
        algorithm_params("fedma", {"last_lr_scale": 0.0})
    with pytest.raises(ConfigError, match="last_epochs_scale = 0 >= 1"):
        algorithm_params("fedma", {"last_epochs_scale": 0})


@pytest.mark.parametrize("J, gamma, each", [(16, 7.0, 1), (10, 7.0, 2), (16, 20.0, 4), (8, 3.0, 0)])
def test_with_the_prior_alone_every_client_after_the_first_opens_f_new_neurons(J, gamma, each):
    """The module docstring's f = #{k >= 1 : k < gamma / J * sqrt(J - 1)}: 7/16 * 3.87 = 1.69, 7/10 * 3
    = 2.1, 20/16 * 3.87 = 4.84, 3/8 * 2.65 = 0.99."""
    neurons = [np.zeros((20, 3)) for _ in range(J)]         # zero weights, zero bias prior: no data term
    means, _ = match_neurons(neurons, np.zeros(3, dtype=bool), Prior(gamma=gamma, bias_mean=0.0),
                             np.random.default_rng(0))
    assert means.shape[0] == 20 + (J - 1) * each


@pytest.mark.parametrize("name, params, train", [("fedavg", {}, {"clients_per_round": 1}),
                                                 ("fedprox", {"mu": 0.1}, {"clients_per_round": 1}),
                                                 ("local_only", {}, {"clients_per_round": 1}),
                                                 ("ensemble", {}, {"clients_per_round": 4})])
def test_fedmas_baselines_start_each_client_from_its_fedma_initialisation(name, params, train):
    """init = "independent" (Appendix A): FedAvg, FedProx and the ensemble's local models start where
    FedMA's clients do, drawn from (run.seed, "init", client); "shared": from the run's initial model."""
    torch.manual_seed(0)
    net = MLP()
    shared = {k: v.clone() for k, v in net.state_dict().items()}
    fedma = make("fedma", net, {}, train={"clients_per_round": 4}, run={"seed": 5})
    fedmas = [fedma.init_client_state(client(cid), net)["model"] for cid in (0, 1)]
    starts = {}
    for init in ("independent", "shared"):
        algo = make(name, net, {**params, "init": init}, train=train, run={"seed": 5})
        for cid in (0, 1):
            me = client(cid)
            me.state = algo.init_client_state(me, net)
            if name in ("fedavg", "fedprox"):
                update, _ = algo.client_update(algo.plan(0)[0], 0, me, {"model": shared}, net, StepTrainer())
                tensors = update["model"][0]
            else:
                tensors = algo.own_model(me)
            starts[init, cid] = {k: tensors[k].clone() for k in shared}
    for cid in (0, 1):
        assert all(torch.equal(starts["independent", cid][k], fedmas[cid][k]) for k in shared)
        assert all(torch.equal(starts["shared", cid][k], shared[k]) for k in shared)
    assert not torch.equal(starts["independent", 0]["fc1.weight"], starts["independent", 1]["fc1.weight"])
    assert not torch.equal(starts["independent", 0]["fc1.weight"], shared["fc1.weight"])


def _trained_mlps(algorithm, net, counts, trainer):
    """Two clients of MLP, each trained once from its own initialisation (20 samples)."""
    gen, clients = torch.Generator().manual_seed(1), []
    for cid in range(2):
        y = torch.repeat_interleave(torch.arange(3), torch.as_tensor(counts[cid]))
        c = Client(cid, torch.randn(20, 4, generator=gen), y, counts[cid])
        c.state = algorithm.init_client_state(c, net)
        algorithm.client_update(algorithm.plan(0)[0], 0, c, {}, algorithm.client_model(c, net), trainer)
        clients.append(c)
    return clients


def test_retraining_after_a_matched_layer_keeps_it_and_those_before_as_matched_and_trains_the_rest():
    torch.manual_seed(0)
    net, counts = MLP(), np.array([[10, 5, 5], [4, 8, 8]])
    algorithm = _fedma(net, counts)
    trainer = LocalTrainer(TrainConfig(local_epochs=1, batch_size=5, lr=0.05, momentum=0.9, weight_decay=1e-4), seed=0)
    clients = _trained_mlps(algorithm, net, counts, trainer)
    server_state = algorithm.init_server_state(net)
    for phase in algorithm.plan(0)[1:-1]:                          # match_fc1, match_fc2
        i = algorithm.phase_layer[phase.name]
        gathered = {c.id: algorithm.gather_out(phase, 0, c).double() for c in clients}
        shared, replies = algorithm.match(phase, 0, server_state, gathered)
        algorithm.receive(phase, 0, {MATCHED: {"global": shared}})
        for c in clients:
            installed = algorithm._install(c.state["model"], i, shared, replies[c.id].long())
            received = {MATCHED: {"global": shared, "reply": replies[c.id]}}
            algorithm.client_update(phase, 0, c, received, algorithm.client_model(c, net), trainer)
            for layer in algorithm.layers[:i + 1]:                 # matched: frozen while the rest retrains
                for p in layer.params:
                    torch.testing.assert_close(c.state["model"][p.key], server_state["model"][p.key])
            for layer in algorithm.layers[i + 1:]:                 # the layers after it did retrain
                key = layer.params[0].key
                assert not torch.equal(c.state["model"][key], installed[key]), (phase.name, key)


def test_a_client_starts_a_round_from_the_global_model_cut_to_its_own_neurons():
    """Section 2.3: from round 1 a client's model is the global one at the positions its last assignments
    gave its neurons, for every layer but the last (its classes); and a worker that only received the
    matched layers, or resumed from a checkpoint, knows the same global widths as the server."""
    torch.manual_seed(0)
    net, counts = MLP(), np.array([[10, 5, 5], [4, 8, 8]])
    algorithm = _fedma(net, counts, retrain=False)
    trainer = LocalTrainer(TrainConfig(local_epochs=1, batch_size=5, lr=0.05), seed=0)
    clients = _trained_mlps(algorithm, net, counts, trainer)
    worker = _fedma(net, counts, retrain=False)
    server_state, replies = _match_all(algorithm, clients, net)
    for phase in algorithm.plan(0)[1:]:
        worker.receive(phase, 0, {MATCHED: {"global": torch.tensor([float(algorithm.widths[worker.phase_layer[
            phase.name]])])}})
    assert worker.widths == algorithm.widths and algorithm.widths[:2] != [6, 5]    # grew: independent clients
    resumed = _fedma(net, counts, retrain=False)
    resumed.load_carried_state(algorithm.carried_state())
    assert resumed.widths == algorithm.widths
    glob = algorithm.global_state(server_state)
    for c in clients:
        a1, a2 = replies["match_fc1"][c.id].long(), replies["match_fc2"][c.id].long()
        own = algorithm._own_size(c, glob)
        torch.testing.assert_close(own["fc1.weight"], glob["fc1.weight"][a1])
        torch.testing.assert_close(own["fc2.weight"], glob["fc2.weight"][a2][:, a1])
        torch.testing.assert_close(own["classifier.weight"], glob["classifier.weight"][:, a2])
        assert own["fc1.weight"].shape == (6, 4) and own["classifier.bias"].shape == (3,)
    assert set(algorithm.server_metrics(server_state)) >= {"match_s/fc1", "match_s/fc2", "match_s/classifier"}
    assert all(0 <= v < 60 for k, v in algorithm.server_metrics(server_state).items() if k.startswith("match_s/"))


def test_independent_lstms_kept_apart_keep_each_ones_hidden_to_hidden_weights_in_their_blocks():
    """A tight sigma keeps distinct units apart, so the global weight_hh holds each client's block at its
    units' positions (4 gates) and zeros where no client holds both units; an entry held by one client
    is that client's value, not a mean with the zeros."""
    from hpcfl.models.fedma import CharLSTM
    counts = np.array([[2] * 12, [1] * 12])
    torch.manual_seed(0)
    template = CharLSTM((6,), 12, embed_dim=3, hidden=5).eval()
    algorithm = _fedma(template, counts, sigma=1e-6, sweeps=1, retrain=False)
    clients = [_client(c, algorithm.init_client_state(client(c), template)["model"],
                       counts) for c in range(2)]
    own_hh = [c.state["model"]["lstm.weight_hh_l0"].double() for c in clients]
    server_state, replies = _match_all(algorithm, clients, template)
    count = algorithm.widths[1]
    assert algorithm.widths[:2] == [6, 10]
    expected = torch.zeros(4 * count, count, dtype=torch.float64)
    for hh, c in zip(own_hh, clients, strict=True):
        units = replies["match_lstm"][c.id].long()
        for gate in range(4):
            expected[(gate * count + units)[:, None], units[None, :]] = hh[gate * 5:(gate + 1) * 5]
    torch.testing.assert_close(server_state["model"]["lstm.weight_hh_l0"].double(), expected)
    for c in clients:                                            # each client installed the global layer
        torch.testing.assert_close(c.state["model"]["lstm.weight_hh_l0"], server_state["model"]["lstm.weight_hh_l0"])
    x = torch.randint(0, 12, (3, 6))
    assert algorithm.global_module(server_state, template)(x).shape == (3, 12)


def test_fedmas_own_parameters_and_the_rules_every_algorithm_keeps_are_checked():
    params = algorithm_params("fedma", {})
    assert (params.retrain, params.retrain_epochs, params.last_lr_scale, params.last_epochs_scale, params.init) == (
        True, 1, 0.1, 3, "independent")
    with pytest.raises(ConfigError, match="retrain_epochs = 0 must be >= 1"):
        algorithm_params("fedma", {"retrain_epochs": 0})
    with pytest.raises(ConfigError, match="gamma must be > 0"):
        algorithm_params("fedma", {"gamma": 0.0})                  # the prior's own check
    base = {"algorithm": {"name": "fedma"}, "data": {"num_clients": 4}, "train": {"clients_per_round": 4}}
    with pytest.raises(ConfigError, match="shares whole models"):
        job_from_dict({**base, "model": {"architectures": ["fmnist_cnn", "fmnist_cnn_wide"]}})
