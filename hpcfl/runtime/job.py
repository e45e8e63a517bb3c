"""One job on one transport: set-up on every rank, then the round loop.

Set-up (data, partition, placement, models, result file) runs on every rank and ends with a
collective check, so a bad input stops every rank with one clear message before anyone trains.
The cohort schedule is drawn up front from its own generator, so every rank knows every round's
cohort without communication; the only messages are the declared payloads and one small
per-round report (client metrics and per-rank timings, summed onto the server).
"""
import json
import socket
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.anchored import wrap
from hpcfl.algorithms.base import MATCHED, Client, Setup
from hpcfl.batched import BatchedTrainer
from hpcfl.config import JobConfig, model_params
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import count_matrix, partition
from hpcfl.data.splits import local_test_sets, shared_set, training_subset, validation_split
from hpcfl.errors import ConfigError, HpcflError, TrainingFault
from hpcfl.metrics import Recorder
from hpcfl.models import build_model, count_parameters, model_options
from hpcfl.regularizers import adapt_model
from hpcfl.runtime.memory import peak_bytes, reset_peak
from hpcfl.runtime.placement import assign_clients, client_cost, deal_cohort, pick_device, worker_ranks
from hpcfl.runtime.provenance import run_attributes
from hpcfl.runtime.resume import RunCompleted, control, restore, resume_point, write_checkpoint
from hpcfl.runtime.server import Server
from hpcfl.runtime.worker import Worker
from hpcfl.seeding import cohort_schedule, torch_seed
from hpcfl.training import LocalTrainer
from hpcfl.transport import Transport

CLIENT_METRICS = ("train_loss", "steps", "val_acc", "local_test_acc", "test_acc", "nonfinite", "num_samples")
RANK_METRICS = ("compute_s", "wait_s", "wire_sent_bytes", "wire_received_bytes", "client_state_bytes",
                "max_rss_bytes")


class SetupFailed(HpcflError):
    """Some rank could not set up; carries every failed rank's message."""


@dataclass
class Job:
    config: JobConfig
    transport: Transport
    algorithm: object
    worker: Worker | None
    server: Server | None
    recorder: Recorder | None
    cohorts: np.ndarray
    num_classes: int
    client_metrics: tuple[str, ...]       # the CLIENT_METRICS this run records
    cost: np.ndarray | None = None        # per-round placement: each client's batches per epoch; None: fixed
    start_round: int = 0                  # > 0: resumed from a checkpoint taken after this many rounds

    def hosts(self, cohort: list[int]) -> dict[int, int]:
        """Sampled client -> the rank that trains it this round, the same on every rank."""
        if self.cost is None:
            return {c: self.transport.client_rank[c] for c in cohort}
        return deal_cohort(cohort, self.cost, worker_ranks(self.transport.size))


def setup(config: JobConfig, transport: Transport, data_root: str | None, local_rank: int = 0,
          log=print) -> Job:
    """Build everything on every rank; raise SetupFailed on all ranks if any rank failed."""
    info = {"rank": transport.rank, "host": socket.gethostname(), "error": None}
    try:
        job = _build(config, transport, data_root, local_rank, info, log)
        info["setup_max_rss_bytes"] = peak_bytes()             # before the rounds reset the high-water mark
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
            restore(job, Path(reports[0]["checkpoint"]), reports[0]["resume"], log)
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


