"""The algorithm contract's own defaults (hpcfl.algorithms.base), as a plug-in author meets them: hooks
left out fail loudly, the global model is loaded from the server state, Setup describes the model, and
the default traits are those of an algorithm with one global model of one architecture."""
import numpy as np
import pytest
import torch
from torch import nn

from hpcfl.algorithms import ALGORITHMS
from hpcfl.algorithms.base import Algorithm, Client, Setup, Traits, owned
from hpcfl.errors import HpcflError
from hpcfl.jobs import job_from_dict
from hpcfl.runtime.server import Server


class Bare(Algorithm):
    name = "bare"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5))
        self.classifier = nn.Linear(5, 2)


def _setup(**kwargs) -> Setup:
    job = job_from_dict({"run": {"study": "c", "name": "c"}, "data": {"dataset": "digits"}})
    return Setup.of(job, Net(), np.array([[3, 1], [0, 4]]), **kwargs)


def test_hooks_a_plug_in_leaves_out_fail_loudly():
    algorithm = Bare(Bare.Params(), _setup())
    with pytest.raises(NotImplementedError):
        algorithm.plan(0)
    with pytest.raises(NotImplementedError):
        algorithm.downlink(None, 0, {})
    with pytest.raises(NotImplementedError):
        algorithm.aggregate(None, 0, {}, {})
    with pytest.raises(NotImplementedError):
        algorithm.client_update(None, 0, Client(0, torch.zeros(1, 3), torch.zeros(1), np.ones(2)), {}, Net(), None)


def test_the_global_module_is_the_model_loaded_with_the_server_state():
    algorithm, server, model = Bare(Bare.Params(), _setup()), Net(), Net()
    state = algorithm.init_server_state(server)
    assert algorithm.global_module(state, model) is model
    for name, value in server.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


class Flat(Bare):
    """A plug-in written for the flat names of earlier releases."""

    def init_server_state(self, model):
        return {f"model.{k}": v for k, v in model.state_dict().items()}


def test_a_state_of_flat_tensors_is_refused_naming_the_hook_and_the_layout():
    with pytest.raises(HpcflError, match=r"bare.init_server_state returned \['model.body.0.weight', .*by owner"):
        Server(Flat(Flat.Params(), _setup()), Net(), torch.zeros(1, 3), torch.zeros(1), 8, "cpu")
    server = Server(Bare(Bare.Params(), _setup()), Net(), torch.zeros(1, 3), torch.zeros(1), 8, "cpu")
    assert set(server.state) == {"model"} and set(server.state["model"]) == set(Net().state_dict())
    with pytest.raises(HpcflError, match=r"init_client_state returned \['control.w'\]"):
        owned({"control.w": torch.zeros(1), "bn": {}}, "scaffold.init_client_state")


def test_setup_describes_the_model():
    setup = _setup()
    assert (setup.num_clients, setup.num_classes, setup.test_size, setup.feature_dim) == (2, 2, 0, 5)
    assert _setup(test_size=7).test_size == 7
    assert setup.parameter_names == ("body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias",
                                     "classifier.weight", "classifier.bias")
    assert set(setup.norm_names) == {"body.1.weight", "body.1.bias", "body.1.running_mean", "body.1.running_var",
                                     "body.1.num_batches_tracked"}
    assert isinstance(setup.template, Net) and "Linear" not in repr(setup)          # no model dump in its repr


def test_default_traits_are_one_global_model_of_one_architecture():
    assert Bare.traits == Traits() and Bare.traits.global_model and not Bare.traits.heterogeneous
    assert ALGORITHMS["fedavg"].traits.global_model and not ALGORITHMS["fedavg"].traits.heterogeneous
    assert not ALGORITHMS["local_only"].traits.global_model and ALGORITHMS["local_only"].traits.heterogeneous


def test_clients_of_two_architectures_need_an_algorithm_that_allows_them():
    from hpcfl.errors import ConfigError

    class Heterogeneous(Bare):
        traits = Traits(heterogeneous=True)

    def job(*architectures):
        return job_from_dict({"run": {"study": "c", "name": "c"},
                              "algorithm": {"name": "local_only"}, "model": {"architectures": list(architectures)},
                              "data": {"dataset": "digits", "local_test_ratio": 0.3}})

    with pytest.raises(ConfigError, match="shares whole models, so every client needs the same one"):
        Bare.check(job("fmnist_cnn", "fmnist_cnn_narrow"))
    Bare.check(job())
    Heterogeneous.check(job("fmnist_cnn", "fmnist_cnn_narrow"))


def test_a_model_without_a_linear_classifier_has_no_feature_width():
    job = _setup().job
    assert Setup.of(job, nn.Sequential(nn.Linear(3, 2)), np.ones((2, 2))).feature_dim == 0


def test_a_client_starts_with_nothing_and_takes_back_what_it_kept():
    client = Client(0, torch.arange(6.0).view(2, 3), torch.zeros(2), np.ones(2))
    assert (client.test_set, client.shared, client.normalization, client.state, client.term_state) == (
        None, None, None, {}, {})
    assert client.inputs() is client.x                                # float rows are handed over as they are
    client.state = {"control": {"c": torch.ones(2)}, "bn": {}}
    client.term_state = {"ka": {"anchor": torch.zeros(3)}, "moon": {}}
    kept = client.kept()
    assert set(kept["algorithm"]) == {"control"} and set(kept["terms"]) == {"ka"}   # an empty owner is not sent
    moved = Client(0, client.x, client.y, client.class_counts)
    moved.keep(kept)
    assert set(moved.state) == {"control"} and torch.equal(moved.state["control"]["c"], torch.ones(2))
    assert set(moved.term_state) == {"ka"} and torch.equal(moved.term_state["ka"]["anchor"], torch.zeros(3))
    moved.state["control"]["other"] = torch.zeros(1)
    assert "other" not in kept["algorithm"]["control"]                 # its own dicts, not the sender's
