"""Plug-ins: an algorithm, a model, a data set, a partition and a loss term from a package outside hpcfl
(tests/plugins/labfl), named in a job by import path, run from Python (hpcfl.run) in one process and
under MPI with the same metrics; a wrong path, kind or parameter is refused by key before training; a
split exported from hpcfl and read back by a partition plug-in is the same run."""
import re
import textwrap
import tomllib
from pathlib import Path

import pytest

import hpcfl
from hpcfl.config import apply_overrides
from hpcfl.errors import HpcflError
from hpcfl.jobs import job_from_dict, resolve
from hpcfl.launch import main as launch
from hpcfl.metrics import read_run
from hpcfl.testing import StepTrainer, assert_same_metrics, run_metrics

PLUGINS = {"data.dataset": "labfl.data:blobs", "data.partition": "labfl.partition:shards",
           "model.name": "labfl.model:Mlp", "algorithm.name": "labfl.algorithm:HalfStep",
           "algorithm.terms": "labfl.term:Centring"}


JOB = """
[run]
study = "plug"
name = "{name}"
rounds = 4
results_root = "{root}"
[data]
dataset = "labfl.data:blobs"
num_clients = 4
partition = "labfl.partition:shards"
partition_params = {{ per_client = 2 }}
validation_fraction = 0.1
[model]
name = "labfl.model:Mlp"
params = {{ hidden = 16 }}
[train]
clients_per_round = 3
batch_size = 32
lr = 0.1
momentum = 0.5
[algorithm]
name = "labfl.algorithm:HalfStep"
params = {{ step = 0.5 }}
terms = {{ "labfl.term:Centring" = {{ weight = 0.01 }} }}
"""


def _job(root, name="lab") -> dict:
    return tomllib.loads(JOB.format(root=root, name=name))


def _launch_with(tmp_path, monkeypatch, module: str, source: str, *sets: str, check: bool = True) -> int:
    """`hpcfl run [--check]` of the plug-in job with `--set`s, module `module` (`source`) importable."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(root=tmp_path, name="lab"))
    return launch([str(path), *(["--check"] if check else []), *(a for s in sets for a in ("--set", s))])


def test_a_job_of_plugins_runs_from_python_and_its_file_names_them(tmp_path):
    path = hpcfl.run(_job(tmp_path))
    run = read_run(path)
    assert run.attrs["status"] == "completed" and run.rounds == 4
    assert run.arrays["round/test_acc"][-1] > 0.6                        # four blobs: chance is 0.25
    assert (run.arrays["round/step"] == 0.5).all()                        # the plug-in algorithm's own metric
    assert {p["key"]: name for name, p in run.attrs["plugins"].items()} == PLUGINS
    assert run.attrs["plugins"]["labfl.model:Mlp"] == {"key": "model.name", "module": "labfl.model", "version": None}
    assert hpcfl.run(_job(tmp_path)) == path        # complete: returned at once
    hidden = [v for k, v in run.arrays.items() if k == "partition"]
    assert hidden and hidden[0].shape == (4, 4)                            # the plug-in data set's 4 classes


@pytest.mark.parametrize("key, value, message", [
    ("algorithm.name", '"labfll.algorithm:HalfStep"', "algorithm.name = 'labfll.algorithm:HalfStep': cannot import"),
    ("algorithm.name", '"labfl.algorithm:HalfStp"', "module 'labfl.algorithm' has no 'HalfStp'"),
    ("algorithm.name", '"labfl.model:Mlp"', "is not an hpcfl algorithm"),
    ("algorithm.params.stepp", "1.0", "algorithm.params"),
    ("model.name", '"labfl.model:Mpl"', "model.name = 'labfl.model:Mpl'"),

    ("data.dataset", '"labfl.data.blobs"', "data.dataset = 'labfl.data.blobs' is unknown; valid: ['cifar10', "),
    ("data.dataset", '"labfl.data.blobs"', "import path 'package.module:Name' (did you mean 'labfl.data:blobs'?)"),
    ("data.dataset", '"blobs"', "import path 'package.module:Name'\n"),      # no dots: no guess
    ("data.partition", '"labfl.partition:shard"', "data.partition = 'labfl.partition:shard': module 'labfl.partition' "
                                                  "has no 'shard'"),
    ("data.partition", '"labfll.partition:shards"', "data.partition = 'labfll.partition:shards': cannot import"),
    ("data.partition", '"labfl.data:blobs"', "data.partition = 'labfl.data:blobs': blobs(root, train_images=True) "
                                             "is not a partition scheme"),
    ("data.partition_params.per_client", '"2"', "data.partition_params.per_client = '2': must be an integer"),
    ("data.partition_params.per_clients", "2", "data.partition_params.per_clients is not a setting of partition "
                                              "'labfl.partition:shards'"),
    ("algorithm.terms", '{ "labfl.term:Centering" = {} }', "algorithm.terms = 'labfl.term:Centering'"),
    ("algorithm.terms", '{ "labfl.term:Centring" = { weight = "x" } }', "algorithm.terms.labfl.term"),
])
def test_a_bad_plugin_is_refused_before_training_naming_the_key(key, value, message, tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(root=tmp_path, name="lab"))
    assert launch([str(path), "--set", f"{key}={value}"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "plug").exists()                               # nothing ran, no result file


@pytest.mark.parametrize("model, message", [
    ("math:sqrt", "model.name = 'math:sqrt' cannot be called as math:sqrt(in_shape, num_classes) (too many "
                  "positional arguments): a model plug-in is a class or function taking those"),
    ("itertools:repeat", "model.name = 'itertools:repeat' returned a repeat, not a torch.nn.Module"),
    ("torch.nn:Identity", "model.name = 'torch.nn:Identity' built Identity, which lacks a features(x) method or an "
                          "nn.Linear `classifier`")])
def test_a_model_plugin_of_the_wrong_kind_is_refused_in_set_up_naming_the_key(model, message, tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(root=tmp_path, name="lab"))
    assert launch([str(path), "--set", f"model.name={model!r}", "--set", "model.params={}"]) == 2
    assert message in capsys.readouterr().err


def test_a_model_with_features_but_no_linear_classifier_is_refused(tmp_path, monkeypatch):
    from hpcfl.models import build_model

    (tmp_path / "heads.py").write_text(textwrap.dedent("""
        from torch import nn

        class Deep(nn.Module):
            def __init__(self, in_shape, num_classes):
                super().__init__()
                self.classifier = nn.Sequential(nn.Linear(64, 8), nn.Linear(8, num_classes))

            def features(self, x):
                return x.flatten(1)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(hpcfl.ConfigError, match=r"model.name = 'heads:Deep' built Deep, which lacks a features\(x\) "
                                                r"method or an nn.Linear `classifier`"):
        build_model("heads:Deep", (1, 8, 8), 10)


