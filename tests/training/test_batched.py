"""Clients trained together (train.batched_clients) give the sequential path's models, metrics and client
state: every algorithm that batches, over two rounds, with SGD momentum + weight decay and with Adam, on a
BatchNorm model, with loss terms, two views and state carried across rounds."""
import contextlib
import io
import logging

import numpy as np
import pytest
import torch
from helpers import launch
from torch import nn

from hpcfl.algorithms import ALGORITHMS
from hpcfl.algorithms.base import Client, Traits
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.launch import main
from hpcfl.models import build_model, load_state
from hpcfl.terms import Frozen, Term
from hpcfl.testing import run_metrics
from hpcfl.training import LocalTrainer
from hpcfl.training.batched import BatchedTrainer, Unbatchable, check_model, group_size
from hpcfl.training.recording import Recorded, Recording, Trained
from hpcfl.training.recording import key as call_key

SIZES = (23, 40, 57, 16, 9)         # batch 16: ragged last batches, 2 to 8 steps over two epochs
TRAINING = {"sgd": {"momentum": 0.9, "weight_decay": 1e-3, "lr": 0.05},
            "adam": {"optimizer": "adam", "weight_decay": 1e-3, "lr": 3e-3, "betas": [0.8, 0.99]},
            "crop_flip": {"momentum": 0.5, "augment": "crop_flip", "lr": 0.05}}


def _clients():
    data = load_dataset("digits", resolve_data_root(None))
    ends = np.cumsum((0,) + SIZES)
    return [Client(i, data.train_x[a:b], data.train_y[a:b], np.zeros(10))
            for i, (a, b) in enumerate(zip(ends, ends[1:], strict=False))]     # strict=False: consecutive pairs


class Ragged(Term):
    """A term whose per-client context differs in shape between clients: its group cannot be stacked.
    Its loss pulls the features' mean towards the mean of its context."""
    name, batchable = "ragged", True

    def start(self, model, client, round, received):
        self.target = torch.full((client.num_samples % 3 + 1,), 0.1 * client.id)

    def loss(self, model, x, y, features, logits):
        return ((features.mean() - self.target.mean()) ** 2).sum()


class Pull(Term):
    """A term with a per-client context that stacks: pulls the features' mean towards its target's."""
    name, batchable = "pull", True

    def start(self, model, client, round, received):
        self.target = torch.full((2,), 0.1 * client.id)

    def loss(self, model, x, y, features, logits):
        return ((features.mean() - self.target.mean()) ** 2).sum()


class RaggedRecall(Ragged):
    """Ragged (its group trains one by one), plus a frozen model of each client's own that its loss reads
    and a count of its loss calls that training leaves in it (as FedCME's sums)."""
    name = "ragged_recall"

    def __init__(self, params):
        super().__init__(params)
        self.previous = Frozen()

    def start(self, model, client, round, received):
        super().start(model, client, round, received)
        self.previous.load(model, {k: v + 0.01 * client.id for k, v in received["model"].items()})
        self.calls = torch.zeros(())

    def loss(self, model, x, y, features, logits):
        self.calls = self.calls + 1
        return super().loss(model, x, y, features, logits) + (self.previous.net(x) - logits).pow(2).mean()


class Toward(Term):
    """Pulls the features' mean towards the mean of `received["toward"]`, a tensor clients share as FedFM's
    anchors are shared; `fail` makes its loss raise."""
    name, batchable, fail = "toward", True, False

    def start(self, model, client, round, received):
        self.toward = received["toward"]

    def loss(self, model, x, y, features, logits):
        if self.fail:
            raise RuntimeError("the term broke")
        return ((features.mean() - self.toward.mean()) ** 2).sum()


class Unvouched(Term):
    """A plug-in term that does not declare batchable."""
    name = "unvouched"


class OwnUnvouched(ALGORITHMS["fedprox"]):
    """A plug-in algorithm that batches, with an own term that does not declare it."""
    name, term, Params = "own_unvouched", Unvouched, ALGORITHMS["fedavg"].Params
    traits = Traits(batched=True)


