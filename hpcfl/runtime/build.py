"""Building a job on every rank: data, partition, placement, models, workers, server, result file.

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

from hpcfl.algorithms import ALGORITHMS
from hpcfl.algorithms.anchored import WithAnchors, wrap
from hpcfl.algorithms.base import Algorithm, Client, Setup, owned
from hpcfl.config import JobConfig
from hpcfl.data.base import Dataset, resolve_data_root, take
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import count_matrix
from hpcfl.data.splits import client_partition, local_test_sets, shared_set, validation_split
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.jobs import Resolved, resolve
from hpcfl.metrics import Recorder
from hpcfl.models import build_model, count_parameters, lay_out
from hpcfl.runtime.forgetting import Forgetting
from hpcfl.runtime.memory import peak_bytes
from hpcfl.runtime.placement import (
    assign_clients,
    client_cost,
    deal_cohort,
    idle_workers,
    memory_format,
    pick_device,
    worker_ranks,
)
from hpcfl.runtime.provenance import run_attributes
from hpcfl.runtime.resume import RunCompleted, restore, resume_point
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
    config: JobConfig
    transport: Transport
    algorithm: Algorithm | WithAnchors    # the algorithm, or it inside FedFM's anchor phase (anchored.wrap)
    worker: Worker | None
    server: Server | None
    recorder: Recorder | None
    cohorts: np.ndarray
    num_classes: int
    client_metrics: tuple[str, ...]       # the report's CLIENT_METRICS this run records
    cost: np.ndarray | None = None        # per-round placement: each client's batches per epoch; None: fixed
    local_test_sizes: np.ndarray | None = None    # each client's own test examples (data.local_test_ratio)
    start_round: int = 0                  # > 0: resumed from a checkpoint taken after this many rounds
    extensions: list = field(default_factory=list)    # evaluations the job turns on (eval.forgetting)

    def hosts(self, cohort: list[int]) -> dict[int, int]:
        """Sampled client -> the rank that trains it this round, the same on every rank."""
        if self.cost is None:
            return {c: self.transport.client_rank[c] for c in cohort}
        return deal_cohort(cohort, self.cost, worker_ranks(self.transport.size))


def setup(config: JobConfig, transport: Transport, data_root: str | None, local_rank: int = 0) -> Job:
    """Build everything on every rank; raise SetupFailed on all ranks if any rank failed."""
    info = {"rank": transport.rank, "host": socket.gethostname(), "error": None}
    start = time.perf_counter()
    try:
        job = _build(config, transport, data_root, local_rank, info)
        info["setup_max_rss_bytes"] = peak_bytes()             # before the rounds reset the high-water mark
        info["setup_s"] = time.perf_counter() - start
    except RunCompleted as done:
        job, info["completed"] = None, str(done)
    except HpcflError as err:
        job, info["error"] = None, f"{type(err).__name__}: {err}"
    reports = transport.share(info)
    if reports[0].get("completed"):
        raise RunCompleted(reports[0]["completed"])
    _raise_failures(job, config, transport, reports)
    if reports[0].get("checkpoint"):
        try:
            info["error"] = None
            restore(job, Path(reports[0]["checkpoint"]), reports[0]["resume"])
        except HpcflError as err:
            info["error"] = f"{type(err).__name__}: {err}"
        _raise_failures(job, config, transport, transport.share(info))
    if job.recorder:
        attrs = run_attributes(config, reports)
        for key, value in attrs.items():
            job.recorder.set_attr(key, value)
    return job


def _raise_failures(job: Job | None, config: JobConfig, transport: Transport, reports: list[dict]) -> None:
    failed = [r["error"] if transport.size == 1 else f"rank {r['rank']} on {r['host']}: {r['error']}"
              for r in reports if r["error"]]
    if failed:
        if job and job.recorder:          # this rank was fine but another was not
            job.recorder.close()
            if not reports[0].get("resume_file"):    # leave no file we created; keep one we resumed
                config.result_path.unlink(missing_ok=True)
        raise SetupFailed("\n".join(failed))


@dataclass
class _Data:
    """The data set split as the job asks, the same on every rank."""
    data: Dataset
    parts: list                   # each client's training rows
    val_parts: list               # each client's held-out validation rows
    counts: np.ndarray            # clients x classes
    local_tests: list | None      # each client's own test rows (data.local_test_ratio)
    shared: np.ndarray | None     # the shared samples some terms train on

    @property
    def local_test_sizes(self) -> np.ndarray | None:
        return None if self.local_tests is None else np.array([len(t) for t in self.local_tests], dtype=np.int64)


def _build(config: JobConfig, transport: Transport, data_root, local_rank, info) -> Job:
    """Set-up on one rank, in steps:
    1. where it runs: the resume point (server), the device, the threads;
    2. the data, split into clients, and each client's home rank;
    3. the models and the algorithm, from the job resolved once (hpcfl.jobs.resolve);
    4. this rank's part: a worker with its clients and trainers, the server with its result file;
    5. the cohorts, the client metrics recorded, the per-round placement's costs."""
    # 1. where
    resume_file, rounds, checkpoint = resume_point(config) if transport.is_server else (False, 0, None)
    info.update(resume_file=resume_file, resume=rounds, checkpoint=str(checkpoint or ""))
    device = pick_device(config.run.device, local_rank)
    torch.set_num_threads(config.run.threads)
    info["device"] = str(device if device.type == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})")
    # 2. the data
    resolved = resolve(config)
    split = _split(config, transport, resolve_data_root(data_root or config.data.root or None))
    transport.client_rank = assign_clients(split.counts.sum(1), worker_ranks(transport.size))   # homes
    # 3. models and algorithm
    models = build_models(config, split.data.input_shape, split.data.num_classes, device, resolved)
    model = models[config.architectures[0]]       # the server's (the global model's architecture)
    setup_ = Setup.of(config, model, split.counts, test_size=int(split.data.test_y.shape[0]), terms=resolved.terms)
    algorithm = wrap(ALGORITHMS[config.algorithm.name](resolved.algorithm, setup_))
    two_views = [t.name for t in algorithm.terms if t.views == 2]
    if two_views and split.data.mean is None:
        raise ConfigError(f"{two_views} augment images into two views, but data set '{split.data.name}' has no "
                          "images; drop the term or pick an image data set")
    if any(t.needs_shared for t in algorithm.terms):
        split.shared = shared_set(split.data.train_y.numpy(), split.data.num_classes, config.data_seed)
    # 4. this rank's part
    moving = algorithm.moves_clients(config)
    worker = (_worker(config, transport, split, models, algorithm, device, moving)
              if transport.rank in worker_ranks(transport.size) else None)
    server, recorder = (_server(config, transport, split, model, algorithm, device, models, moving, resume_file,
                                rounds) if transport.is_server else (None, None))
    # 5. the schedule
    cohorts = cohort_schedule(config.run.seed, config.run.rounds, config.data.num_clients,
                              config.train.clients_per_round)
    cost = client_cost(split.counts.sum(1), config.train.batch_size) if moving else None
    return Job(config, transport, algorithm, worker, server, recorder, cohorts, split.data.num_classes,
               _client_metrics(config, algorithm), cost, local_test_sizes=split.local_test_sizes,
               extensions=[Forgetting()] if config.eval.forgetting else [])