@pytest.mark.mpi
def test_plugins_give_the_same_metrics_on_one_process_and_on_all_ranks(tmp_path):
    from mpi4py import MPI

    from hpcfl.runtime.build import setup
    from hpcfl.runtime.loop import run
    from hpcfl.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD
    root = comm.bcast(str(tmp_path), root=0)
    config = job_from_dict(apply_overrides(_job(root, "ranks"), []))
    transport = MpiTransport({}, comm)
    job = setup(resolve(config), transport, None)
    run(job)
    if job.recorder:
        job.recorder.close()
    transport.close()
    try:
        if comm.Get_rank() == 0:
            one = hpcfl.run(_job(root, "one"))
            assert_same_metrics(run_metrics(one), run_metrics(tmp_path / "plug" / "ranks.h5"))
    finally:
        comm.Barrier()


def test_a_split_exported_from_hpcfl_and_read_back_by_a_plug_in_is_the_same_run(tmp_path):
    """docs/how-to/write-a-partition.md's round trip: hpcfl's own split written out per client (as another
    tool would take it) and read back by the `from_file` plug-in (as a flwr-datasets split comes in)."""
    import numpy as np

    from hpcfl.data.datasets import load_dataset
    from hpcfl.data.splits import client_partition

    built_in = {**_job(tmp_path, "built_in"), "data": {**_job(tmp_path)["data"], "partition": "dirichlet",
                                                      "partition_params": {"beta": 0.5}}}
    data = load_dataset("labfl.data:blobs", tmp_path)
    parts = client_partition(job_from_dict(built_in), data.train_y.numpy(), data.groups)
    np.savez(tmp_path / "split.npz", **{f"client_{c}": part for c, part in enumerate(parts)})
    read_back = {**built_in, "run": {**built_in["run"], "name": "read_back"},
                 "data": {**built_in["data"], "partition": "labfl.partition:from_file",
                          "partition_params": {"path": str(tmp_path / "split.npz")}}}
    one, other = hpcfl.run(built_in), hpcfl.run(read_back)
    np.testing.assert_array_equal(read_run(one).arrays["partition"], read_run(other).arrays["partition"])
    assert_same_metrics(run_metrics(one), run_metrics(other), exact=True)


