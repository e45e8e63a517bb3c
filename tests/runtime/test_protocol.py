"""The experiment protocol: a split fixed by data.seed apart from run.seed, and the global model's
validation accuracy recorded every evaluation round (checked against the model itself), so the
analysis can select on validation and pair runs of the same split."""
import numpy as np
import pytest
import torch

from hpcfl.config import apply_overrides
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import count_matrix, partition
from hpcfl.data.splits import training_subset, validation_split
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict, resolve
from hpcfl.metrics import read_run
from hpcfl.models.evaluation import evaluate
from hpcfl.runtime.build import SetupFailed, setup
from hpcfl.runtime.loop import run
from hpcfl.transport import LocalTransport


def _run(tmp_path, name, *overrides, keep_job=False):
    raw = {"run": {"study": "p", "name": name, "rounds": 3, "results_root": str(tmp_path)},
           "data": {"dataset": "digits", "num_clients": 5, "partition": "dirichlet", "partition_params": {"beta": 0.5},
                    "validation_fraction": 0.2},
           "train": {"clients_per_round": 3, "batch_size": 16, "lr": 0.05, "momentum": 0.9},
           "eval": {"every": 2}}
    config = job_from_dict(apply_overrides(raw, list(overrides)))
    transport = LocalTransport({})
    job = setup(resolve(config), transport, None)
    run(job)
    job.recorder.close()
    transport.close()
    return (read_run(config.result_path), job) if keep_job else read_run(config.result_path)


def test_data_seed_fixes_the_split_while_run_seed_varies_the_rest(tmp_path):
    fixed = [_run(tmp_path, f"fixed{s}", f"run.seed={s}", "data.seed=11") for s in (1, 2)]
    own = [_run(tmp_path, f"own{s}", f"run.seed={s}") for s in (1, 2)]
    np.testing.assert_array_equal(fixed[0].arrays["partition"], fixed[1].arrays["partition"])
    assert not np.array_equal(own[0].arrays["partition"], own[1].arrays["partition"])
    assert not np.allclose(fixed[0].arrays["round/train_loss"], fixed[1].arrays["round/train_loss"])  # init, batches
    # data.seed = -1 (the default) splits with run.seed: the same split as data.seed = run.seed
    same = _run(tmp_path, "explicit", "run.seed=2", "data.seed=2")
    np.testing.assert_array_equal(same.arrays["partition"], own[1].arrays["partition"])
    np.testing.assert_allclose(same.arrays["round/val_acc"], own[1].arrays["round/val_acc"])


def test_validation_accuracy_is_the_global_models_on_every_clients_held_out_samples(tmp_path):
    result, job = _run(tmp_path, "val", "run.seed=4", keep_job=True)
    val = result.arrays["round/val_acc"]
    assert np.isnan(val[0]) and np.isfinite(val[1:]).all()           # evaluated after rounds 2 and 3 (every 2, last)
    data = load_dataset("digits", resolve_data_root(None))
    labels = data.train_y.numpy()
    held_out = np.concatenate(validation_split(partition(labels, 5, "dirichlet", {"beta": 0.5}, 4), 0.2, 4)[1])
    assert len(held_out) == pytest.approx(0.2 * len(labels), rel=0.05)
    model = job.algorithm.global_module(job.server.state, job.server.model)
    x, y = data.train_x[torch.from_numpy(held_out)], data.train_y[torch.from_numpy(held_out)]
    assert val[-1] == pytest.approx(evaluate(model, x, y, 10, 1000)["acc"])
    assert result.arrays["round/val_loss"][-1] == pytest.approx(evaluate(model, x, y, 10, 1000)["loss"], rel=1e-5)
    assert val[-1] != pytest.approx(result.arrays["round/test_acc"][-1])      # a different set than the test set


@pytest.mark.parametrize("algorithm", ["local_only", "ensemble"])
def test_algorithms_without_a_global_model_validate_each_client_on_its_own_model(algorithm, tmp_path):
    result = _run(tmp_path, algorithm, f"algorithm.name='{algorithm}'", "train.clients_per_round=5")
    own, rounds = result.arrays["client/val_acc"], result.arrays["round/val_acc"]
    assert np.isnan(rounds[0])
    np.testing.assert_allclose(rounds[1:], np.nanmean(own[1:], axis=1))
    assert ("round/test_acc" in result.arrays) == (algorithm == "ensemble")     # the ensemble votes on the test set