def _trainer(setting="sgd", **train):
    """The local trainer (seed 3, batches of 16) of a TRAINING setting, with `train` keys on top."""
    return LocalTrainer(job_from_dict({"train": {"batch_size": 16, **TRAINING[setting], **train}}).train, seed=3)


def _start(model_name="fmnist_cnn"):
    """A model built from seed 0, and its state: where every client starts."""
    torch.manual_seed(0)
    model = build_model(model_name, (1, 8, 8), 10)
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _record(trainer, model, clients, start, terms=(), received=lambda client: {}):
    """What a worker's first pass records: each client's train call from `start` (its terms also
    receive `received(client)`)."""
    recording = Recording(trainer, {})
    for client in clients:
        load_state(model, start)
        for term in terms:
            term.start(model, client, 2, {"model": start, **received(client)})
        with pytest.raises(Recorded):
            recording.train(model, client, 2, terms)
    return recording.requests


# not Adam on BatchNorm: a convolution's bias before BatchNorm has a zero gradient, rounding noise, which Adam
# scales up to full steps in whichever direction the noise points
@pytest.mark.parametrize("setting, model_name", [*((s, "fmnist_cnn") for s in sorted(TRAINING)),
                                                 ("sgd", "fmnist_cnn_bn"), ("crop_flip", "fmnist_cnn_bn")])