def test_registries_hold_the_built_ins_and_answer_membership_without_raising():
    from hpcfl.algorithms import ALGORITHMS
    from hpcfl.models import MODELS
    from hpcfl.plugins import plugins

    assert "fedavg" in ALGORITHMS and "fedavg" in set(ALGORITHMS) and len(ALGORITHMS) == len(set(ALGORITHMS))
    assert ALGORITHMS["fedavg"] is hpcfl.FedAvg
    assert "labfl.model:Mlp" in MODELS and "nope" not in MODELS and "labfl.model:Nope" not in MODELS
    recorded = plugins({"model.name": ["sklearn.linear_model:Ridge", "fmnist_cnn"],
                        "data.dataset": ["labfl.data:blobs"]})
    from importlib import metadata

    assert recorded == {"sklearn.linear_model:Ridge": {"key": "model.name", "module": "sklearn.linear_model",
                                                       "version": metadata.version("scikit-learn")},
                        "labfl.data:blobs": {"key": "data.dataset", "module": "labfl.data", "version": None}}


def test_fedavg_written_from_the_contract_alone_is_the_built_in_fedavg(tiny_job, tmp_path):
    """docs/write-your-own-algorithm.md's MyFedAvg: bit for bit the built-in, with momentum and
    weight decay, partial participation and a validation split."""
    from hpcfl.jobs import load_job

    paths = {}
    for name in ("fedavg", "labfl.fedavg:MyFedAvg"):
        config = load_job(tiny_job(rounds=3), [f"algorithm.name='{name}'", "train.momentum=0.9",
                                               "train.weight_decay=1e-3", "data.validation_fraction=0.2",
                                               f"run.results_root='{tmp_path}'",
                                               f"run.name='{name.split(':')[-1]}'"])
        paths[name] = hpcfl.run(config)
    assert_same_metrics(run_metrics(paths["fedavg"]), run_metrics(paths["labfl.fedavg:MyFedAvg"]), exact=True)