def _build(config: JobConfig, transport: Transport, data_root, local_rank, info, log) -> Job:
    resume_file, rounds, checkpoint = resume_point(config, log) if transport.is_server else (False, 0, None)
    info.update(resume_file=resume_file, resume=rounds, checkpoint=str(checkpoint or ""))
    device = pick_device(config.run.device, local_rank, log)
    torch.set_num_threads(config.run.threads)
    info["device"] = str(device if device.type == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})")
    root = resolve_data_root(data_root or config.data.root or None)
    workers = worker_ranks(transport.size)
    validating = config.data.validation_fraction > 0          # the server then tests on the held-out samples too
    data = load_dataset(config.data.dataset, root, train_images=transport.rank in workers or validating)
    labels = data.train_y.numpy()
    pool = np.arange(len(labels))           # the samples the clients share out: all, or a class-stratified subset
    if config.data.train_samples:
        pool = training_subset(labels, config.data.train_samples, config.data_seed)
    parts = [pool[p] for p in partition(labels[pool], config.data.num_clients, config.data.partition,
                                        config.data.partition_params, config.data_seed, config.data.min_samples,
                                        None if data.groups is None else np.asarray(data.groups)[pool])]
    val_parts = [np.zeros(0, dtype=np.int64)] * len(parts)
    if config.data.validation_fraction > 0:
        parts, val_parts = validation_split(parts, config.data.validation_fraction, config.data_seed)
    counts = count_matrix(labels, parts, data.num_classes)
    local_tests = (local_test_sets(data.test_y.numpy(), counts, config.data.local_test_ratio, config.data_seed)
                   if config.data.local_test_ratio > 0 else None)
    transport.client_rank = assign_clients(counts.sum(1), workers)    # each client's home; it trains there if fixed

    models = build_models(config, data.input_shape, data.num_classes, device)
    model = models[config.architectures[0]]       # the server's (the global model's architecture)
    setup_ = Setup.of(config, model, counts, test_size=int(data.test_y.shape[0]))
    algorithm = wrap(ALGORITHMS[config.algorithm.name](algorithm_params(config.algorithm.name, config.algorithm.params),
                                                       setup_))
    two_views = [t.name for t in algorithm.regularizers if t.views == 2]
    if two_views and data.mean is None:
        raise ConfigError(f"{two_views} augment images into two views, but data set '{data.name}' has no images; "
                          "drop the term or pick an image data set")
    shared = (shared_set(labels, data.num_classes, config.data_seed)
              if any(t.needs_shared for t in algorithm.regularizers) else None)
    moving = algorithm.moves_clients(config)
    worker = server = recorder = None
    if transport.rank in workers:
        clients = {}
        if algorithm.client_test or config.eval.forgetting:
            test_x, test_y = data.test_x.to(device), data.test_y.to(device)
        if shared is not None:
            shared_xy = _rows(data.train_x, data.train_y, shared, device)
        for cid, rank in transport.client_rank.items():
            if moving or rank == transport.rank:
                clients[cid] = Client(cid, *_rows(data.train_x, data.train_y, parts[cid], device), counts[cid],
                                      config.architecture(cid))
                if len(val_parts[cid]):
                    clients[cid].eval_sets["val"] = _rows(data.train_x, data.train_y, val_parts[cid], device)
                if local_tests is not None:
                    clients[cid].eval_sets["local_test"] = _rows(data.test_x, data.test_y, local_tests[cid], device)
                if algorithm.client_test or config.eval.forgetting:
                    clients[cid].test_set = test_x, test_y
                if shared is not None:
                    clients[cid].shared = shared_xy
                clients[cid].state = algorithm.init_client_state(clients[cid], models[clients[cid].architecture])
        trainer = LocalTrainer(config.train, config.run.seed, (data.mean, data.std))
        batched = BatchedTrainer(trainer, model, config.train.batched_clients) if config.train.batched_clients else None
        worker = Worker(algorithm, clients, models, trainer, device, data.num_classes, config.eval.batch_size,
                        config.train.on_nonfinite == "drop", batched, moving)
    if transport.is_server:
        server = Server(algorithm, model, data.test_x, data.test_y, config.eval.batch_size, device,
                        validation=_rows(data.train_x, data.train_y, np.concatenate(val_parts), "cpu")
                        if validating else None)
        if resume_file:
            recorder = Recorder.reopen(config.result_path, rounds)
        else:
            recorder = Recorder.create(config.result_path, {"config": json.loads(config.to_json())})
            recorder.write_array("partition", counts)
            if shared is not None:
                recorder.write_array("shared_samples", shared)
        sizes = counts.sum(1)
        log(f"hpcfl: {config.algorithm.name} on {config.data.dataset} ({config.data.partition} "
            f"{config.data.partition_params}), {len(parts)} clients (samples min/median/max "
            f"{sizes.min()}/{int(np.median(sizes))}/{sizes.max()}), {config.train.clients_per_round} per round, "
            f"model {' / '.join(f'{a} ({count_parameters(m):,} parameters)' for a, m in models.items())}, "
            f"{transport.size} rank(s); "
            f"results -> {config.result_path}")
    cohorts = cohort_schedule(config.run.seed, config.run.rounds, config.data.num_clients,
                              config.train.clients_per_round)
    measured = {"train_loss": True, "steps": True, "val_acc": config.data.validation_fraction > 0,
                "local_test_acc": config.data.local_test_ratio > 0, "test_acc": algorithm.client_test,
                "nonfinite": True}
    cost = client_cost(counts.sum(1), config.train.batch_size) if moving else None
    return Job(config, transport, algorithm, worker, server, recorder, cohorts, data.num_classes,
               tuple(k for k, on in measured.items() if on), cost)


