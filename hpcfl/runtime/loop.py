"""The round loop, identical on every rank, as numbered steps (`run`), and one step per kind of phase
(`_train`, `_swap`, `_match`).
"""
import logging
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hpcfl.algorithms.phases import MATCHED, MatchPhase, Phase, SwapPhase
from hpcfl.errors import StoppedOnFault
from hpcfl.logs import duration
from hpcfl.runtime.build import Job
from hpcfl.runtime.memory import reset_peak
from hpcfl.runtime.report import (
    CLIENT_COLUMN,
    CLIENT_METRICS,
    client_blocks,
    gather_report,
    record,
    split_report,
)
from hpcfl.runtime.resume import control, write_checkpoint
from hpcfl.transport import Traffic

LOG = logging.getLogger(__name__)


@dataclass
class Round:
    """What one round on this rank works with and fills in."""
    number: int
    cohort: list[int]
    hosts: dict[int, int]                 # sampled client -> the rank that trains it
    hosted: list[int]                     # the sampled clients this rank trains
    rows: np.ndarray                      # client x CLIENT_METRICS, filled by the rank that trained each client
    blocks: dict[str, np.ndarray]         # per-client blocks beside them (report.client_blocks), filled alike
    traffic: Traffic                      # its FL bytes, and the wire bytes the transport counts
    phase_s: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)    # the round's broadcasts so far, by payload: what its
                                                    # later phases' clients get too (a phase's own replace them)


def run(job: Job) -> bool:
    """The round loop, identical on every rank. Each round:
    1. its cohort (drawn up front) and the rank each sampled client trains on;
    2. the algorithm's phases, each run by the step of its kind (`_step`: `_train`, `_swap`, `_match`);
    3. the server's evaluation of the global model (every eval.every rounds);
    4. one reduce of every client's metrics and every rank's figures; the server records them;
    5. the NaN/Inf verdict, a checkpoint when due, a stop when a rank was signalled.
    Returns False if it stopped at a checkpoint (run the job again to resume), True once every
    round is done."""
    cfg, transport = job.config, job.transport
    evaluation, times, began = {}, [], time.perf_counter()
    transport.take_stats()              # set-up's waits and bytes are not the first round's
    for number in range(job.start_round, cfg.run.rounds):
        start = time.perf_counter()
        transport.round = number
        reset_peak()
        # 1. who trains, and where
        cohort = [int(c) for c in job.cohorts[number]]
        hosts = job.placement.hosts(cohort)
        this = Round(number, cohort, hosts,
                     sorted(c for c in cohort if hosts[c] == transport.rank) if job.worker else [],
                     np.zeros((cfg.data.num_clients, len(CLIENT_METRICS))), client_blocks(job), transport.stats)
        for extension in job.extensions:                # evaluations a job turns on (eval.forgetting)
            extension.round_starts(job, evaluation)
        # 2. the phases
        for phase in job.algorithm.plan(number):
            phase_start = time.perf_counter()
            _step(phase)(job, phase, this)
            this.phase_s[phase.name] = this.phase_s.get(phase.name, 0.0) + time.perf_counter() - phase_start
        # 3. evaluation
        evaluation = _evaluate(job, number)
        if job.server:
            evaluation.update({f"round/{k}": v for k, v in job.algorithm.server_metrics(job.server.state).items()})
        # 4. the report
        report = gather_report(job, this.rows, this.blocks, this.hosted, transport.take_stats())
        if job.server:
            for extension in job.extensions:
                evaluation.update(extension.report(job, cohort, report))
            round_s = time.perf_counter() - start
            times.append(round_s)
            progress = (f"elapsed {duration(time.perf_counter() - began)}  "
                        f"eta {duration(statistics.median(times) * (cfg.run.rounds - number - 1))}")
            record(job, number, hosts, report, evaluation, this.phase_s, this.traffic.fl, round_s, progress)
        # 5. NaN/Inf, checkpoint, stop
        faulty = _nonfinite(job, number, cohort, report) if job.server else []
        save, stop, fault = control(job, number, bool(faulty) and cfg.train.on_nonfinite == "stop")
        if fault:
            raise StoppedOnFault(f"round {number + 1}: client(s) {faulty} gave a non-finite (NaN/Inf) loss or update, "
                                "so the run stopped after recording the round (train.on_nonfinite = 'stop'). Fix: "
                                "lower train.lr, or set train.on_nonfinite = 'drop' to leave such updates out "
                                "and go on")
        if save:
            write_checkpoint(job, number + 1)
        if stop:
            return False
    if job.server and job.algorithm.traits.global_model and cfg.eval.feature_quality:      # FedFM Table IV
        quality = job.server.feature_quality(cfg.run.seed)
        for key, value in quality.items():
            job.recorder.write_array(f"final/{key}", np.float64(value))
        LOG.info(f"final global model's test features: NMI {quality['feature_nmi']:.4f}, "
                 f"silhouette {quality['feature_silhouette']:.4f}")
    return True