def _documented_classes() -> dict:
    """The names docs/how-to/write-your-own-algorithm.md defines, its Python blocks run in order as
    printed, as a reader pastes them into one module (the testing example asserts its own numbers)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "how-to" / "write-your-own-algorithm.md").read_text()
    namespace = {"__name__": "documented"}
    for _indent, block in re.findall(r"^( *)```python\n(.*?)^\1```$", page, re.MULTILINE | re.DOTALL):
        exec(compile(textwrap.dedent(block), "write-your-own-algorithm.md", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("source", ["plug-in", "docs"])
def test_client_memory_adds_beta_times_the_clients_previous_update(tiny_job, source):
    import numpy as np
    import torch
    from labfl import fedavg

    from hpcfl import Client, Setup
    from hpcfl.jobs import load_job

    model = torch.nn.Linear(1, 1, bias=False)
    setup = Setup.of(load_job(tiny_job()), model, np.ones((2, 2)))
    ClientMemory = fedavg.ClientMemory if source == "plug-in" else _documented_classes()["ClientMemory"]
    algorithm = ClientMemory(ClientMemory.Params(beta=0.5), setup)
    client = Client(0, torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), np.ones(2))
    client.state = algorithm.init_client_state(client, model)
    sent = []
    for round, start in enumerate((0.0, 5.0, 2.0)):
        downlink = {"model": {"weight": torch.full((1, 1), start)}}
        contributions, _ = algorithm.client_update(algorithm.phase, round, client, downlink, model,
                                                   StepTrainer(shift=1.0))
        tensors, weight = contributions["model"]
        sent.append(float(tensors["weight"]))
        assert weight == 4.0
    assert sent == [1.0, 6.5, 3.5]          # trained = start + 1; from round 1 on plus 0.5 x the last update (1)
    assert float(client.state["update"]["weight"]) == 1.0


def test_every_public_name_resolves_to_what_its_module_defines():
    import importlib

    for name in hpcfl.__all__:
        value = getattr(hpcfl, name)
        assert value is not None, name
        if name in hpcfl._EXPORTS:
            assert value is getattr(importlib.import_module(hpcfl._EXPORTS[name]), name)
    assert hpcfl.Regularizer is hpcfl.Term           # the old name, for one release
    with pytest.raises(AttributeError, match="no attribute 'Regularisers'"):
        _ = hpcfl.Regularisers


def test_traits_are_one_record_inherited_but_for_the_promises_about_client_update():
    from hpcfl import Algorithm, FedAvg, Traits
    from hpcfl.algorithms import ALGORITHMS

    class Quiet(FedAvg):                    # declares nothing: FedAvg's traits but batched and stateless
        name = "quiet"

    assert FedAvg.traits.batched and FedAvg.traits.stateless
    assert Quiet.traits == FedAvg.traits.but(batched=False, stateless=False)
    assert ALGORITHMS["ensemble"].traits == Traits(client_test=True, global_model=False, heterogeneous=True,
                                                   batched=True)
    with pytest.raises(TypeError, match=r"traits = Traits\(stateless=...\)"):
        type("Old", (Algorithm,), {"name": "old", "stateless": True})     # an earlier release's class flag


def test_a_plugin_that_fails_as_it_loads_is_a_config_error_naming_the_key(tmp_path, monkeypatch, capsys):
    (tmp_path / "brokenfl.py").write_text("from hpcfl import FedAvg\n\n"
                                          "class Old(FedAvg):\n    name = 'old'\n    stateless = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = _job(tmp_path)
    job["algorithm"] = {"name": "brokenfl:Old"}
    job["algorithm"].pop("terms", None)
    with pytest.raises(hpcfl.ConfigError, match=r"algorithm.name = 'brokenfl:Old': importing module 'brokenfl' "
                                                r"failed: TypeError: .*traits = Traits\(stateless=...\)"):
        hpcfl.run(job)


def test_a_plugin_term_asking_for_anchors_must_carry_the_anchor_phases_settings(tmp_path, monkeypatch):
    (tmp_path / "anchorfl.py").write_text(
        "from dataclasses import dataclass\nfrom hpcfl import Term\nfrom hpcfl.terms import FeatureMatching\n\n"
        "class Bare(Term):\n    name, needs_anchors = 'bare', True\n\n"
        "    @dataclass(frozen=True)\n    class Params:\n        weight: float = 1.0\n\n"
        "class Matched(FeatureMatching):\n    name = 'matched'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = _job(tmp_path)
    job["algorithm"]["terms"] = {"anchorfl:Bare": {}}
    with pytest.raises(hpcfl.ConfigError, match=r"algorithm.terms = 'anchorfl:Bare': Bare sets needs_anchors but "
                                                r"its Params has no anchor_weighting or start_round"):
        hpcfl.run(job)
    from hpcfl.terms import TERMS
    assert TERMS["anchorfl:Matched"].needs_anchors           # FeatureMatching's Params carries both


def test_a_plugin_check_that_skips_super_still_gets_the_rules_its_traits_imply(tmp_path, monkeypatch):
    (tmp_path / "strictfl.py").write_text(
        "from hpcfl import ConfigError, FedAvg\n\n"
        "class Strict(FedAvg):\n    name = 'strict'\n\n"
        "    @classmethod\n    def check(cls, job):\n"
        "        if job.train.lr > 1:\n            raise ConfigError('strict needs train.lr <= 1')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = {"run": {"study": "s", "results_root": str(tmp_path)}, "algorithm": {"name": "strictfl:Strict"},
           "data": {"dataset": "digits"}}
    with pytest.raises(hpcfl.ConfigError, match=r"strict needs train.lr <= 1"):             # its own rule
        hpcfl.run({**job, "train": {"lr": 2.0}})
    with pytest.raises(hpcfl.ConfigError, match="shares whole models, so every client needs the same one"):
        hpcfl.run({**job, "model": {"architectures": ["fmnist_cnn", "fmnist_cnn_narrow"]}})


BAD_LOADERS = """
import numpy as np
import torch
from hpcfl import Dataset

def one_arg(root):
    raise AssertionError("never called")

def _set(train_y, test_x=None, test_y=None):
    x = torch.zeros(len(train_y), 8)
    return Dataset("bad", x, train_y, x if test_x is None else test_x, train_y if test_y is None else test_y, 4)

def float_labels(root, train_images=True):
    return _set(torch.arange(8) % 4.0)

