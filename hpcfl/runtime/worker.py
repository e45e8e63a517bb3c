"""A worker: the clients one rank hosts, trained one after another on one reused model instance per
architecture (one, unless model.architectures makes the clients heterogeneous). With per-round
placement it holds every client's data and trains those of the round's cohort dealt to it.

Each phase, the worker adds every hosted sampled client's weighted uplink into one float64 buffer
per payload, in increasing client id order, so the reduction over ranks sees one buffer per rank.
A client whose loss or contribution is NaN/Inf is left out of the sums and flagged in its metric row
(`nonfinite`); with train.on_nonfinite = 'drop' it also gets back the state it had before the round.
With train.batched_clients, an algorithm that allows it has the sampled clients trained together
first (hpcfl.training.batched: each client's update runs once to record what it trains, the group
trains, and then each update runs as usual and takes its trained model).
"""
import math
import time

import numpy as np
import torch

from hpcfl.algorithms.base import Algorithm, finite
from hpcfl.algorithms.phases import MATCHED, MatchPhase, Phase, SwapPhase
from hpcfl.data.client import Client
from hpcfl.errors import HpcflError
from hpcfl.models.evaluation import evaluate
from hpcfl.training.recording import Recorded, Recording, Trained


class Worker:
    def __init__(self, algorithm: Algorithm, clients: dict[int, Client], models: dict[str, torch.nn.Module], trainer,
                 device, num_classes: int, eval_batch: int, drop_nonfinite: bool = False, batched=None,
                 moving: bool = False):
        self.algorithm, self.clients, self.models = algorithm, clients, models
        self.trainer, self.device = trainer, device
        self.num_classes, self.eval_batch = num_classes, eval_batch
        self.drop_nonfinite = drop_nonfinite       # a faulty client gets back its state of before the round
        self.batched = batched                     # a BatchedTrainer (train.batched_clients), or None
        self.moving = moving                       # clients are dealt to workers per round: `clients` has them all
        self.compute_s = 0.0

    def run_phase(self, phase: Phase, round: int, hosted: list[int], downlink: dict, rows: np.ndarray,
                  metric_names: tuple[str, ...], blocks: dict[str, np.ndarray] | None = None,
                  replies: dict[int, torch.Tensor] | None = None) -> dict[str, np.ndarray]:
        """Train the sampled clients this rank hosts this round (`hosted`, increasing ids); returns the
        summed uplink buffers; fills `rows` (client x metric) and the `blocks` given (hpcfl.runtime.report.
        client_blocks: the trained model's test accuracy per class, its correctness on the client's own
        test examples). `downlink`: what the round has broadcast so far; in a matching phase each
        client also gets its own reply, as downlink[MATCHED]["reply"]."""
        start = time.perf_counter()
        sums = {name: _zeros(layout.numel, self.device) for name, layout in phase.uplink.items()}
        column = {key: j for j, key in enumerate(metric_names)}
        self.algorithm.receive(phase, round, downlink)
        trainer = self._trainer(phase, round, hosted, downlink, replies)
        for cid in hosted:
            client = self.clients[cid]
            model = self.algorithm.client_model(client, self.models[client.architecture])
            before = _moved(client.kept(), torch.clone) if self.drop_nonfinite else None
            client.keep(_moved(client.kept(), lambda t: t.to(self.device)))
            received = _received(downlink, replies, cid)
            try:
                contributions, metrics = _checked(self.algorithm, phase, self.algorithm.client_update(
                    phase, round, client, received, model, trainer))
            except Exception as err:
                err.add_note(f"hpcfl: in client {cid}, round {round + 1}, phase '{phase.name}'")
                raise
            client.keep(_moved(client.kept(), lambda t: t.detach().cpu()))
            if self.moving and (kept := [f"{owner}: {name}" for _, owner, name, _ in _tensors(client.kept())]):
                raise HpcflError(f"algorithm '{self.algorithm.name}' declares stateless clients, but client {cid} "
                                 f"kept {kept[:3]}: its class must not set `stateless`, nor a term it uses leave "
                                 "keeps_state unset")
            if not _finite(contributions, metrics):            # left out of the sums; the server decides
                rows[cid] = np.nan                              # no figure of a model left out, but its loss
                rows[cid, column["nonfinite"]] = 1.0
                rows[cid, column["train_loss"]] = metrics.get("train_loss", np.nan)
                if before is not None:
                    client.keep(before)
                continue
            for name, (tensors, weight) in contributions.items():
                phase.uplink[name].add_into(sums[name], tensors, weight)
            if not metrics:                                     # a phase without training (FedFM's anchors)
                continue
            blocks = blocks or {}
            for split, (x, y) in client.eval_sets.items():     # the trained local model, on the client's own data
                result = evaluate(model, x, y, self.num_classes, self.eval_batch)
                metrics[f"{split}_acc"], metrics[f"{split}_loss"] = result["acc"], result["loss"]
                if f"{split}_correct" in blocks:
                    blocks[f"{split}_correct"][cid, :len(y)] = result["correct"]
            if "class_acc" in blocks:
                tested = evaluate(model, *client.test_set, self.num_classes, self.eval_batch)
                blocks["class_acc"][cid] = tested["class_acc"]
            # trained and finite (1 if an earlier phase of the round was not; an unsampled client: NaN)
            metrics = {**metrics, "nonfinite": float(rows[cid, column["nonfinite"]] > 0)}
            for j, key in enumerate(metric_names):
                rows[cid, j] = metrics.get(key, np.nan)
        self.compute_s += time.perf_counter() - start
        return {name: buf.cpu().numpy() for name, buf in sums.items()}

    def _trainer(self, phase: Phase, round: int, hosted: list[int], downlink: dict, replies: dict | None):
        """What the clients' updates train with: with train.batched_clients and an algorithm that allows it,
        a Trained answering each `train` call with the model its group trained, else the trainer, one
        client after another. The calls are recorded in passes over the updates (each client's state put
        back after): a pass runs every update up to its first call not trained yet, the calls recorded
        train together, and the next pass goes on from them (FedClassAvg's warm-up, then its round)."""
        if not (self.batched and hosted and self.algorithm.traits.batched):
            return self.trainer
        results = {}
        while True:
            recording = Recording(self.trainer, results)
            for cid in hosted:
                client = self.clients[cid]
                model = self.algorithm.client_model(client, self.models[client.architecture])
                kept = client.kept()                                        # put back after the pass, as it was
                client.keep(_moved(kept, lambda t: t.to(self.device, copy=True)))  # the update may change these
                try:
                    self.algorithm.client_update(phase, round, client, _received(downlink, replies, cid), model,
                                                 recording)
                except Recorded:
                    pass
                else:                        # a phase without training (FedFM's anchors): nothing to batch
                    if not results and not recording.requests:
                        return self.trainer
                finally:
                    client.keep(kept)
            if not recording.requests:
                return Trained(self.trainer, results)
            results.update(self.batched.train(recording.requests))

    def gather(self, phase: MatchPhase, round: int, hosted: list[int]) -> dict[int, np.ndarray]:
        """A matching phase's opening: the hosted sampled clients' tensors for the server."""
        start = time.perf_counter()
        out = {c: self.algorithm.gather_out(phase, round, self.clients[c])
                  .detach().to(torch.float64).cpu().numpy().ravel()
               for c in hosted}
        self.compute_s += time.perf_counter() - start
        return out

    def exchange(self, phase: SwapPhase, round: int, hosted: list[int], transport, sources: dict[int, int]) -> None:
        """A swap phase: the hosted sampled clients hand their tensors to their receivers (`sources`:
        receiver -> source; in memory on this rank, point to point across ranks); every worker reaches
        it with all its clients at the same point of training, so no rank waits on a partner that is
        still training."""
        start = time.perf_counter()
        involved = set(sources) | set(sources.values())
        items = {c: phase.exchange.pack(self.algorithm.exchange_out(phase, self.clients[c])).cpu().numpy()
                 for c in hosted if c in involved}
        for cid, buf in transport.exchange(phase.name, sources, items).items():
            flat = torch.from_numpy(np.asarray(buf, dtype=np.float64))
            self.algorithm.exchange_in(phase, self.clients[cid], phase.exchange.unpack(flat))
        self.compute_s += time.perf_counter() - start

    def client_state_bytes(self) -> int:
        """Memory held by the hosted clients' persistent state (on the CPU between rounds)."""
        return sum(t.numel() * t.element_size() for c in self.clients.values() for *_, t in _tensors(c.kept()))