def _rows(x: torch.Tensor, y: torch.Tensor, index: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples `index` of (x, y) on `device` (index_select: 4x faster than x[index] on the CPU)."""
    index = torch.from_numpy(np.asarray(index, dtype=np.int64))
    return x.index_select(0, index).to(device), y.index_select(0, index).to(device)


def build_models(config: JobConfig, in_shape, num_classes: int, device) -> dict:
    """One model instance per architecture, each initialised from the run's "init" seed; on a
    heterogeneous run their feature widths must agree, since the clients share a classifier. The
    job's local terms (a preset's own included) then add their layers (MOON's projection head)."""
    models = {}
    preset = getattr(ALGORITHMS[config.algorithm.name], "term", None)
    own = {f.name for f in fields(preset.Params)} if preset else set()       # the term's keys (not init, model_every)
    terms = {**config.algorithm.regularizers,
             **({preset.name: {k: v for k, v in config.algorithm.params.items() if k in own}} if preset else {})}
    options = model_params(config.model.params, {name: model_options(name) for name in config.architectures})
    for name in config.architectures:
        torch.manual_seed(torch_seed(config.run.seed, "init"))
        models[name] = build_model(name, in_shape, num_classes, options[name]).to(device)
        adapt_model(models[name], terms, config.run.seed)
    widths = {name: m.classifier.in_features for name, m in models.items() if hasattr(m, "classifier")}
    if len(models) > 1 and len(set(widths.values())) != 1:
        raise ConfigError(f"model.architectures have features of different widths {widths}: heterogeneous clients "
                          "share one classifier, so pick architectures with the same width (FedClassAvg: 512)")
    return models


def run(job: Job, log=print) -> bool:
    """The round loop, identical on every rank. Returns False if it stopped at a checkpoint because a
    rank was signalled (run the job again to resume), True once every round is done."""
    cfg, transport = job.config, job.transport
    evaluation, start_acc = {}, None
    for round in range(job.start_round, cfg.run.rounds):
        start = time.perf_counter()
        transport.round = round
        reset_peak()
        cohort = [int(c) for c in job.cohorts[round]]
        hosts = job.hosts(cohort)
        hosted = sorted(c for c in cohort if hosts[c] == transport.rank) if job.worker else []
        rows = np.zeros((cfg.data.num_clients, len(CLIENT_METRICS)))
        class_rows = np.zeros((cfg.data.num_clients, job.num_classes)) if cfg.eval.forgetting else None
        if cfg.eval.forgetting and job.server:        # the model this round starts from, tested once
            tested = evaluation.get("class/test_acc")          # the last round's evaluation, if it had one
            start_acc = tested if tested is not None else job.server.evaluate()["class_acc"]
        phase_s, bytes_down, bytes_up, bytes_exchange = {}, {}, {}, {}
        for phase in job.algorithm.plan(round):
            phase_start = time.perf_counter()
            downlink, replies = _match(job, phase, round, cohort, hosted, bytes_up, bytes_down) if phase.gather else ({}, None)
            packed = job.server.downlink(phase, round) if job.server else {}
            for name, layout in phase.downlink.items():
                buf = transport.broadcast(name, packed.get(name))
                downlink[name] = layout.unpack(torch.from_numpy(buf).to(_device(job)))
                bytes_down[name] = bytes_down.get(name, 0) + 4 * layout.numel * len(cohort)
            if phase.exchange is not None:
                if job.worker:
                    job.worker.exchange(phase, round, hosted, downlink, transport)
                moved = len(job.algorithm.exchange_sources(round))
                bytes_exchange[phase.name] = bytes_exchange.get(phase.name, 0) + 4 * phase.exchange.numel * moved
            sums = (job.worker.run_phase(phase, round, hosted, downlink, rows, CLIENT_METRICS, class_rows, replies)
                    if job.worker and phase.exchange is None
                    else {name: np.zeros(layout.numel) for name, layout in phase.uplink.items()})
            reduced = {name: transport.reduce_sum(name, sums[name]) for name in phase.uplink}
            for name, layout in phase.uplink.items():
                bytes_up[name] = bytes_up.get(name, 0) + 4 * layout.numel * len(cohort)
            if job.server and phase.uplink:
                job.server.aggregate(phase, round, reduced)
            phase_s[phase.name] = phase_s.get(phase.name, 0.0) + time.perf_counter() - phase_start
        evaluation = _evaluate(job, round)
        if job.server:
            evaluation.update({f"round/{k}": v for k, v in job.algorithm.server_metrics(job.server.state).items()})
        report = _report(job, rows if class_rows is None else np.concatenate([rows, class_rows], axis=1), hosted)
        if job.server:
            if start_acc is not None:
                evaluation.update(_forgetting(job, cohort, report, start_acc))
            _record(job, round, hosts, report, evaluation, phase_s, {"down": bytes_down, "up": bytes_up,
                                                                      "exchange": bytes_exchange},
                    time.perf_counter() - start, log)
        faulty = _nonfinite(job, round, cohort, report, log) if job.server else []
        save, stop, fault = control(job, round, bool(faulty) and cfg.train.on_nonfinite == "stop")
        if fault:
            raise TrainingFault(f"round {round + 1}: client(s) {faulty} gave a non-finite (NaN/Inf) loss or update, "
                                "so the run stopped after recording the round (train.on_nonfinite = 'stop'). Fix: "
                                "lower train.lr, or set train.on_nonfinite = 'drop' to leave such updates out and go on")
        if save:
            write_checkpoint(job, round + 1, log)
        if stop:
            return False
    if job.server and job.algorithm.global_model and cfg.eval.feature_quality:      # FedFM Table IV
        quality = job.server.feature_quality(cfg.run.seed)
        for key, value in quality.items():
            job.recorder.write_array(f"final/{key}", np.float64(value))
        log(f"hpcfl: final global model's test features: NMI {quality['feature_nmi']:.4f}, "
            f"silhouette {quality['feature_silhouette']:.4f}")
    return True


def _nonfinite(job: Job, round: int, cohort: list[int], report: np.ndarray, log) -> list[int]:
    """The sampled clients whose loss or update went NaN/Inf this round (their updates were left out)."""
    rows = _split_report(job, report)[0]
    faulty = [c for c in cohort if rows[c, CLIENT_METRICS.index("nonfinite")] > 0]
    if faulty and job.config.train.on_nonfinite == "drop":
        log(f"hpcfl: warning: round {round + 1}: client(s) {faulty} gave a non-finite loss or update; "
                "their updates were dropped (train.on_nonfinite = 'drop'; recorded as client/nonfinite)")
    return faulty


def _match(job: Job, phase, round: int, cohort: list[int], hosted: list[int], bytes_up: dict,
           bytes_down: dict) -> tuple[dict, dict]:
    """The layer-wise matching collective that opens a matching phase: the sampled clients' tensors
    are gathered to the server, whose answer is broadcast (one tensor) and scattered (one per client).
    Returns (downlink with MATCHED's shared tensor, this rank's clients' replies)."""
    transport, device = job.transport, _device(job)
    gathered = transport.gather(phase.name, job.worker.gather(phase, round, hosted) if job.worker else {})
    shared, replies = job.server.match(phase, round, gathered) if job.server else (None, None)
    shared = transport.broadcast(phase.name, shared)
    mine = transport.scatter(phase.name, replies, hosted)
    if job.server:                      # what each client sends and receives, as for every payload
        bytes_up[phase.name] = bytes_up.get(phase.name, 0) + 4 * sum(v.size for v in gathered.values())
        bytes_down[phase.name] = bytes_down.get(phase.name, 0) + 4 * (shared.size * len(cohort) +
                                                                      sum(v.size for v in replies.values()))
    return ({MATCHED: {"global": torch.from_numpy(np.asarray(shared)).to(device)}},
            {c: torch.from_numpy(np.asarray(r)).to(device) for c, r in mine.items()})


def _device(job: Job):
    return (job.worker or job.server).device


def _evaluate(job: Job, round: int) -> dict:
    """The global model's test metrics on the server, every `eval.every` rounds and at the last."""
    cfg = job.config
    if not job.server or not cfg.evaluates(round):
        return {}
    start = time.perf_counter()
    result = job.server.evaluate()
    if result is None:                    # no global model (local-only): accuracy is personalised
        return {}
    out = {"round/test_acc": result["acc"], "round/test_loss": result["loss"], "class/test_acc": result["class_acc"]}
    validation = job.server.evaluate(on="validation") if job.algorithm.global_model else None   # else: _record's
    if validation is not None:
        out.update({"round/val_acc": validation["acc"], "round/val_loss": validation["loss"]})
    return {**out, "round/eval_s": time.perf_counter() - start}


FORGETTING_XI = 1e-3            # xi of FedKA eq. (1), which keeps a class the global model never gets finite


def _split_report(job: Job, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reduced report as (client x CLIENT_METRICS, client x class accuracies (eval.forgetting;
    zero columns otherwise), rank x RANK_METRICS)."""
    n = job.config.data.num_clients
    width = len(CLIENT_METRICS) + (job.num_classes if job.config.eval.forgetting else 0)
    clients = flat[:n * width].reshape(n, width)
    ranks = flat[n * width:].reshape(job.transport.size, len(RANK_METRICS))
    return clients[:, :len(CLIENT_METRICS)], clients[:, len(CLIENT_METRICS):], ranks


def _forgetting(job: Job, cohort: list[int], flat: np.ndarray, start_acc: np.ndarray) -> dict:
    """FedKA eq. (1) per sampled client and class: (acc_global - acc_local) / (acc_global + xi), with
    acc_global the class accuracy of the model the round started from. A client whose update was
    non-finite (CLIENT_METRICS 'nonfinite') had no model tested: NaN, not the ~1 its zero row would give."""
    rows, classes, _ = _split_report(job, flat)
    tested = [c for c in cohort if not rows[c, CLIENT_METRICS.index("nonfinite")] > 0]     # 1 or NaN (not set)
    local = np.full((job.config.data.num_clients, job.num_classes), np.nan)
    local[tested] = classes[tested]
    return {"class/start_acc": start_acc, "client_class/test_acc": local,
            "client_class/forgetting": (start_acc - local) / (start_acc + FORGETTING_XI)}


def _report(job: Job, rows: np.ndarray, hosted: list[int]) -> np.ndarray | None:
    """Sum clients' metric rows and each rank's RANK_METRICS onto the server."""
    transport = job.transport
    for cid in hosted:                  # the rank that trained a client this round gives its size
        rows[cid, CLIENT_METRICS.index("num_samples")] = job.worker.clients[cid].num_samples
    stats = transport.take_stats()
    ranks = np.zeros((transport.size, len(RANK_METRICS)))
    compute = sum(part.compute_s for part in (job.worker, job.server) if part)
    state = job.worker.client_state_bytes() if job.worker else 0
    peak = peak_bytes()
    ranks[transport.rank] = (compute, stats.wait_s, sum(stats.sent.values()), sum(stats.received.values()), state,
                             peak)
    for part in (job.worker, job.server):
        if part:
            part.compute_s = 0.0
    flat = transport.reduce_sum("report", np.concatenate([rows.ravel(), ranks.ravel()]))
    return flat


def _record(job, round, hosts, flat, evaluation, phase_s, moved, round_s, log) -> None:
    cfg, n, cohort = job.config, job.config.data.num_clients, list(hosts)
    rows, _, ranks = _split_report(job, flat)
    sampled = np.zeros(n, dtype=bool)
    sampled[cohort] = True
    values = {"client/rank": np.full(n, np.nan)}
    values["client/rank"][cohort] = [hosts[c] for c in cohort]
    for j, key in enumerate(CLIENT_METRICS[:-1]):
        if key in job.client_metrics:
            values[f"client/{key}"] = np.where(sampled, rows[:, j], np.nan)
    if "client/local_test_acc" in values:                  # personalised accuracy across the cohort
        personal = values["client/local_test_acc"][cohort]
        values["round/personal_acc_mean"], values["round/personal_acc_std"] = personal.mean(), personal.std()
    if "client/val_acc" in values and not job.algorithm.global_model and cfg.evaluates(round):
        values["round/val_acc"] = float(np.nanmean(values["client/val_acc"][cohort]))   # the clients' own models
    samples = rows[:, CLIENT_METRICS.index("num_samples")]
    trained = [c for c in cohort if np.isfinite(rows[c, 0])]        # a dropped NaN/Inf client is left out
    values["round/train_loss"] = (float(np.sum(rows[trained, 0] * samples[trained]) / np.sum(samples[trained]))
                                  if trained else np.nan)
    values.update(evaluation)
    for direction, by_name in moved.items():
        values.update({f"round/bytes_{direction}/{k}": float(v) for k, v in by_name.items()})
    values.update({f"round/phase_s/{k}": v for k, v in phase_s.items()})
    for j, key in enumerate(RANK_METRICS):
        values[f"rank/{key}"] = ranks[:, j]
    values["round/time_s"] = round_s
    compute = ranks[1:, RANK_METRICS.index("compute_s")] if len(ranks) > 1 else ranks[:, 0]
    values["round/imbalance_s"] = float(compute.max() - compute.mean())     # what the average worker waits
    job.recorder.append_round(round, values)
    acc, personal = values.get("round/test_acc"), values.get("round/personal_acc_mean")
    text = "" if acc is None else f"test_acc {acc:.4f}  test_loss {values['round/test_loss']:.4f}  "
    text += "" if personal is None else f"personal_acc {personal:.4f}  "
    text += f"val_acc {values['round/val_acc']:.4f}  " if "round/val_acc" in values else ""
    log(f"round {round + 1:>4}/{cfg.run.rounds}  {text}train_loss {values['round/train_loss']:.4f}  "
        f"{round_s:6.2f} s")
    state = values["rank/client_state_bytes"]
    if round == cfg.run.rounds - 1 and state.any():
        log("hpcfl: per-client state held on the workers' CPUs: " +
            ", ".join(f"rank {r} {b / 2**20:.1f} MiB" for r, b in enumerate(state) if b))