def test_a_negative_data_seed_other_than_minus_one_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="data.seed = -2"):
        job_from_dict({"data": {"seed": -2}})


def test_train_samples_partitions_a_class_stratified_subset_fixed_by_data_seed(tmp_path):
    runs = [_run(tmp_path, f"sub{s}", f"run.seed={s}", "data.seed=3", "data.train_samples=600") for s in (1, 2)]
    counts = runs[0].arrays["partition"]                             # clients x classes, training part only
    np.testing.assert_array_equal(counts, runs[1].arrays["partition"])
    labels = load_dataset("digits", resolve_data_root(None)).train_y.numpy()
    pool = training_subset(labels, 600, 3)
    parts = validation_split([pool[p] for p in partition(labels[pool], 5, "dirichlet", {"beta": 0.5}, 3)], 0.2, 3)[0]
    np.testing.assert_array_equal(counts, count_matrix(labels, parts, 10))
    assert counts.sum() == 480                                        # 600, less 20 % validation
    with pytest.raises(SetupFailed, match="ConfigError: data.train_samples"):       # on every rank, before training
        _run(tmp_path, "too_many", f"data.train_samples={len(labels) + 1}")


def test_set_up_takes_each_clients_rows_from_the_pixels(tmp_path, monkeypatch):
    """The runner never makes the float32 copy of a whole image set (most of a new run's set-up): CPU
    clients hold their uint8 pixels and normalise what they take, validation rows are normalised from
    the pixels, all to the floats of the whole set."""
    import hpcfl.data.splits as splits

    loaded = []
    monkeypatch.setattr(splits, "load_dataset", lambda *a, **k: loaded.append(load_dataset(*a, **k)) or loaded[-1])
    config = job_from_dict({"run": {"study": "p", "name": "px", "rounds": 1, "results_root": str(tmp_path)},
                            "data": {"dataset": "fashion_mnist", "num_clients": 4, "train_samples": 400,
                                     "validation_fraction": 0.25},
                            "train": {"clients_per_round": 2}})
    job = setup(resolve(config), LocalTransport({}), None)
    job.recorder.close()
    data, = loaded
    assert "train_x" not in vars(data)
    pool = training_subset(data.train_y.numpy(), 400, config.data_seed)
    whole_x, whole_y = load_dataset("fashion_mnist", resolve_data_root(None)).train_x[pool], data.train_y[pool]
    clients = job.worker.clients.values()
    assert all(c.x.dtype == torch.uint8 and c.normalization is not None for c in clients)   # a quarter the memory
    sets = [(c.inputs(), c.y) for c in clients] + [c.eval_sets["val"] for c in clients]
    sets += [job.server.sets["validation"]]
    assert sum(len(y) for x, y in sets[:-1]) == 400 and len(sets[-1][1]) == 100
    for x, y in sets:                           # every row is a row of the whole set, with its label
        match = (x.flatten(1)[:, None] == whole_x.flatten(1)[None]).all(2)
        assert (match.sum(1) >= 1).all() and torch.equal(whole_y[match.float().argmax(1)], y)


@pytest.mark.parametrize("hosts, named", [(("n1", "n1", "n1"), "ranks 0, 2 on n1: ConfigError: no such file"),
                                          (("n1", "n2", "n3"), "ranks 0 (n1), 2 (n3): ConfigError: no such file")])
def test_a_set_up_failure_names_every_rank_that_gave_it_in_one_line(hosts, named, monkeypatch):
    """A job file no rank can read: one line for the error, not one per rank (sixteen for -np 16)."""
    import socket
    from types import SimpleNamespace

    from hpcfl.runtime.build import refuse

    monkeypatch.setattr(socket, "gethostname", lambda: hosts[0])
    others = [{"rank": 1, "host": hosts[1], "error": "DataError: other"}, {"rank": 2, "host": hosts[2], "error": None}]
    transport = SimpleNamespace(rank=0, size=3, share=lambda info: [info, *others])
    others[1]["error"] = "ConfigError: no such file"
    with pytest.raises(SetupFailed) as failed:
        refuse(transport, ConfigError("no such file"))
    assert str(failed.value).splitlines() == [named, f"rank 1 on {hosts[1]}: DataError: other"]
