"""Building a job on every rank from the job resolved once (hpcfl.jobs.Resolved): the data and its
split, the placement, the models and the algorithm, the workers, the server and its result file.

Set-up ends with a collective check, so a bad input stops every rank with one clear message before
anyone trains. The cohort schedule is drawn up front from its own generator, so every rank knows
every round's cohort without communication; in the rounds (hpcfl.runtime.loop) the only messages
are the declared payloads and one small per-round report (hpcfl.runtime.report).
"""
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hpcfl.algorithms.anchored import WithAnchors, wrap
from hpcfl.algorithms.base import Algorithm, Client, Setup, owned
from hpcfl.config import JobConfig
from hpcfl.data.base import take
from hpcfl.data.splits import ClientData, shared_set, split_data
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.jobs import Resolved, resolve
from hpcfl.metrics import Recorder, read_run
from hpcfl.models import build_model, count_parameters, lay_out
from hpcfl.runtime.forgetting import Forgetting
from hpcfl.runtime.memory import peak_bytes
from hpcfl.runtime.placement import Placement, memory_format, place, worker_ranks
from hpcfl.runtime.provenance import run_attributes
from hpcfl.runtime.resume import RunCompleted, restore, resume_point, same_split
from hpcfl.runtime.server import Server
from hpcfl.runtime.worker import Worker
from hpcfl.seeding import cohort_schedule, torch_seed
from hpcfl.terms import adapt_model
from hpcfl.training import LocalTrainer
from hpcfl.training.batched import BatchedTrainer, group_size
from hpcfl.transport import Transport

LOG = logging.getLogger(__name__)


class SetupFailed(HpcflError):
    """Some rank could not set up; carries every failed rank's message."""


@dataclass
class Job:
    """A job built on one rank: what the round loop (hpcfl.runtime.loop) runs."""
    config: JobConfig
    transport: Transport
    # the algorithm, or it inside FedFM's anchor phase (anchored.wrap)
    algorithm: Algorithm | WithAnchors
    worker: Worker | None
    server: Server | None
    recorder: Recorder | None
    cohorts: np.ndarray
    num_classes: int
    client_metrics: tuple[str, ...]       # the report's CLIENT_METRICS this run records
    placement: Placement
    # each client's own test examples (data.local_test_ratio)
    local_test_sizes: np.ndarray | None = None
    # > 0: resumed from a checkpoint taken after this many rounds
    start_round: int = 0
    # evaluations the job turns on (eval.forgetting)
    extensions: list = field(default_factory=list)


def setup(job: Resolved, transport: Transport, data_root: str | None, local_rank: int = 0) -> Job:
    """Build everything on every rank from the job resolved (hpcfl.jobs.prepare); raise SetupFailed
    on all ranks if any rank failed."""
    info = {"rank": transport.rank, "host": socket.gethostname(), "error": None}
    start = time.perf_counter()
    try:
        built = _build(job, transport, data_root, local_rank, info)
        info["setup_max_rss_bytes"] = peak_bytes()    # before the rounds reset the high-water mark
        info["setup_s"] = time.perf_counter() - start
    except RunCompleted as done:
        built, info["completed"] = None, str(done)
    except HpcflError as err:
        built, info["error"] = None, f"{type(err).__name__}: {err}"
    reports = transport.share(info)
    if reports[0].get("completed"):
        raise RunCompleted(reports[0]["completed"])
    _raise_failures(built, job, transport, reports)
    if reports[0].get("checkpoint"):
        try:
            info["error"] = None
            restore(built, Path(reports[0]["checkpoint"]), reports[0]["resume"])
        except HpcflError as err:
            info["error"] = f"{type(err).__name__}: {err}"
        _raise_failures(built, job, transport, transport.share(info))
    earlier = None
    if built.server and reports[0].get("resume_file"):     # cut back to the checkpoint once every rank is ready
        earlier = read_run(job.config.result_path, keys=()).attrs
        built.recorder = Recorder.reopen(job.config.result_path, reports[0]["resume"])
    if built.recorder:
        for key, value in run_attributes(job, reports, earlier, reports[0].get("resume", 0)).items():
            built.recorder.set_attr(key, value)
    return built


def refuse(transport: Transport, err: HpcflError) -> None:
    """A rank that could not read its job (hpcfl.jobs.prepare) takes its part in set-up's one
    collective check (`setup`) with its error, so the ranks that could stop with it, all raising
    SetupFailed, instead of waiting for it."""
    info = {"rank": transport.rank, "host": socket.gethostname(), "error": f"{type(err).__name__}: {err}"}
    _raise_failures(None, None, transport, transport.share(info))


def _raise_failures(built: Job | None, job: Resolved | None, transport: Transport,
                    reports: list[dict]) -> None:
    alike = {}                            # one line per error, naming every rank that gave it
    for report in reports:
        if report["error"]:
            alike.setdefault(report["error"], []).append(report)
    failed = [error if transport.size == 1 else f"{_ranks(ranks)}: {error}" for error, ranks in alike.items()]
    if failed:
        if built and built.recorder:      # this rank was fine but another was not
            built.recorder.close()
            if not reports[0].get("resume_file"):    # leave no file we created; keep one we resumed
                job.config.result_path.unlink(missing_ok=True)
        raise SetupFailed("\n".join(failed))


