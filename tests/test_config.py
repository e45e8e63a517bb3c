import dataclasses
import json
import re
from pathlib import Path

import pytest

from hpcfl.config import JobConfig, apply_overrides, parse_override, read_job
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict, load_job


def test_defaults_and_derived_names():
    job = job_from_dict({"data": {"partition": "dirichlet", "partition_params": {"beta": 0.5}}})
    assert job == job_from_dict(job.to_dict())
    assert job.run_name == "fedavg-dirichlet-seed0"
    assert str(job.result_path) == "results/default/fedavg-dirichlet-seed0.h5"


def test_overrides_use_toml_values_and_reach_any_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[train]\nlr = 0.1\n')
    job = load_job(path, ["train.lr=0.05", "train.optimizer=adam", 'run.name="trial"',
                          "data.partition=dirichlet", "data.partition_params.beta=0.3"])
    assert job.train.lr == 0.05 and job.train.optimizer == "adam" and job.run.name == "trial"
    assert job.data.partition_params == {"beta": 0.3}
    assert parse_override("run.rounds=7") == (["run", "rounds"], 7)
    assert parse_override('algorithm.terms."pkg.mod:Term".weight=0.1') == (["algorithm", "terms", "pkg.mod:Term",
                                                                             "weight"], 0.1)
    assert apply_overrides({"a": {"b": 1}}, ["a.c=[1, 2]"]) == {"a": {"b": 1, "c": [1, 2]}}