def _split(config: JobConfig, transport: Transport, root) -> _Data:
    """The data set loaded (training images only where a rank trains or validates) and split: the
    partition, each client's validation rows and own test rows."""
    validating = config.data.validation_fraction > 0          # the server then tests on the held-out samples too
    data = load_dataset(config.data.dataset, root,
                        train_images=transport.rank in worker_ranks(transport.size) or validating)
    labels = data.train_y.numpy()
    parts = client_partition(config, labels, data.groups)
    val_parts = [np.zeros(0, dtype=np.int64)] * len(parts)
    if validating:
        parts, val_parts = validation_split(parts, config.data.validation_fraction, config.data_seed)
    counts = count_matrix(labels, parts, data.num_classes)
    local_tests = (local_test_sets(data.test_y.numpy(), counts, config.data.local_test_ratio, config.data_seed)
                   if config.data.local_test_ratio > 0 else None)
    return _Data(data, parts, val_parts, counts, local_tests, None)


def _worker(config: JobConfig, transport: Transport, split: _Data, models: dict, algorithm, device,
            moving: bool) -> Worker:
    """A worker rank's part: the clients it hosts (every client when clients move), on its device, with
    their held-out sets and state, and the local trainers."""
    data, clients = split.data, {}
    tested = algorithm.traits.client_test or config.eval.forgetting
    test_set = _on(device, data.test_x, data.test_y) if tested else None
    shared = _on(device, *data.train_rows(split.shared)) if split.shared is not None else None
    pixels = device.type == "cpu" and data.train_pixels is not None   # uint8 rows, normalised per batch
    normalization = data.pixel_normalization() if pixels else None
    for cid, rank in transport.client_rank.items():
        if not (moving or rank == transport.rank):
            continue
        client = clients[cid] = Client(cid, *_on(device, *data.train_rows(split.parts[cid], normalised=not pixels)),
                                       split.counts[cid], config.architecture(cid), normalization=normalization)
        if len(split.val_parts[cid]):
            client.eval_sets["val"] = _on(device, *data.train_rows(split.val_parts[cid]))
        if split.local_tests is not None:
            rows = split.local_tests[cid]
            client.eval_sets["local_test"] = _on(device, take(data.test_x, rows), take(data.test_y, rows))
        client.test_set, client.shared = test_set, shared
        client.state = owned(algorithm.init_client_state(client, models[client.architecture]),
                             f"{algorithm.name}.init_client_state")
    trainer = LocalTrainer(config.train, config.run.seed, (data.mean, data.std))
    group = group_size(config, ALGORITHMS[config.algorithm.name], models.values(), device)
    batched = BatchedTrainer(trainer, models.values(), group) if group else None
    return Worker(algorithm, clients, models, trainer, device, data.num_classes, config.eval.batch_size,
                  config.train.on_nonfinite == "drop", batched, moving)


