"""The composition root: a job read, overridden and checked against everything hpcfl knows (the
registries of algorithms, models, data sets, partitions and loss terms, plug-ins included) and
resolved once, before any rank trains, into what set-up builds from (`Resolved`). hpcfl.config
parses and checks each key on its own and imports nothing of hpcfl."""
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hpcfl.config import JobConfig, read_job
from hpcfl.errors import ConfigError
from hpcfl.params import model_params


@dataclass(frozen=True)
class Resolved:
    """A job as its run uses it: the configuration, each parameter table as its dataclass with the
    job's values over the defaults, and what set-up derives from them, the same on every rank (the
    run's name, result path and split seed are the config's own: `config.run_name`, ...)."""
    config: JobConfig
    algorithm_class: type       # the Algorithm subclass algorithm.name names
    algorithm: object           # its Params
    terms: dict                 # algorithm.terms: name -> the term's Params
    # the terms that shape the model (MOON's head): algorithm.terms and a preset's own
    adapting: dict
    models: dict                # architecture -> its model options
    partition: dict             # data.partition_params with the scheme's defaults
    # each round's cohort is dealt to the workers afresh (Algorithm.moves_clients)
    moving: bool
    client_architectures: tuple[str, ...]   # client k's architecture
    # every parameter table as the run uses it, in the job file's form (`_tables`)
    tables: dict


def load_job(path: str | Path, overrides: list[str] = (), allow_sweep: bool = False) -> JobConfig:
    """Read, override and validate a job file; raises ConfigError naming the key and the fix. A
    [sweep] table is for hpcfl.sweep, which runs one of its points (`allow_sweep`)."""
    return prepare(path, overrides, allow_sweep).config


def job_from_dict(raw: dict) -> JobConfig:
    """A job from its tables (as a TOML file would give them), checked whole."""
    return prepare(raw).config


def prepare(job: str | Path | dict | JobConfig, overrides: list[str] = (),
            allow_sweep: bool = False) -> Resolved:
    """A job (a file's path, its tables or a JobConfig) with --set's overrides, checked whole and
    resolved: what set-up (hpcfl.runtime.build) builds from."""
    return resolve(read_job(job, overrides, allow_sweep))


def resolve(config: JobConfig) -> Resolved:
    """Every name resolved in its registry (plug-ins imported, on every rank, before set-up), every
    parameter table checked against its dataclass (models, partition, algorithm, terms) and the
    algorithm's own rules on the whole job; a ConfigError names the key."""
    # Imported here: the registries pull in torch, which reading a job file alone does not need.
    from hpcfl.algorithms import ALGORITHMS, algorithm_params
    from hpcfl.algorithms.base import check_job
    from hpcfl.data.datasets import DATASETS
    from hpcfl.data.partition import check_params
    from hpcfl.models import MODELS, model_options
    from hpcfl.terms import term_params
    from hpcfl.training.batched import check_job as check_batched

    named = [("data.dataset", config.data.dataset, DATASETS),
             ("model.name", config.model.name, MODELS),
             ("algorithm.name", config.algorithm.name, ALGORITHMS)]
    named += [("model.architectures", name, MODELS) for name in config.model.architectures]
    for key, name, registry in named:
        registry.resolve(name, key)
    models = model_params(config.model.params,
                          {name: model_options(name) for name in config.architectures})
    partition = check_params(config.data.partition, config.data.partition_params)
    algorithm = algorithm_params(config.algorithm.name, config.algorithm.params)
    terms = {name: term_params(name, raw) for name, raw in config.algorithm.terms.items()}
    cls = ALGORITHMS[config.algorithm.name]
    preset = cls.term    # FedProx's prox, from its algorithm.params
    own = {f.name: getattr(algorithm, f.name) for f in fields(preset.Params)} if preset else {}
    adapting = {**terms, **({preset.name: preset.Params(**own)} if preset else {})}
    check_job(cls, config)
    # asked for: refused if it cannot
    if config.train.batched_clients != "auto" and config.train.batched_clients:
        check_batched(config, cls,
                      sorted(name for name, c in ALGORITHMS.items() if c.traits.batched))
    if config.eval.forgetting and not cls.traits.global_model:
        raise ConfigError(f"eval.forgetting compares local models with the global model, which "
                          f"algorithm '{config.algorithm.name}' does not have; "
                          "set eval.forgetting = false")
    matching_from = min((p.start_round for p in adapting.values() if hasattr(p, "start_round")), default=1)
    if getattr(algorithm, "init", "") == "independent" and cls.traits.anchor_phase and matching_from < 1:
        raise ConfigError("feature matching from round 0 (start_round = 0) takes its anchors under the global model, "
                          "but with algorithm.params.init = 'independent' each client trains its own in round 0: "
                          "set start_round >= 1 or init = 'shared'")
    dealt = config.model.architectures or [config.model.name]
    return Resolved(config, cls, algorithm, terms, adapting, models, partition,
                    cls.moves_clients(config),
                    tuple(dealt[k % len(dealt)] for k in range(config.data.num_clients)),
                    _tables(algorithm, terms, models, partition))


def _tables(algorithm, terms: dict, models: dict, partition: dict) -> dict:
    """Every parameter table as the run uses it, in the job file's own form: {"algorithm":
    {"params", "terms"}, "model": {"params"}, "data": {"partition_params"}}, model params flat for
    one architecture, a table per architecture for several. A job records only what it wrote, which
    says nothing of the defaults it ran with (and those may change between versions); the result
    file records these beside it (root attribute `resolved`), so that the analysis groups and pairs
    runs by the values they ran with."""
    models = {name: asdict(value) for name, value in models.items()}
    return {"algorithm": {"params": asdict(algorithm),
                          "terms": {name: asdict(p) for name, p in terms.items()}},
            "data": {"partition_params": partition},
            "model": {"params": models if len(models) > 1 else next(iter(models.values()))}}