def numpy_inputs(root, train_images=True):
    return _set(torch.arange(8) % 4, test_x=np.zeros((8, 8), dtype=np.float32))

def double_inputs(root, train_images=True):
    return _set(torch.arange(8) % 4, test_x=torch.zeros(8, 8, dtype=torch.float64))

def short_labels(root, train_images=True):
    return _set(torch.arange(8) % 4, test_y=torch.arange(7) % 4)
"""


@pytest.mark.parametrize("loader, message", [
    ("one_arg", "data.dataset = 'badsets:one_arg': one_arg(root) is not a data-set loader: hpcfl calls "
                "loader(root, train_images=...) (got an unexpected keyword argument 'train_images')"),
    ("float_labels", "data.dataset = 'badsets:float_labels': test_y is torch.float32 of shape (8,), not 1-d int64 "
                     "labels"),
    ("numpy_inputs", "data.dataset = 'badsets:numpy_inputs': test_x is ndarray, not a torch.Tensor"),
    ("double_inputs", "data.dataset = 'badsets:double_inputs': test_x is torch.float64, not float32"),
    ("short_labels", "data.dataset = 'badsets:short_labels': test_x has 8 rows but test_y 7 labels")])
def test_a_data_set_plugin_giving_the_wrong_tensors_is_refused_before_training(loader, message, tmp_path,
                                                                             monkeypatch, capsys):
    assert _launch_with(tmp_path, monkeypatch, "badsets", BAD_LOADERS, f"data.dataset='badsets:{loader}'",
                        check=False) == 2
    assert message in capsys.readouterr().err
    assert not list((tmp_path / "plug").glob("**/*.h5"))                  # nothing trained


BAD_HOOKS = """
from dataclasses import dataclass
from hpcfl import FedAvg, Term
from hpcfl.algorithms.base import Algorithm

class NoUpdate(Algorithm):
    name = "no_update"
    def plan(self, round):
        return []
    def downlink(self, phase, round, server_state):
        return {}

class ShortUpdate(FedAvg):
    name = "short_update"
    def client_update(self, phase, round, client, downlink, model):
        return {}, {}

class ShortLoss(Term):
    name = "short_loss"
    def loss(self, model, x, y):
        return None

class Undecorated(FedAvg):
    name = "undecorated"
    class Params:
        step: float = 1.0

class Thawed(FedAvg):
    name = "thawed"
    @dataclass
    class Params:
        step: float = 1.0

class Undecorated2(FedAvg):
    name = "undecorated2"
    class Params(FedAvg.Params):
        step: float = 1.0

class Unset(FedAvg):
    name = "unset"
    start_from = None

class Loose:                                 # a model whose Options is not a dataclass
    class Options:
        hidden: int = 8

class Required(FedAvg):                      # fits: a Params field without a default, a static hook
    name = "required"
    @dataclass(frozen=True)
    class Params:
        mu: float
    @staticmethod
    def start_from(model, client, state):
        model.load_state_dict(state)
    def train(self, model, client, round, trainer, received):      # without the optional extra and epochs
        return super().train(model, client, round, trainer, received)
"""


@pytest.mark.parametrize("key, value, message", [
    ("algorithm.name", "hooks:NoUpdate", "algorithm.name = 'hooks:NoUpdate': NoUpdate does not define client_update, "
                                         "which an hpcfl algorithm needs"),
    ("algorithm.name", "hooks:ShortUpdate", "algorithm.name = 'hooks:ShortUpdate': ShortUpdate.client_update(self, "
                                            "phase, round, client, downlink, model) does not take the arguments hpcfl "
                                            "passes it (self, phase, round, client, downlink, model, trainer)"),
    ("algorithm.terms", '{ "hooks:ShortLoss" = {} }', "algorithm.terms = 'hooks:ShortLoss': ShortLoss.loss(self, "
                                                      "model, x, y) does not take the arguments hpcfl passes it "
                                                      "(self, model, x, y, features, logits)"),
    ("algorithm.name", "hooks:Undecorated", "[algorithm.params] is read into Undecorated.Params, which is not a frozen "
                                            "dataclass: decorate it with @dataclass(frozen=True)"),
    ("algorithm.name", "hooks:Thawed", "[algorithm.params] is read into Thawed.Params, which is not a frozen"),
    ("algorithm.name", "hooks:Undecorated2", "[algorithm.params] is read into Undecorated2.Params, which is not a "
                                             "frozen dataclass"),
    ("algorithm.name", "hooks:Unset", "algorithm.name = 'hooks:Unset': Unset.start_from is a NoneType, not a method"),
    ("model.name", "hooks:Loose", "[model.params of model 'hooks:Loose'] is read into Loose.Options, which is not a "
                                  "frozen dataclass")])
def test_a_plugin_hook_or_params_hpcfl_cannot_use_is_refused_at_validation(key, value, message, tmp_path,
                                                                        monkeypatch, capsys):
    value = value if value.startswith("{") else repr(value)
    assert _launch_with(tmp_path, monkeypatch, "hooks", BAD_HOOKS, f"{key}={value}") == 2
    assert message in capsys.readouterr().err


def test_a_plugin_whose_own_import_fails_names_the_missing_package_not_the_plugin(tmp_path, monkeypatch, capsys):
    assert _launch_with(tmp_path, monkeypatch, "needsdep", "import hpcfl_absent_dependency\n",
                        "data.partition='needsdep:split'") == 2
    assert ("data.partition = 'needsdep:split': module 'needsdep' imports 'hpcfl_absent_dependency', which is not "
            "installed here") in capsys.readouterr().err


BAD_RETURNS = """
from hpcfl import FedAvg

