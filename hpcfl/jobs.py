"""The composition root: a job file read, overridden and checked against everything hpcfl knows
(the registries of algorithms, models, data sets, partitions and loss terms, plug-ins included), before any
rank trains. hpcfl.config parses and checks each key on its own and imports nothing of hpcfl."""
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


def check_registries(job: JobConfig) -> None:
    """Every name resolved in its registry (plug-ins imported, on every rank), every parameter table
    checked against its dataclass, and the algorithm's own rules on the whole job."""
    # Imported here: the registries pull in torch, which reading a job file alone does not need.
    from hpcfl.algorithms import ALGORITHMS, algorithm_params
    from hpcfl.data.datasets import DATASETS
    from hpcfl.data.partition import check_params
    from hpcfl.models import MODELS, model_options
    from hpcfl.terms import term_params
    from hpcfl.training.batched import check_job as check_batched

    named = [("data.dataset", job.data.dataset, DATASETS), ("model.name", job.model.name, MODELS),
             ("algorithm.name", job.algorithm.name, ALGORITHMS)]
    named += [("model.architectures", name, MODELS) for name in job.model.architectures]
    for key, name, registry in named:
        registry.resolve(name, key)             # a plug-in is imported here, on every rank, before set-up
    model_params(job.model.params, {name: model_options(name) for name in job.architectures})
    check_params(job.data.partition, job.data.partition_params)      # resolves data.partition, plug-ins too
    algorithm_params(job.algorithm.name, job.algorithm.params)
    for name, raw in job.algorithm.terms.items():
        term_params(name, raw)
    algorithm = ALGORITHMS[job.algorithm.name]
    algorithm.check(job)
    if job.train.batched_clients:
        check_batched(job, algorithm, sorted(name for name, cls in ALGORITHMS.items() if cls.traits.batched))
    if job.eval.forgetting and not algorithm.traits.global_model:
        raise ConfigError(f"eval.forgetting compares local models with the global model, which algorithm "
                          f"'{job.algorithm.name}' does not have; set eval.forgetting = false")


