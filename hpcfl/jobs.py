"""The composition root: a job file read, overridden and checked against everything hpcfl knows
(the registries of algorithms, models, data sets, partitions and loss terms, plug-ins included), before any
rank trains. hpcfl.config parses and checks each key on its own and imports nothing of hpcfl."""
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hpcfl.config import JobConfig, apply_overrides, parse_job, read_job_file
from hpcfl.errors import ConfigError
from hpcfl.params import model_params


def load_job(path: str | Path, overrides: list[str] = (), allow_sweep: bool = False) -> JobConfig:
    """Read, override and validate a job file; raises ConfigError naming the key and the fix. A
    [sweep] table is for hpcfl.sweep, which runs one of its points (`allow_sweep`)."""
    raw = read_job_file(path)
    if "sweep" in raw and not allow_sweep:
        raise ConfigError(f"job file {path} defines a [sweep]: run one of its points with `hpcfl sweep "
                          f"{path} --index I` (`--list` shows them)")
    raw.pop("sweep", None)
    return job_from_dict(apply_overrides(raw, list(overrides)))


def job_from_dict(raw: dict) -> JobConfig:
    """A job from its tables (as a TOML file would give them), checked whole."""
    job = parse_job(raw)
    check_registries(job)
    return job


@dataclass(frozen=True)
class Resolved:
    """A job's parameter tables as its run uses them, each its dataclass with the job's values over the
    defaults: checked once (`check_registries`) and built from by set-up (hpcfl.runtime.build)."""
    algorithm: object           # the algorithm's Params
    terms: dict                 # algorithm.terms: name -> the term's Params
    adapting: dict              # the terms that shape the model (MOON's head): algorithm.terms and a preset's own
    models: dict                # architecture -> its model options
    partition: dict             # data.partition_params with the scheme's defaults


def resolve(job: JobConfig) -> Resolved:
    """The job's parameter tables resolved (plug-ins imported), naming a bad key; checked in this order:
    models, partition, algorithm, terms."""
    from hpcfl.algorithms import ALGORITHMS, algorithm_params
    from hpcfl.data.partition import check_params
    from hpcfl.models import model_options
    from hpcfl.terms import term_params

    models = model_params(job.model.params, {name: model_options(name) for name in job.architectures})
    partition = check_params(job.data.partition, job.data.partition_params)
    algorithm = algorithm_params(job.algorithm.name, job.algorithm.params)
    terms = {name: term_params(name, raw) for name, raw in job.algorithm.terms.items()}
    preset = ALGORITHMS[job.algorithm.name].term            # FedProx's prox, from its algorithm.params
    own = {f.name: getattr(algorithm, f.name) for f in fields(preset.Params)} if preset else {}
    adapting = {**terms, **({preset.name: preset.Params(**own)} if preset else {})}
    return Resolved(algorithm, terms, adapting, models, partition)


def resolved_params(job: JobConfig) -> dict:
    """Every parameter table as the run uses it (`resolve`), in the job file's own form: {"algorithm":
    {"params", "terms"}, "model": {"params"}, "data": {"partition_params"}}, model params flat for one
    architecture, a table per architecture for several. A job records only what it wrote, which says
    nothing of the defaults it ran with (and those may change between versions); the result file
    records these beside it (root attribute `resolved`), so that the analysis groups and pairs runs by
    the values they ran with."""
    resolved = resolve(job)
    models = {name: asdict(value) for name, value in resolved.models.items()}
    return {"algorithm": {"params": asdict(resolved.algorithm),
                          "terms": {name: asdict(p) for name, p in resolved.terms.items()}},
            "data": {"partition_params": resolved.partition},
            "model": {"params": models if len(models) > 1 else next(iter(models.values()))}}


def check_registries(job: JobConfig) -> None:
    """Every name resolved in its registry (plug-ins imported, on every rank), every parameter table
    checked against its dataclass, and the algorithm's own rules on the whole job."""
    # Imported here: the registries pull in torch, which reading a job file alone does not need.
    from hpcfl.algorithms import ALGORITHMS
    from hpcfl.data.datasets import DATASETS
    from hpcfl.models import MODELS
    from hpcfl.training.batched import check_job as check_batched

    named = [("data.dataset", job.data.dataset, DATASETS), ("model.name", job.model.name, MODELS),
             ("algorithm.name", job.algorithm.name, ALGORITHMS)]
    named += [("model.architectures", name, MODELS) for name in job.model.architectures]
    for key, name, registry in named:
        registry.resolve(name, key)             # a plug-in is imported here, on every rank, before set-up
    resolve(job)
    algorithm = ALGORITHMS[job.algorithm.name]
    algorithm.check(job)
    if job.train.batched_clients != "auto" and job.train.batched_clients:      # asked for: refused if it cannot
        check_batched(job, algorithm, sorted(name for name, cls in ALGORITHMS.items() if cls.traits.batched))
    if job.eval.forgetting and not algorithm.traits.global_model:
        raise ConfigError(f"eval.forgetting compares local models with the global model, which algorithm "
                          f"'{job.algorithm.name}' does not have; set eval.forgetting = false")