def test_clients_trained_together_match_one_by_one(setting, model_name):
    trainer, clients = _trainer(setting, local_epochs=2), _clients()
    model, start = _start(model_name)
    results = BatchedTrainer(trainer, [model], group=3).train(_record(trainer, model, clients, start))
    trained = Trained(trainer, results)
    for client in clients:                                                          # groups of 3 and 2
        load_state(model, start)
        expected = trainer.train(model, client, 2)
        alone = {k: v.clone() for k, v in model.state_dict().items()}
        model.eval()                                    # as an evaluation may leave it
        metrics = trained.train(model, client, 2)
        assert model.training                           # as training leaves it
        assert metrics["steps"] == expected["steps"] == 2 * -(-client.num_samples // 16)
        assert metrics["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
        assert not torch.equal(alone["classifier.weight"], start["classifier.weight"])
        for name, value in model.state_dict().items():                  # BatchNorm statistics included
            torch.testing.assert_close(value, alone[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("setting", ["sgd", "adam"])
def test_a_parameter_outside_the_loss_keeps_its_value_as_one_by_one(setting):
    """A plug-in model's spare layer gets no gradient: kept, with its momentum or Adam moments, as
    torch.optim keeps it, while the rest trains as it would alone."""
    trainer, clients = _trainer(setting), _clients()[:2]
    model, _ = _start()
    model.spare = nn.Linear(3, 3)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trained = Trained(trainer, BatchedTrainer(trainer, [model], group=2).train(_record(trainer, model, clients, start)))
    for client in clients:
        load_state(model, start)
        trainer.train(model, client, 2)
        alone = {k: v.clone() for k, v in model.state_dict().items()}
        trained.train(model, client, 2)
        assert torch.equal(model.spare.weight, start["spare.weight"])
        for name, value in model.state_dict().items():
            torch.testing.assert_close(value, alone[name], rtol=1e-4, atol=1e-6, msg=name)


def _sequential(trainer, model, client, start, terms, received=lambda client: {}):
    """What `train` gives a client alone from `start`: its metrics, and its terms' attributes after."""
    load_state(model, start)
    for term in terms:
        term.start(model, client, 2, {"model": start, **received(client)})
    return trainer.train(model, client, 2, terms), [dict(vars(term)) for term in terms]


def test_groups_whose_contexts_do_not_stack_train_one_by_one_and_say_so_once(caplog):
    """Two groups of two, each with contexts of different shapes: every client trains alone from its own
    records (its frozen model's state too), each has its result, what its loss left in the term comes back,
    and the log says so once."""
    trainer, clients, term = _trainer(), _clients()[:4], RaggedRecall(None)
    model, start = _start()
    with caplog.at_level(logging.INFO, logger="hpcfl.training.batched"):
        results = BatchedTrainer(trainer, [model], group=2).train(_record(trainer, model, clients, start, [term]))
    assert set(results) == {call_key(c, 2, None, 3) for c in clients}
    assert caplog.text.count("train one at a time") == 1
    assert "clients [0, 1] train one at a time: 'RaggedRecall.target' has shapes" in caplog.text
    trained = Trained(trainer, results)
    for client in clients:
        expected, after = _sequential(trainer, model, client, start, [term])
        alone = {k: v.clone() for k, v in model.state_dict().items()}
        load_state(model, start)
        term.start(model, client, 2, {"model": start})
        assert trained.train(model, client, 2, [term]) == expected
        assert all(torch.equal(v, alone[k]) for k, v in model.state_dict().items())
        assert float(term.calls) == float(after[0]["calls"]) == expected["steps"]


class Averaging(Pull):
    """Replaces its per-client attribute in `loss` (a running mean) instead of changing it in place."""
    name = "averaging"

    def loss(self, model, x, y, features, logits):
        self.target = 0.5 * self.target + 0.5 * features.mean().detach()
        return super().loss(model, x, y, features, logits)


def test_a_term_replacing_its_attribute_in_loss_is_refused_when_trained_together():
    """The group writes back the tensor it bound to the attribute: a replaced one would be lost."""
    trainer, clients, term = _trainer(), _clients()[:3], Averaging(None)
    model, start = _start()
    with pytest.raises(ConfigError, match=r"loss term Averaging replaced its attribute\(s\) \['target'\] in `loss`; "
                                          r"trained together, .* set train.batched_clients = 0"):
        BatchedTrainer(trainer, [model], group=3).train(_record(trainer, model, clients, start, [term]))


def test_a_term_that_does_not_vouch_for_batching_trains_its_clients_one_by_one(caplog):
    """An algorithm's own extra term reaches the group without the job's check: it trains alone."""
    trainer, clients, terms = _trainer(), _clients()[:2], [Pull(None), Unvouched(None)]
    model, start = _start()
    with caplog.at_level(logging.INFO, logger="hpcfl.training.batched"):
        results = BatchedTrainer(trainer, [model], group=2).train(_record(trainer, model, clients, start, terms))
    assert "clients [0, 1] train one at a time: terms ['Unvouched'] are not batchable" in caplog.text
    trained = Trained(trainer, results)
    for client in clients:
        expected, _ = _sequential(trainer, model, client, start, terms)
        load_state(model, start)
        assert trained.train(model, client, 2, terms) == expected


def test_a_trainer_with_another_seed_or_settings_is_a_copy_and_the_same_is_itself():
    from hpcfl.training.recording import as_trainer

    trainer = _trainer()
    assert as_trainer(trainer, trainer.seed, trainer.cfg) is trainer
    other_cfg = _trainer(lr=0.5).cfg
    other = as_trainer(trainer, 11, other_cfg)
    assert (other.seed, other.cfg) == (11, other_cfg) and (trainer.seed, trainer.cfg.lr) == (3, 0.05)


def test_an_update_calling_train_twice_alike_is_refused_rather_than_given_the_first_model():
    """Calls are named by (client, round, epochs, seed): a second alike would replay the first's result."""
    trainer, client = _trainer(), _clients()[0]
    model, start = _start()
    results = BatchedTrainer(trainer, [model], group=1).train(_record(trainer, model, [client], start))
    trained = Trained(trainer, results)
    trained.train(model, client, 2)
    with pytest.raises(RuntimeError, match=r"client 0's update called train twice alike \(round 2, epochs None, "
                                           r"seed 3\).*own epochs or seed"):
        trained.train(model, client, 2)
    trained.train(model, _clients()[1], 2)                 # another client's call is its own


def test_a_value_the_group_shares_is_set_once_and_values_that_differ_stack_or_are_refused():
    from hpcfl.training.batched import _PerClient, _stack

    anchors = torch.randn(10, 4)
    assert _stack("T.anchors", [anchors, anchors]) is anchors             # received, shared: not copied per client
    own = _stack("T.target", [torch.zeros(2), torch.ones(2)])
    assert isinstance(own, _PerClient) and torch.equal(own.value, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert _stack("T.mu", [0.5, 0.5]) == 0.5
    with pytest.raises(Unbatchable, match="'T.mu' differs between clients and is not a tensor"):
        _stack("T.mu", [0.5, 0.25])
    for differing in ([[torch.ones(2)], [torch.zeros(2)]], [np.ones(2), np.zeros(2)]):    # no plain == to ask
        with pytest.raises(Unbatchable, match="'T.x' differs between clients and is not a tensor"):
            _stack("T.x", differing)
    assert _stack("T.x", [[1, 2], [1, 2]]) == [1, 2]


def test_each_group_trains_with_what_its_own_clients_share_and_the_terms_are_left_plain():
    """Clients 0 and 1 receive one tensor, 2 and 3 another: in groups of two, each group trains with its
    own (as each client alone would); afterwards a term's per-client context is a plain value again (the
    last group's first client's), not vmap's stand-in."""
    trainer, clients, terms = _trainer(), _clients()[:4], [Toward(None), Pull(None)]
    model, start = _start()
    shared = {0: torch.full((3,), 1.0), 1: torch.full((3,), -2.0)}
    received = lambda client: {"toward": shared[client.id // 2]}                  # noqa: E731
    requests = _record(trainer, model, clients, start, terms, received)
    results = BatchedTrainer(trainer, [model], group=2).train(requests)
    assert terms[1].target is requests[2].contexts[1]["target"]
    trained = Trained(trainer, results)
    for client in clients:
        expected, _ = _sequential(trainer, model, client, start, terms, received)
        alone = {k: v.clone() for k, v in model.state_dict().items()}
        metrics = trained.train(model, client, 2, terms)
        assert metrics["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(value, alone[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_error_in_a_group_names_its_clients_and_round():
    trainer, clients, term = _trainer(), _clients()[:3], Toward(None)
    model, start = _start()
    requests = _record(trainer, model, clients, start, [term], lambda client: {"toward": torch.zeros(3)})
    term.fail = True
    with pytest.raises(RuntimeError, match="the term broke") as raised:
        BatchedTrainer(trainer, [model], group=3).train(requests)
    assert raised.value.__notes__ == ["hpcfl: in clients [0, 1, 2] trained together, round 3"]


def _run(job, root, *sets):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main([str(job), "--results-root", str(root), *sum((["--set", s] for s in sets), [])])
    assert code == 0
    return run_metrics(next(root.glob("test/*.h5")))


def _assert_close(one, other):
    assert sorted(one) == sorted(other)
    for key in one:
        np.testing.assert_allclose(one[key], other[key], rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=key)


SGD = ("train.lr=0.05", "train.momentum=0.9", "train.weight_decay=0.001", "data.validation_fraction=0.2")
ADAM = ("train.optimizer='adam'", "train.lr=0.003", "train.weight_decay=0.001", "data.validation_fraction=0.2")
HETEROGENEOUS = ("model.architectures=['fmnist_cnn_narrow','fmnist_cnn','fmnist_cnn_wide']",)
EVERY_CLIENT = ("train.clients_per_round=6",)
# BatchNorm makes the layers before it scale-invariant, which amplifies rounding from round to round: a gentler lr
BATCHNORM = ("model.name='fmnist_cnn_bn'", "train.lr=0.01")
# every algorithm that batches, with SGD momentum + weight decay, and with Adam where it allows it; BatchNorm,
# its terms' state and per-client state carried from round 1 to round 2
CASES = {
    "fedavg": SGD + BATCHNORM,
    "fedavg-independent": SGD + ("algorithm.params.init='independent'",),
    "fedavgm": ADAM, "fedadam": SGD, "fedyogi": ADAM, "fedadagrad": SGD, "fednova": SGD,
    "scaffold": SGD + BATCHNORM, "feddyn": ADAM,
    "fedprox": SGD + BATCHNORM, "moon": SGD, "fedrs": ADAM + ("algorithm.params.bias='keep'",),
    "fedntd": SGD, "fedka": SGD + ("algorithm.params.weight=1.0",),
    "fedfm": SGD + ("algorithm.params.start_round=1", "algorithm.params.weight=1.0"),
    "fedfm_lite": ADAM + ("algorithm.params.start_round=1", "algorithm.params.weight=1.0"),
    "fednova-fm_l2": SGD + ("algorithm.terms.fm_l2.start_round=1", "algorithm.terms.fm_l2.weight=1.0"),
    "fedcme": SGD + ("train.local_epochs=2",), "fedproto": ADAM + HETEROGENEOUS,
    "fedclassavg": ADAM + HETEROGENEOUS + ("model.params={preactivation=true}",),
    # its warm-up, then its round: two train calls (not Adam: where a gradient is near zero Adam makes rounding
    # a full step, and the warm-up's carries into the round)
    "fedclassavg-warmup": SGD + HETEROGENEOUS + ("model.params={preactivation=true}",
                                                 "algorithm.params.warmup_epochs=1"),
    "local_only": SGD + ("algorithm.terms.supcon.weight=0.5",), "ensemble": ADAM + EVERY_CLIENT,
    # a term's frozen model for clients of three architectures
    "local_only-moon": SGD + HETEROGENEOUS + ("algorithm.terms.moon.mu=1.0",),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_launcher_records_the_same_metrics_batched(tiny_job, tmp_path, case, monkeypatch):
    job = tiny_job(case.split("-")[0], rounds=2)
    one = _run(job, tmp_path / "one", *CASES[case])
    together_trained = []                         # (round, client) of every client a group trained
    group = BatchedTrainer._train_group

    def spy(self, requests):
        results = group(self, requests)
        together_trained.extend((r.round, r.client.id) for r in requests)
        return results

    monkeypatch.setattr(BatchedTrainer, "_train_group", spy)
    together = _run(job, tmp_path / "together", *CASES[case], "train.batched_clients=3")
    trained = np.isfinite(one["client/train_loss"])
    assert trained.sum() >= 2 * 4 and (one["client/steps"][trained] > 0).all()
    assert set(together_trained) >= set(zip(*np.nonzero(trained), strict=True))     # every update trained together
    _assert_close(one, together)


def test_every_algorithm_batches_or_its_docs_say_why():
    batched = {n for n, cls in ALGORITHMS.items() if cls.traits.batched}
    assert batched >= {c.split("-")[0] for c in CASES}
    assert sorted(set(ALGORITHMS) - batched) == ["fedma"]      # its clients' models differ in shape


def test_three_ranks_batched_record_the_one_process_metrics(tiny_job, tmp_path):
    job = tiny_job(rounds=2)
    one = _run(job, tmp_path / "one", *SGD)
    result = launch(job, "--results-root", tmp_path / "three", *sum((["--set", s] for s in SGD), []),
                    "--set", "train.batched_clients=10", ranks=3, timeout=120)
    assert result.returncode == 0, result.stderr
    _assert_close(one, run_metrics(next((tmp_path / "three").glob("test/*.h5"))))


def test_a_nonfinite_client_is_caught_alike_and_spares_its_group(tiny_job, tmp_path):
    job = tiny_job(rounds=2)
    sets = ("train.lr=5", "train.on_nonfinite='drop'")         # client 4 blows up in round 1, its group does not
    one = _run(job, tmp_path / "one", *sets)
    together = _run(job, tmp_path / "together", *sets, "train.batched_clients=4")
    assert one["client/nonfinite"][0, 4] == 1 and np.isfinite(one["client/train_loss"][0]).sum() == 3
    _assert_close(one, together)


@pytest.mark.parametrize("job", [{"algorithm": {"name": "fedma"}, "train": {"clients_per_round": 20}},
                                 {"algorithm": {"name": "fedavg", "terms": [f"{__name__}:Unvouched"]}},
                                 {"algorithm": {"name": f"{__name__}:OwnUnvouched"}},
                                 {"train": {"precision": "bf16"}}])
def test_a_job_that_cannot_batch_is_refused_naming_the_key(job):
    with pytest.raises(ConfigError, match="train.batched_clients") as refusal:
        job_from_dict({**job, "train": {**job.get("train", {}), "batched_clients": 4}})
    if "Unvouched" in str(job):
        assert "do not declare that they run under vmap" in str(refusal.value)


def test_a_plug_in_algorithm_with_a_plug_in_term_of_its_own_is_taken_one_client_at_a_time():
    job = job_from_dict({"algorithm": {"name": f"{__name__}:OwnUnvouched"}, "train": {"batched_clients": 0}})
    assert job.algorithm.name.endswith(":OwnUnvouched")


def test_a_model_with_dropout_is_refused_naming_the_key():
    check_model(build_model("fmnist_cnn_bn", (1, 28, 28), 10))                     # BatchNorm batches
    for model in (build_model("vgg9", (3, 32, 32), 10), nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))):
        with pytest.raises(ConfigError, match="train.batched_clients"):
            check_model(model)
        with pytest.raises(ConfigError, match="train.batched_clients"):        # a number set in the job file
            BatchedTrainer(None, [model], group=2)


def test_auto_trains_a_workers_whole_share_together_on_a_gpu_where_the_job_allows_it(caplog):
    models = [build_model("fmnist_cnn", (1, 8, 8), 10)]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")       # only the device's type is read
    job = job_from_dict({"train": {"clients_per_round": 7}})
    assert job.train.batched_clients == "auto"                   # the default
    assert group_size(job, ALGORITHMS["fedavg"], models, cuda) == 7
    assert group_size(job, ALGORITHMS["fedavg"], models, cpu) == 0
    assert group_size(job_from_dict({"train": {"clients_per_round": 20}}), ALGORITHMS["fedavg"], models, cuda) == 16
    with caplog.at_level(logging.INFO, logger="hpcfl.training.batched"):
        assert group_size(job, ALGORITHMS["fedavg"], [build_model("vgg9", (3, 32, 32), 10)], cuda) == 0
        fedma = job_from_dict({"algorithm": {"name": "fedma"}, "train": {"clients_per_round": 20}})
        assert group_size(fedma, ALGORITHMS["fedma"], models, cuda) == 0
        assert group_size(job_from_dict({"train": {"precision": "bf16"}}), ALGORITHMS["fedavg"], models, cuda) == 0
    assert "one after another" in caplog.text and "Dropout" in caplog.text and "'fedma'" in caplog.text
    assert "train.precision = 'bf16'" in caplog.text
    assert group_size(job_from_dict({"train": {"batched_clients": 3}}), ALGORITHMS["fedavg"], models, cpu) == 3


@pytest.mark.parametrize("value", ["fast", -1, True, 1.5])
def test_a_bad_batched_clients_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="train.batched_clients"):
        job_from_dict({"train": {"batched_clients": value}})


@pytest.mark.parametrize("setting", ["adam", "sgd"])
def test_a_groups_tensors_keep_their_storage_from_step_to_step(setting, monkeypatch):
    """What a CUDA graph's replay relies on (train.cuda_graphs): every step, whole group or some of its
    clients, writes the parameters, BatchNorm buffers, optimizer slots, terms' contexts and summed losses
    in place, and reads the step number from the device; captured once, a step's addresses stay valid."""
    from hpcfl.training import batched

    trainer, clients = _trainer(setting, local_epochs=2), _clients()[:3]
    model, start = _start("fmnist_cnn_bn")
    seen, update = [], batched._Group.update

    def addresses(group):
        tensors = [group.totals, *group.params.values(), *group.buffers.values(),
                   *(t for slot in group.slots.values() for t in slot.values()),
                   *(v for ctx in group.own for v in ctx.values() if isinstance(v, torch.Tensor))]
        return [t.data_ptr() for t in tensors]

    def spy(self, members, rows):
        before = addresses(self)
        update(self, members, rows)
        assert addresses(self) == before
        seen.append((len(members), float(self.count)))

    monkeypatch.setattr(batched._Group, "update", spy)
    term = Pull(None)
    BatchedTrainer(trainer, [model], group=3).train(_record(trainer, model, clients, start, [term]))
    assert {m for m, _ in seen} == {3, 2, 1}                # the whole group, then fewer as clients run out
    assert [c for _, c in seen] == sorted(c for _, c in seen) and seen[-1][1] == 2 * -(-SIZES[2] // 16)


def test_steps_without_augmentation_go_through_step_graphs_which_stay_off_on_a_cpu(monkeypatch):
    """train.cuda_graphs = true trains eagerly on a CPU, as without it. With step graphs (stood in for by
    one that runs the step), each step of clients without augmentation goes through them, as one kind per
    (clients, batch length): sizes 23, 40, 57 in batches of 16 give 16 | 7, 16 | 8, 16 | 16, 9."""
    from hpcfl.training import batched

    clients, calls = _clients()[:3], []

    def states(setting, **more):
        trainer = _trainer(setting, batched_clients=3, **more)
        model, start = _start()
        results = BatchedTrainer(trainer, [model], group=3).train(_record(trainer, model, clients, start))
        return [results[call_key(c, 2, None, 3)][0] for c in clients]

    eager = states("sgd")
    for one, other in zip(eager, states("sgd", cuda_graphs=True), strict=True):
        assert all(torch.equal(one[k], other[k]) for k in one)

    class Through:
        def run(self, kind, rows, step):
            calls.append(kind)
            step(rows)

    init = batched._Group.__init__

    def with_graphs(self, requests, trainer):
        init(self, requests, trainer)
        self.graphs = Through()

    monkeypatch.setattr(batched._Group, "__init__", with_graphs)
    for one, other in zip(eager, states("sgd"), strict=True):
        assert all(torch.equal(one[k], other[k]) for k in one)
    assert calls == [((0, 1, 2), 16), ((0,), 7), ((1, 2), 16), ((1,), 8), ((2,), 16), ((2,), 9)]
    calls.clear()
    states("crop_flip")
    assert calls == []


def test_cuda_graphs_warm_up_twice_capture_on_the_third_call_and_replay_with_the_rows_copied_in(monkeypatch):
    """StepGraphs' protocol, with torch.cuda's graph API stood in for (CPU): a kind of step runs eagerly twice,
    is captured on its third call (on a copy of its rows, which later calls overwrite) and replayed from
    then on; kinds are captured apart, all in one memory pool. The capture itself needs a GPU."""
    from hpcfl.training.graphs import StepGraphs

    events = []

    class Graph:
        def replay(self):
            events.append(("replay", self))

        def pool(self):
            return "pool"

    @contextlib.contextmanager
    def graph(g, pool=None):
        events.append(("capture", g, pool))
        yield

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            events.append(("wait", self.name, other.name))

    @contextlib.contextmanager
    def on(stream):
        events.append(("on", stream.name))
        yield
        events.append(("off", stream.name))

    current = Stream("current")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "stream", on)
    graphs, updated = StepGraphs(), []

    def update(r, kind, rows):
        updated.append((kind, r.clone(), r is rows))
        events.append(("update", kind))

    for call in range(5):
        for kind in ("all", "some"):
            rows = torch.full((2, 3), 10 * call + (kind == "some"))
            graphs.run(kind, rows, lambda r, kind=kind, rows=rows: update(r, kind, rows))
    # a warm-up step runs on the side stream once the current one's work is done, and the current waits for it
    assert events[:5] == [("wait", "side", "current"), ("on", "side"), ("update", "all"), ("off", "side"),
                          ("wait", "current", "side")]
    assert [(k, int(r[0, 0]), same) for k, r, same in updated] == [
        ("all", 0, True), ("some", 1, True), ("all", 10, True), ("some", 11, True),
        ("all", 20, False), ("some", 21, False)]                     # the third: on the captured copy
    captures = [e for e in events if e[0] == "capture"]
    assert [pool for _, _, pool in captures] == [None, "pool"]       # the second kind shares the first's pool
    assert [e[0] for e in events].count("replay") == 2 + 2 * 2        # right after capture, then every call
    for kind, (_, static) in graphs.captured.items():
        assert int(static[0, 0]) == 40 + (kind == "some")            # the last call's rows, copied in