def _server(config: JobConfig, transport: Transport, split: _Data, model, algorithm, device, models: dict,
            moving: bool, resume_file: bool, rounds: int) -> tuple[Server, Recorder]:
    """The server rank's part: the global model's evaluation, the result file (created, or reopened
    to resume), and the run's description in the log."""
    data = split.data
    validation = data.train_rows(np.concatenate(split.val_parts)) if config.data.validation_fraction > 0 else None
    server = Server(algorithm, model, data.test_x, data.test_y, config.eval.batch_size, device, validation=validation)
    if resume_file:
        recorder = Recorder.reopen(config.result_path, rounds)
    else:
        recorder = Recorder.create(config.result_path, {"config": json.loads(config.to_json())})
        recorder.write_array("partition", split.counts)
        recorder.write_array("example/test_size", np.int64(data.test_y.shape[0]))
        if split.local_tests is not None:
            recorder.write_array("example/local_test_sizes", split.local_test_sizes)
        if split.shared is not None:
            recorder.write_array("shared_samples", split.shared)
    _announce(config, transport, split, models, moving)
    return server, recorder


def _announce(config: JobConfig, transport: Transport, split: _Data, models: dict, moving: bool) -> None:
    """The run in one log line, and a warning for ranks that would host no client."""
    sizes, workers = split.counts.sum(1), worker_ranks(transport.size)
    LOG.info(f"{config.algorithm.name} on {config.data.dataset} ({config.data.partition} "
             f"{config.data.partition_params}), {len(sizes)} clients (samples min/median/max "
             f"{sizes.min()}/{int(np.median(sizes))}/{sizes.max()}), {config.train.clients_per_round} per round, "
             f"model {' / '.join(f'{a} ({count_parameters(m):,} parameters)' for a, m in models.items())}, "
             f"{transport.size} rank(s); results -> {config.result_path}")
    idle = idle_workers(workers, transport.client_rank, config.train.clients_per_round, moving)
    if idle and transport.size > 1:
        most = len(workers) - len(idle)
        LOG.warning(f"rank(s) {', '.join(map(str, idle))} will host no client in any round ({len(workers)} "
                    f"workers for {len(sizes)} clients, {config.train.clients_per_round} per round) and only "
                    f"wait: launch with at most {most + 1} ranks (mpirun -np {most + 1})")


def _client_metrics(config: JobConfig, algorithm) -> tuple[str, ...]:
    """The report's CLIENT_METRICS this run records."""
    measured = {"train_loss": True, "steps": True, "val_acc": config.data.validation_fraction > 0,
                "local_test_acc": config.data.local_test_ratio > 0, "local_test_loss": config.data.local_test_ratio > 0,
                "test_acc": algorithm.traits.client_test, "nonfinite": True}
    return tuple(k for k, on in measured.items() if on)


def _on(device, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.to(device), y.to(device)


def build_models(config: JobConfig, in_shape, num_classes: int, device, resolved: Resolved | None = None) -> dict:
    """One model instance per architecture, each initialised from the run's "init" seed; on a
    heterogeneous run their feature widths must agree, since the clients share a classifier. The
    job's local terms (a preset's own included: `resolved.adapting`) then add their layers (MOON's
    projection head), and the convolutions' weights take run.memory_format."""
    resolved = resolved or resolve(config)
    models = {}
    for name in config.architectures:
        torch.manual_seed(torch_seed(config.run.seed, "init"))
        models[name] = build_model(name, in_shape, num_classes, resolved.models[name]).to(device)
        adapt_model(models[name], resolved.adapting, config.run.seed)
        lay_out(models[name], memory_format(config.run.memory_format, device))
    widths = {name: m.classifier.in_features for name, m in models.items() if hasattr(m, "classifier")}
    if len(models) > 1 and len(set(widths.values())) != 1:
        raise ConfigError(f"model.architectures have features of different widths {widths}: heterogeneous clients "
                          "share one classifier, so pick architectures with the same width (FedClassAvg: 512)")
    return models