def _train(job: Job, phase: Phase, this: Round, matched: dict | None = None, replies: dict | None = None) -> None:
    """A train phase:
    a. the server's downlink is broadcast, and joins what the round has broadcast before (`matched`:
       a matching phase's answer);
    b. the hosted sampled clients train, with all of it;
    c. their uplink is sum-reduced onto the server, which aggregates it."""
    transport, device = job.transport, _device(job)
    packed = job.server.downlink(phase, this.number) if job.server else {}
    for name, layout in phase.downlink.items():
        this.received[name] = layout.unpack(torch.from_numpy(transport.broadcast(name, packed.get(name))).to(device))
        this.traffic.count("down", name, phase.per_client.get(name, layout.numel) * len(this.cohort))
    this.received.update(matched or {})
    sums = (job.worker.run_phase(phase, this.number, this.hosted, this.received, this.rows, CLIENT_METRICS,
                                 this.blocks, replies)
            if job.worker else {name: np.zeros(layout.numel) for name, layout in phase.uplink.items()})
    reduced = {name: transport.reduce_sum(name, sums[name]) for name in phase.uplink}
    for name, layout in phase.uplink.items():
        this.traffic.count("up", name, phase.per_client.get(name, layout.numel) * len(this.cohort))
    if job.server and phase.uplink:
        job.server.aggregate(phase, this.number, reduced)


def _swap(job: Job, phase: SwapPhase, this: Round) -> None:
    """A swap phase: the hosted clients' tensors go to their receivers (point to point across ranks),
    as the round's broadcasts pair them."""
    sources = job.algorithm.exchange_sources(this.number, this.received)
    if job.worker:
        job.worker.exchange(phase, this.number, this.hosted, job.transport, sources)
    this.traffic.count("exchange", phase.name, phase.exchange.numel * len(sources))


def _match(job: Job, phase: MatchPhase, this: Round) -> None:
    """A matching phase: the sampled clients' tensors are gathered to the server, whose answer is
    broadcast (one tensor) and scattered (one per client); then a train phase with the answer as
    downlink[MATCHED]."""
    transport, device = job.transport, _device(job)
    gathered = transport.gather(phase.name, job.worker.gather(phase, this.number, this.hosted) if job.worker else {})
    shared, replies = job.server.match(phase, this.number, gathered) if job.server else (None, None)
    shared = transport.broadcast(phase.name, shared)
    mine = transport.scatter(phase.name, replies, this.hosted)
    if job.server:                      # what each client sends and receives, as for every payload
        this.traffic.count("up", phase.name, sum(v.size for v in gathered.values()))
        this.traffic.count("down", phase.name, shared.size * len(this.cohort) + sum(v.size for v in replies.values()))
    _train(job, phase, this, {MATCHED: {"global": torch.from_numpy(np.asarray(shared)).to(device)}},
           {c: torch.from_numpy(np.asarray(r)).to(device) for c, r in mine.items()})


def _step(phase):
    """The step that runs a phase: a MatchPhase (a Phase that gathers first) `_match`, a SwapPhase `_swap`,
    any other Phase `_train`."""
    if isinstance(phase, MatchPhase):
        return _match
    return _swap if isinstance(phase, SwapPhase) else _train


def _nonfinite(job: Job, round: int, cohort: list[int], report: np.ndarray) -> list[int]:
    """The sampled clients whose loss or update went NaN/Inf this round (their updates were left out)."""
    rows = split_report(job, report)[0]
    faulty = [c for c in cohort if rows[c, CLIENT_COLUMN["nonfinite"]] > 0]
    if faulty and job.config.train.on_nonfinite == "drop":
        LOG.warning(f"round {round + 1}: client(s) {faulty} gave a non-finite loss or update; "
                    "their updates were dropped (train.on_nonfinite = 'drop'; recorded as client/nonfinite)")
    return faulty


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
    out = {"round/test_acc": result["acc"], "round/test_loss": result["loss"], "class/test_acc": result["class_acc"],
           "example/test_correct": np.packbits(result["correct"])}
    validation = job.server.evaluate(on="validation") if job.algorithm.traits.global_model else None   # else: _record's
    if validation is not None:
        out.update({"round/val_acc": validation["acc"], "round/val_loss": validation["loss"]})
    return {**out, "round/eval_s": time.perf_counter() - start}