def _ranks(reports: list[dict]) -> str:
    """'rank 2 on node7', 'ranks 1, 2 on node7' or 'ranks 1 (node7), 2 (node8)'."""
    hosts = {r["host"] for r in reports}
    if len(hosts) == 1:
        return f"rank{'s' * (len(reports) > 1)} {', '.join(str(r['rank']) for r in reports)} on {hosts.pop()}"
    return "ranks " + ", ".join(f"{r['rank']} ({r['host']})" for r in reports)


def _build(job: Resolved, transport: Transport, data_root, local_rank, info) -> Job:
    """Set-up on one rank, in steps:
    1. the resume point (the server: before anything is built);
    2. the data, split into clients;
    3. the placement: this rank's device and threads, each client's home rank;
    4. the models and the algorithm;
    5. this rank's part: a worker with its clients and trainers, the server with its result file;
    6. the cohorts."""
    config = job.config
    # 1. the resume point
    resume_file, rounds, checkpoint = resume_point(job, transport.size) if transport.is_server else (False, 0, None)
    info.update(resume_file=resume_file, resume=rounds, checkpoint=str(checkpoint or ""))
    # 2. the data
    split = split_data(config, data_root,
                       train_images=transport.rank in worker_ranks(transport.size))
    # 3. the placement
    placement = place(config, transport.size, local_rank, split.counts.sum(1), job.moving)
    transport.client_rank = placement.homes
    torch.set_num_threads(config.run.threads)
    device = placement.device
    info["device"] = str(device if device.type == "cpu"
                         else f"{device} ({torch.cuda.get_device_name(device)})")
    # 4. the models and the algorithm
    models = build_models(config, split.data.input_shape, split.data.num_classes, device, job,
                          placement.memory_format)
    model = models[job.client_architectures[0]]   # the server's (the global model's architecture)
    algorithm = _algorithm(job, model, split)
    # 5. this rank's part
    worker = (_worker(job, transport, split, models, algorithm, device)
              if transport.rank in placement.workers else None)
    server, recorder = (_server(job, transport, split, model, algorithm, device, models, placement,
                                resume_file) if transport.is_server else (None, None))
    # 6. the cohorts
    cohorts = cohort_schedule(config.run.seed, config.run.rounds, config.data.num_clients,
                              config.train.clients_per_round)
    return Job(config, transport, algorithm, worker, server, recorder, cohorts,
               split.data.num_classes, _client_metrics(config, algorithm), placement,
               local_test_sizes=split.local_test_sizes,
               extensions=[Forgetting()] if config.eval.forgetting else [])


def _algorithm(job: Resolved, model, split: ClientData) -> Algorithm | WithAnchors:
    """The algorithm, in FedFM's anchor phase where its job matches features (anchored.wrap), and
    what its terms need of the data: images for two views, the shared set S (added to `split`)."""
    data = split.data
    setup = Setup.of(job.config, model, split.counts, test_size=int(data.test_y.shape[0]),
                     terms=job.terms)
    algorithm = wrap(job.algorithm_class(job.algorithm, setup))
    two_views = [t.name for t in algorithm.terms if t.views == 2]
    if two_views and data.mean is None:
        raise ConfigError(f"{two_views} augment images into two views, but data set '{data.name}' "
                          "has no images; drop the term or pick an image data set")
    if job.config.train.augment != "none" and len(data.input_shape) != 3:
        raise ConfigError(f"train.augment = '{job.config.train.augment}' crops and flips images, but data set "
                          f"'{data.name}' holds sequences; set train.augment = 'none'")
    if any(t.needs_shared for t in algorithm.terms):
        split.shared = shared_set(data.train_y.numpy(), data.num_classes, job.config.data_seed,
                                  np.concatenate(split.val_parts))
    return algorithm


def _worker(job: Resolved, transport: Transport, split: ClientData, models: dict, algorithm,
            device) -> Worker:
    """A worker rank's part: the clients it hosts (every client when clients move), on its device,
    with their held-out sets and state, and the local trainers."""
    config, data, clients = job.config, split.data, {}
    tested = algorithm.traits.client_test or config.eval.forgetting
    test_set = _on(device, data.test_x, data.test_y) if tested else None
    shared = _on(device, *data.train_rows(split.shared)) if split.shared is not None else None
    # uint8 rows, normalised per batch
    pixels = device.type == "cpu" and data.train_pixels is not None
    normalization = data.pixel_normalization() if pixels else None
    for cid, rank in transport.client_rank.items():
        if not (job.moving or rank == transport.rank):
            continue
        client = clients[cid] = Client(
            cid, *_on(device, *data.train_rows(split.parts[cid], normalised=not pixels)),
            split.counts[cid], job.client_architectures[cid], normalization=normalization)
        if len(split.val_parts[cid]):
            client.eval_sets["val"] = _on(device, *data.train_rows(split.val_parts[cid]))
        if split.local_tests is not None:
            rows = split.local_tests[cid]
            client.eval_sets["local_test"] = _on(device, take(data.test_x, rows),
                                                 take(data.test_y, rows))
        client.test_set, client.shared = test_set, shared
        client.state = owned(algorithm.init_client_state(client, models[client.architecture]),
                             f"{algorithm.name}.init_client_state")
    trainer = LocalTrainer(config.train, config.run.seed, (data.mean, data.std))
    group = group_size(config, job.algorithm_class, models.values(), device)
    batched = BatchedTrainer(trainer, models.values(), group) if group else None
    return Worker(algorithm, clients, models, trainer, device, data.num_classes,
                  config.eval.batch_size, config.train.on_nonfinite == "drop", batched, job.moving)


