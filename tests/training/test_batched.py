"""Clients trained together (train.batched_clients) give the sequential path's models and metrics."""
import contextlib
import io

import numpy as np
import pytest
import torch
from helpers import launch, run_metrics
from torch import nn

from hpcfl.algorithms import ALGORITHMS
from hpcfl.algorithms.base import Client
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.launch import main
from hpcfl.models import build_model, load_state
from hpcfl.training import LocalTrainer
from hpcfl.training.batched import BatchedTrainer, Optimizer, check_model

SIZES = (23, 40, 57, 16, 9)         # batch 16: ragged last batches, 2 to 8 steps over two epochs
TRAINING = {"sgd": {"momentum": 0.9, "weight_decay": 1e-3, "lr": 0.05},
            "adam": {"optimizer": "adam", "weight_decay": 1e-3, "lr": 3e-3, "betas": [0.8, 0.99]},
            "crop_flip": {"momentum": 0.5, "augment": "crop_flip", "lr": 0.05}}


def _clients():
    data = load_dataset("digits", resolve_data_root(None))
    ends = np.cumsum((0,) + SIZES)
    return [Client(i, data.train_x[a:b], data.train_y[a:b], np.zeros(10))
            for i, (a, b) in enumerate(zip(ends, ends[1:], strict=False))]     # strict=False: consecutive pairs


@pytest.mark.parametrize("setting", sorted(TRAINING))
def test_clients_trained_together_match_one_by_one(setting):
    cfg = job_from_dict({"train": {"batch_size": 16, "local_epochs": 2, **TRAINING[setting]}}).train
    trainer, clients = LocalTrainer(cfg, seed=3), _clients()
    torch.manual_seed(0)
    model = build_model("fmnist_cnn", (1, 8, 8), 10)
    start = {k: v.detach().double() for k, v in model.state_dict().items()}      # a downlink is float64
    trained = BatchedTrainer(trainer, model, group=3).train(clients, 2, start)     # groups of 3 and 2
    for client in clients:
        load_state(model, start)
        expected = trainer.train(model, client, 2)
        alone = {k: v.clone() for k, v in model.state_dict().items()}
        metrics = trained.train(model, client, 2)
        assert metrics["steps"] == expected["steps"] == 2 * -(-client.num_samples // 16)
        assert metrics["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(value, alone[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("setting", ["sgd", "adam"])
def test_a_masked_client_keeps_its_parameters_and_optimizer_state(setting):
    cfg = job_from_dict({"train": TRAINING[setting]}).train
    optimizer = Optimizer(cfg)
    params = {"w": torch.randn(2, 3)}
    state = {slot: {"w": torch.randn(2, 3).abs()} for slot in optimizer.slots}
    grads = {"w": torch.randn(2, 3)}
    both, both_state = optimizer.step(params, grads, state, 4)
    masked, masked_state = optimizer.step(params, grads, state, 4, active=torch.tensor([True, False]))
    assert torch.equal(masked["w"][0], both["w"][0]) and torch.equal(masked["w"][1], params["w"][1])
    for slot in optimizer.slots:
        assert torch.equal(masked_state[slot]["w"][0], both_state[slot]["w"][0])
        assert torch.equal(masked_state[slot]["w"][1], state[slot]["w"][1])
        assert not torch.equal(both_state[slot]["w"][1], state[slot]["w"][1])


def _run(job, root, *sets):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main([str(job), "--results-root", str(root), *sum((["--set", s] for s in sets), [])])
    assert code == 0
    return run_metrics(next(root.glob("test/*.h5")))


def _assert_close(one, other):
    assert sorted(one) == sorted(other)
    for key in one:
        np.testing.assert_allclose(one[key], other[key], rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=key)


SETTINGS = ("train.lr=0.05", "train.momentum=0.5", "train.weight_decay=0.001", "data.validation_fraction=0.2")


@pytest.mark.parametrize("algorithm", ["fedavgm", "fednova", "fedadam"])     # fedadam: FedAdagrad and FedYogi's too
def test_the_launcher_records_the_same_metrics_batched(tiny_job, tmp_path, algorithm):
    job = tiny_job(algorithm, rounds=2)
    one = _run(job, tmp_path / "one", *SETTINGS)
    together = _run(job, tmp_path / "together", *SETTINGS, "train.batched_clients=3")
    assert np.isfinite(one["client/train_loss"]).sum() == 2 * 4
    _assert_close(one, together)


def test_three_ranks_batched_record_the_one_process_metrics(tiny_job, tmp_path):
    job = tiny_job(rounds=2)
    one = _run(job, tmp_path / "one", *SETTINGS)
    result = launch(job, "--results-root", tmp_path / "three", *sum((["--set", s] for s in SETTINGS), []),
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


def test_only_classes_that_vouch_for_their_local_update_batch():
    assert sorted(n for n, cls in ALGORITHMS.items() if cls.traits.batched) == [
        "fedadagrad", "fedadam", "fedavg", "fedavgm", "fednova", "fedyogi"]


@pytest.mark.parametrize("job", [{"algorithm": {"name": "scaffold"}},
                                 {"algorithm": {"name": "fedprox"}},          # FedAvg plus its own term
                                 {"algorithm": {"name": "fedavg", "terms": ["moon"]}}])
def test_a_job_that_cannot_batch_is_refused_naming_the_key(job):
    with pytest.raises(ConfigError, match="train.batched_clients"):
        job_from_dict({**job, "train": {"batched_clients": 4}})


def test_a_model_with_dropout_or_batchnorm_is_refused_naming_the_key():
    check_model(build_model("fmnist_cnn", (1, 28, 28), 10))
    for model in (build_model("vgg9", (3, 32, 32), 10), nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))):
        with pytest.raises(ConfigError, match="train.batched_clients"):
            check_model(model)