@pytest.mark.parametrize("raw, needle", [
    ({"trian": {}}, "trian"),                                             # unknown section
    ({"train": {"learning_rate": 0.1}}, "learning_rate"),                 # unknown key
    ({"train": {"lr": "fast"}}, "train.lr"),                              # wrong type
    ({"train": {"lr": -1.0}}, "train.lr"),                                # out of range
    ({"train": {"optimizer": "lbfgs"}}, "train.optimizer"),               # bad choice, names valid ones
    ({"run": {"rounds": True}}, "run.rounds"),                            # bool is not an int
    ({"data": {"dataset": "imagenet42"}}, "data.dataset"),
    ({"model": {"name": "resnet9000"}}, "model.name"),
    ({"algorithm": {"name": "fedmagic"}}, "algorithm.name"),
    ({"algorithm": {"params": {"mu": 0.1}}}, "mu"),                       # fedavg takes no params
    ({"data": {"partition": "shards"}}, "data.partition"),
    ({"data": {"partition": "dirichlet"}}, "beta"),                       # required partition param
    ({"data": {"partition": "dirichlet", "partition_params": {"beta": 0.5, "alpha": 1}}}, "alpha"),
    ({"train": {"clients_per_round": 50}}, "clients_per_round"),
    ({"run": {"name": "../escape"}}, "run.name"),
    ({"train": {"betas": [0.9]}}, "train.betas"),
    ({"model": {"architectures": "resnet18"}}, "model.architectures"),            # a list, not a name
    ({"algorithm": {"terms": {"prox": 3}}}, "[algorithm.terms.prox] must be a table of parameters, got 3"),
    ({"algorithm": {"params": {"init": "bogus"}}}, "[algorithm.params]: init = 'bogus'; choose 'shared'"),
])
def test_bad_config_names_the_key(raw, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        job_from_dict(raw)


def test_the_old_name_of_algorithm_terms_is_accepted_with_a_warning(tmp_path):
    terms = {"prox": {"mu": 0.1}, "moon": {}}
    with pytest.warns(FutureWarning, match="algorithm.regularizers is now called algorithm.terms"):
        old = job_from_dict({"algorithm": {"regularizers": terms}})
    assert old == job_from_dict({"algorithm": {"terms": terms}}) and old.algorithm.terms == terms
    path = tmp_path / "job.toml"
    path.write_text('[algorithm]\nterms = { moon = {} }\n')
    with pytest.warns(FutureWarning, match="algorithm.regularizers"):
        overridden = load_job(path, ["algorithm.regularizers.prox.mu=0.5"])
    assert overridden.algorithm.terms == {"moon": {}, "prox": {"mu": 0.5}}
    with pytest.raises(ConfigError, match="both 'regularizers' and 'terms'.*keep algorithm.terms"):
        job_from_dict({"algorithm": {"regularizers": ["prox"], "terms": ["moon"]}})


def test_bad_choice_lists_valid_values():
    with pytest.raises(ConfigError, match="sgd"):
        job_from_dict({"train": {"optimizer": "lbfgs"}})


def test_unreadable_job_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_job(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nseed = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_job(bad)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("no-equals-sign")


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobConfig().run.seed = 3


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parent.parent / "jobs").rglob("*.toml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_job_file_is_valid(path):
    config = load_job(path)
    assert config.run.rounds >= 1 and config.data.num_clients >= config.train.clients_per_round


def test_a_job_is_resolved_once_into_what_set_up_builds_from(tmp_path):
    from hpcfl.jobs import prepare

    path = tmp_path / "job.toml"
    path.write_text('[algorithm]\nname = "fedproto"\n[model]\narchitectures = ["fmnist_cnn", "fmnist_cnn_wide", '
                    '"fmnist_cnn"]\n[data]\nnum_clients = 5\nseed = 7\nlocal_test_ratio = 0.3\n[run]\nseed = 3\n'
                    '[train]\nclients_per_round = 2\n')
    job = prepare(path)
    assert job.client_architectures == ("fmnist_cnn", "fmnist_cnn_wide", "fmnist_cnn", "fmnist_cnn", "fmnist_cnn_wide")
    assert list(job.models) == ["fmnist_cnn", "fmnist_cnn_wide"] and job.config.data_seed == 7
    assert job.config.run_name == "fedproto-iid-seed3"
    assert job.config.result_path == Path("results/default/fedproto-iid-seed3.h5")
    assert prepare(job.config) == job == prepare(job.config.to_dict())      # a file, its tables or a JobConfig
    overridden = prepare(path, ["data.num_clients=2", "data.seed=-1"])
    assert overridden.client_architectures == ("fmnist_cnn", "fmnist_cnn_wide") and overridden.config.data_seed == 3
    assert prepare({}).moving and not prepare({"run": {"placement": "fixed"}}).moving    # fedavg's clients keep nothing
    assert not prepare({"algorithm": {"name": "scaffold"}}).moving                      # its control variates stay
    assert not prepare({"algorithm": {"terms": ["moon"]}}).moving                         # MOON keeps the last model
    prox = prepare({"algorithm": {"name": "fedprox"}})
    assert prox.algorithm_class.name == "fedprox" and list(prox.adapting) == ["prox"] and prox.terms == {}


def test_the_defaults_a_job_gets_for_the_keys_it_leaves_out():
    """A change here changes every run that leaves the key out: make it on purpose, with a CHANGELOG
    entry (the docs' job-file reference is generated from the same fields)."""
    assert JobConfig().to_dict() == {
        "run": {"study": "default", "name": "", "arm": "", "seed": 0, "rounds": 10, "results_root": "results",
                "device": "auto", "threads": 1, "memory_format": "auto", "checkpoint_every": 10, "checkpoint_keep": 2,
                "round_timeout_s": 1800.0, "placement": "auto"},
        "data": {"dataset": "fashion_mnist", "root": "", "num_clients": 20, "partition": "iid", "partition_params": {},
                 "min_samples": 10, "train_samples": 0, "validation_fraction": 0.0, "local_test_ratio": 0.0,
                 "seed": -1},
        "model": {"name": "fmnist_cnn", "architectures": [], "batchnorm": "average", "params": {}},
        "train": {"clients_per_round": 10, "local_epochs": 1, "batch_size": 32, "optimizer": "sgd",
                  "betas": [0.9, 0.999], "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "augment": "none",
                  "on_nonfinite": "stop", "batched_clients": "auto", "cuda_graphs": False, "precision": "fp32"},
        "algorithm": {"name": "fedavg", "params": {}, "terms": {}},
        "eval": {"every": 1, "batch_size": 1000, "forgetting": False, "feature_quality": False}}
    assert list(json.loads(JobConfig().to_json())) == ["algorithm", "data", "eval", "model", "run", "train"]


@pytest.mark.parametrize("every, evaluated", [(1, list(range(10))), (3, [2, 5, 8, 9]), (5, [4, 9]), (20, [9])])
def test_the_server_model_is_tested_every_k_rounds_and_after_the_last(every, evaluated):
    job = job_from_dict({"run": {"rounds": 10}, "eval": {"every": every}})
    assert [r for r in range(10) if job.evaluates(r)] == evaluated


def _job(**keys):
    """A job with dotted `keys` set ({"run.seed": 3}); tables as TOML gives them."""
    raw = {}
    for key, value in keys.items():
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = value
    return job_from_dict(raw)


@pytest.mark.parametrize("keys", [
    {"run.rounds": 1}, {"run.seed": 0}, {"run.seed": 2 ** 63 - 1}, {"train.momentum": 0.0}, {"run.threads": 1024},
    {"train.batched_clients": 0}, {"train.batched_clients": 2 ** 63 - 1}, {"train.batched_clients": "auto"},
    {"train.cuda_graphs": True}, {"train.cuda_graphs": False, "train.batched_clients": 0},
    {"data.seed": -1}, {"data.validation_fraction": 0.0}, {"data.validation_fraction": 0.99},
    {"train.betas": [0.0, 0.999]}, {"model.architectures": []}, {"run.name": "x" * 200}, {"run.name": "é" * 100}])
def test_the_edges_of_each_range_are_accepted(keys):
    _job(**keys)


@pytest.mark.parametrize("keys, message", [
    ({"run.rounds": 0}, "run.rounds = 0 must be > 0"),
    ({"data.min_samples": 0}, "data.min_samples = 0 must be > 0"),           # an empty client's loss is NaN
    ({"run.seed": -1}, "run.seed = -1 must be >= 0"),
    ({"run.seed": -2 ** 63}, "run.seed = -9223372036854775808 must be >= 0"),     # 64 bits, then the range
    ({"run.seed": -2 ** 63 - 1}, "out of range: integers have 64 bits"),
    ({"run.seed": 2 ** 63}, "out of range: integers have 64 bits"),
    ({"train.momentum": -0.1}, "train.momentum = -0.1 must be >= 0"),
    ({"run.threads": 1025}, "run.threads = 1025 must be at most 1024"),
    ({"train.batched_clients": -1}, "train.batched_clients = -1 must be 'auto' or a number of clients >= 0"),
    ({"train.batched_clients": 2 ** 63}, "train.batched_clients = 9223372036854775808 must be 'auto'"),
    ({"train.batched_clients": True}, "train.batched_clients = True must be 'auto'"),
    ({"train.cuda_graphs": True, "train.batched_clients": 0}, "train.cuda_graphs = true captures"),
    ({"data.seed": -2}, "data.seed = -2 must be >= 0, or -1"),
    ({"data.validation_fraction": 1.0}, r"data.validation_fraction = 1.0 must be in \[0, 1\)"),
    ({"data.validation_fraction": -0.1}, r"data.validation_fraction = -0.1 must be in \[0, 1\)"),
    ({"train.betas": [0.9, 1.0]}, "train.betas = .* must be two numbers in"),
    ({"train.betas": [-0.1, 0.9]}, "train.betas = .* must be two numbers in"),
    ({"train.betas": [0.9]}, "train.betas = .* must be two numbers in"),
    ({"model.architectures": "resnet18"}, "model.architectures = 'resnet18' must be a list of model names"),
    ({"model.architectures": [1]}, r"model.architectures = \[1\] must be a list of model names"),
    ({"run.name": "x" * 201}, "run.name = .* must be a plain name: printable, at most 200 bytes"),
    ({"run.name": "é" * 101}, "run.name = .* at most 200 bytes"),                    # 202 bytes in UTF-8
    ({"run.results_root": "a\0b"}, "run.results_root = .* holds a NUL character"),
    ({"data.root": "a\0b"}, "data.root = .* holds a NUL character")])
def test_a_value_past_an_edge_is_refused_naming_the_key_and_the_range(keys, message):
    with pytest.raises(ConfigError, match=message):
        _job(**keys)


def test_a_section_must_be_a_table_and_an_override_cannot_reach_into_a_value():
    with pytest.raises(ConfigError, match=r"\[run\] must be a table, got 5"):
        job_from_dict({"run": 5})
    raw = {"train": {"lr": 0.1}}
    with pytest.raises(ConfigError, match="override 'train.lr.x=1': train.lr is a value, not a table"):
        apply_overrides(raw, ["train.lr.x=1"])
    assert apply_overrides(raw, ["train.lr=0.2"]) == {"train": {"lr": 0.2}} and raw == {"train": {"lr": 0.1}}
    with pytest.raises(ConfigError, match="is not KEY=VALUE with a dotted KEY"):
        parse_override('" ".lr=1')                                  # a blank key part names nothing


def test_a_job_file_with_a_sweep_runs_only_as_one_of_its_points(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[run]\nrounds = 3\n[sweep]\nseeds = [0, 1]\n')
    with pytest.raises(ConfigError, match="defines a \\[sweep\\]: run one of its points with `hpcfl sweep"):
        read_job(path)
    assert read_job(path, allow_sweep=True).run.rounds == 3


def test_the_whole_job_is_checked_once_resolved_and_its_tables_recorded_as_run(tmp_path):
    """What only the whole job shows is refused (a [sweep] outside hpcfl sweep, an unknown architecture,
    the algorithm's own rules, clients trained together where they cannot be, forgetting without a global
    model, anchors of round 0 under a model no client starts from); the resolved job is frozen, and
    records each parameter table as the run uses it: the model's flat for one architecture, one table per
    architecture for several."""
    from hpcfl.jobs import prepare

    path = tmp_path / "job.toml"
    path.write_text('[run]\nrounds = 3\n[sweep]\nseeds = [0, 1]\n')
    for read in (load_job, prepare):
        with pytest.raises(ConfigError, match=r"defines a \[sweep\]"):
            read(path)
    assert prepare(path, allow_sweep=True).config.run.rounds == 3
    refusals = [({"model": {"architectures": ["fmnist_cnn", "nonet"]}, "algorithm": {"name": "fedproto"}},
                 "model.architectures"),
                ({"model": {"architectures": ["fmnist_cnn", "fmnist_cnn_wide"]}}, "algorithm 'fedavg' shares whole"),
                ({"train": {"batched_clients": 4, "precision": "bf16"}}, "train.precision = 'bf16' trains"),
                ({"algorithm": {"name": "fedproto"}, "eval": {"forgetting": True}, "data": {"local_test_ratio": 0.3}},
                 "eval.forgetting compares local models with the global model, which algorithm 'fedproto'"),
                ({"algorithm": {"name": "fedfm", "params": {"init": "independent", "start_round": 0}}},
                 "start_round = 0.*init = 'independent'"),
                ({"algorithm": {"params": {"init": "independent"}, "terms": {"fm_l2": {"start_round": 0}}}},
                 "start_round >= 1 or init = 'shared'")]
    for raw, needle in refusals:
        with pytest.raises(ConfigError, match=needle):
            job_from_dict(raw)
    assert prepare({"eval": {"forgetting": True}}).config.eval.forgetting           # FedAvg has a global model
    assert prepare({"algorithm": {"name": "fedfm", "params": {"init": "independent", "start_round": 1}}})
    job = prepare({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.moving = False
    assert job.tables["model"]["params"] == dataclasses.asdict(job.models["fmnist_cnn"])
    assert job.tables["algorithm"] == {"params": {"init": "shared"}, "terms": {}}       # with its default
    mixed = prepare({"algorithm": {"name": "fedproto"}, "data": {"local_test_ratio": 0.3},
                     "model": {"architectures": ["fmnist_cnn", "fmnist_cnn_wide"]}})
    assert mixed.tables["model"]["params"] == {name: dataclasses.asdict(options)
                                               for name, options in mixed.models.items()}
    assert list(mixed.tables["model"]["params"]) == ["fmnist_cnn", "fmnist_cnn_wide"]