def _server(job: Resolved, transport: Transport, split: ClientData, model, algorithm, device,
            models: dict, placement: Placement, resume_file: bool) -> tuple[Server, Recorder | None]:
    """The server rank's part: the global model's evaluation, the result file (created; a resumed
    run's is reopened at the end of set-up), and the run's description in the log."""
    config, data = job.config, split.data
    validation = (data.train_rows(np.concatenate(split.val_parts))
                  if config.data.validation_fraction > 0 else None)
    server = Server(algorithm, model, data.test_x, data.test_y, config.eval.batch_size, device,
                    validation=validation)
    recorder = None                 # a resumed run's file is reopened once every rank is set up (`setup`)
    if resume_file:
        same_split(job.config.result_path, split.counts)
    else:
        arrays = {"partition": split.counts, "example/test_size": np.int64(data.test_y.shape[0]),
                  "example/local_test_sizes": split.local_test_sizes,
                  "shared_samples": split.shared}
        recorder = Recorder.create(job.config.result_path, {"config": json.loads(config.to_json())},
                                   {name: value for name, value in arrays.items()
                                    if value is not None})
    _announce(job, transport, split, models, placement)
    return server, recorder


def _announce(job: Resolved, transport: Transport, split: ClientData, models: dict,
              placement: Placement) -> None:
    """The run in one log line, and a warning for ranks that would host no client."""
    config, sizes, workers = job.config, split.counts.sum(1), placement.workers
    described = " / ".join(f"{a} ({count_parameters(m):,} parameters)" for a, m in models.items())
    LOG.info(f"{config.algorithm.name} on {config.data.dataset} ({config.data.partition} "
             f"{config.data.partition_params}), {len(sizes)} clients (samples min/median/max "
             f"{sizes.min()}/{int(np.median(sizes))}/{sizes.max()}), "
             f"{config.train.clients_per_round} per round, model {described}, "
             f"{transport.size} rank(s); results -> {job.config.result_path}")
    if placement.idle and transport.size > 1:
        most = len(workers) - len(placement.idle)
        LOG.warning(f"rank(s) {', '.join(map(str, placement.idle))} will host no client in any "
                    f"round ({len(workers)} workers for {len(sizes)} clients, "
                    f"{config.train.clients_per_round} per round) and only "
                    f"wait: launch with at most {most + 1} ranks (mpirun -np {most + 1})")


def _client_metrics(config: JobConfig, algorithm) -> tuple[str, ...]:
    """The report's CLIENT_METRICS this run records."""
    measured = {"train_loss": True, "steps": True, "val_acc": config.data.validation_fraction > 0,
                "local_test_acc": config.data.local_test_ratio > 0,
                "local_test_loss": config.data.local_test_ratio > 0,
                "test_acc": algorithm.traits.client_test, "nonfinite": True}
    return tuple(k for k, on in measured.items() if on)


def _on(device, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.to(device), y.to(device)


def build_models(config: JobConfig, in_shape, num_classes: int, device,
                 resolved: Resolved | None = None,
                 layout: torch.memory_format | None = None) -> dict:
    """One model instance per architecture, each initialised from the run's "init" seed; on a
    heterogeneous run their feature widths must agree, since the clients share a classifier. The
    job's local terms (a preset's own included: `resolved.adapting`) then add their layers (MOON's
    projection head), and the convolutions' weights take `layout` (default: run.memory_format's)."""
    resolved = resolved or resolve(config)
    layout = layout or memory_format(config.run.memory_format, device)
    models = {}
    for name in config.architectures:
        torch.manual_seed(torch_seed(config.run.seed, "init"))
        models[name] = build_model(name, in_shape, num_classes, resolved.models[name]).to(device)
        adapt_model(models[name], resolved.adapting, config.run.seed)
        lay_out(models[name], layout)
    if config.train.batch_size == 1 and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                            for model in models.values() for m in model.modules()):
        raise ConfigError("train.batch_size = 1, but the model has BatchNorm layers, which cannot train on one "
                          "sample (every batch would be skipped): use train.batch_size >= 2, or a model "
                          "without BatchNorm")
    widths = {name: m.classifier.in_features for name, m in models.items()}
    if len(models) > 1 and len(set(widths.values())) != 1:
        raise ConfigError(f"model.architectures have features of different widths {widths}: "
                          "heterogeneous clients share one classifier, so pick architectures with "
                          "the same width (FedClassAvg: 512)")
    return models