class Misspelt(FedAvg):
    name = "misspelt"
    def client_update(self, phase, round, client, downlink, model, trainer):
        sent, metrics = super().client_update(phase, round, client, downlink, model, trainer)
        return {"modle": sent["model"]}, metrics

class DictOnly(FedAvg):
    name = "dict_only"
    def client_update(self, phase, round, client, downlink, model, trainer):
        return super().client_update(phase, round, client, downlink, model, trainer)[0]

class NoMetrics(FedAvg):
    name = "no_metrics"
    def client_update(self, phase, round, client, downlink, model, trainer):
        return super().client_update(phase, round, client, downlink, model, trainer)[0], None

class Unweighted(FedAvg):
    name = "unweighted"
    def client_update(self, phase, round, client, downlink, model, trainer):
        sent, metrics = super().client_update(phase, round, client, downlink, model, trainer)
        return {"model": sent["model"][0]}, metrics
"""


@pytest.mark.parametrize("algorithm, message", [
    ("Misspelt", "algorithm 'misspelt': client_update returned payload(s) ['modle'], which phase 'train' does not "
                 "declare (its uplink: ['model'])"),
    ("DictOnly", "algorithm 'dict_only': client_update returned a dict, not ({payload: (tensors, weight)}, metrics)"),
    ("NoMetrics", "algorithm 'no_metrics': client_update returned (dict, NoneType), not ({payload: (tensors, "
                  "weight)}, metrics): two dicts"),
    ("Unweighted", "algorithm 'unweighted': client_update returned payload(s) ['model'], each not a (tensors, weight) "
                   "pair")])
def test_an_update_returning_what_its_phase_does_not_declare_is_named(algorithm, message, tmp_path, monkeypatch):
    (tmp_path / "returns.py").write_text(BAD_RETURNS)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = {"run": {"study": "r", "rounds": 1, "results_root": str(tmp_path)}, "data": {"dataset": "digits"},
           "algorithm": {"name": f"returns:{algorithm}"}}
    with pytest.raises(HpcflError, match=re.escape(message)) as raised:
        hpcfl.run(job, quiet=True)
    assert re.fullmatch(r"hpcfl: in client \d+, round 1, phase 'train'", raised.value.__notes__[0])


def test_plugin_hooks_and_params_that_fit_their_calls_are_accepted(tmp_path, monkeypatch):
    """A Params field without a default (the job sets it), a static hook and one without the optional
    arguments take hpcfl's calls."""
    assert _launch_with(tmp_path, monkeypatch, "hooks", BAD_HOOKS, "algorithm.name='hooks:Required'",
                        "algorithm.params={mu=0.1}") == 0


def test_a_plugin_failing_an_import_of_its_own_code_says_so(tmp_path, monkeypatch, capsys):
    assert _launch_with(tmp_path, monkeypatch, "oldname", "from hpcfl.algorithms import FedAvgX\n",
                        "algorithm.name='oldname:Mine'") == 2
    assert ("algorithm.name = 'oldname:Mine': importing module 'oldname' failed: ImportError: cannot import name "
            "'FedAvgX'") in capsys.readouterr().err