def _checked(algorithm, phase: Phase, returned) -> tuple[dict, dict]:
    """client_update's ({payload: (tensors, weight)}, metrics) as the phase declares them; a plug-in's
    mistake is named here rather than as an unpacking or key error in the sums."""
    where = f"algorithm '{algorithm.name}': client_update returned"
    if not (isinstance(returned, tuple) and len(returned) == 2):
        raise HpcflError(f"{where} a {type(returned).__name__}, not ({{payload: (tensors, weight)}}, metrics)")
    contributions, metrics = returned
    if not (isinstance(contributions, dict) and isinstance(metrics, dict)):
        raise HpcflError(f"{where} ({type(contributions).__name__}, {type(metrics).__name__}), not "
                         "({payload: (tensors, weight)}, metrics): two dicts")
    unpaired = [name for name, c in contributions.items() if not (isinstance(c, tuple | list) and len(c) == 2)]
    if unpaired:
        raise HpcflError(f"{where} payload(s) {unpaired}, each not a (tensors, weight) pair")
    unknown = sorted(set(contributions) - set(phase.uplink))
    if unknown:
        raise HpcflError(f"{where} payload(s) {unknown}, which phase '{phase.name}' does not declare (its uplink: "
                         f"{sorted(phase.uplink)})")
    return returned


def _received(downlink: dict, replies: dict | None, cid: int) -> dict:
    """What client `cid` receives: the round's broadcasts, and in a matching phase its own reply."""
    return downlink if replies is None else {**downlink, MATCHED: {**downlink[MATCHED], "reply": replies[cid]}}


def _zeros(n: int, device) -> torch.Tensor:
    """A float64 sum buffer. On the CPU through NumPy, which asks for transparent huge pages: torch's
    own zeros of an 89 MB buffer took 512x the page faults and 40 ms (bench/aggregation.py)."""
    if torch.device(device).type == "cpu":
        return torch.from_numpy(np.zeros(n))
    return torch.zeros(n, dtype=torch.float64, device=device)


def _finite(contributions: dict, metrics: dict) -> bool:
    """Whether a client's loss and every tensor (and weight) it contributes are finite."""
    return math.isfinite(metrics.get("train_loss", 0.0)) and finite(
        t for tensors, weight in contributions.values()
        for t in (*tensors.values(), torch.as_tensor(weight, dtype=torch.float64)))


def _moved(kept: dict[str, dict], move) -> dict[str, dict]:
    """A client's kept state (Client.kept) with `move` applied to every tensor."""
    return {part: {owner: {name: move(t) for name, t in tensors.items()} for owner, tensors in state.items()}
            for part, state in kept.items()}


def _tensors(kept: dict[str, dict]):
    """(part, owner, name, tensor) for every tensor of a client's kept state (Client.kept)."""
    return ((part, owner, name, t) for part, state in kept.items() for owner, tensors in state.items()
            for name, t in tensors.items())
