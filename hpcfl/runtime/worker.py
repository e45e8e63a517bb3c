"""A worker: the clients one rank hosts, trained one after another on one reused model instance per
architecture (one, unless model.architectures makes the clients heterogeneous).

Each phase, the worker adds every hosted sampled client's weighted uplink into one float64 buffer
per payload, in increasing client id order, so the reduction over ranks sees one buffer per rank.
"""
import time

import numpy as np
import torch

from hpcfl.algorithms.base import MATCHED, Algorithm, Client, Phase
from hpcfl.training import evaluate


class Worker:
    def __init__(self, algorithm: Algorithm, clients: dict[int, Client], models: dict[str, torch.nn.Module], trainer,
                 device, num_classes: int, eval_batch: int):
        self.algorithm, self.clients, self.models, self.trainer, self.device = algorithm, clients, models, trainer, device
        self.num_classes, self.eval_batch = num_classes, eval_batch
        self.compute_s = 0.0

    def run_phase(self, phase: Phase, round: int, cohort: list[int], downlink: dict, rows: np.ndarray,
                  metric_names: tuple[str, ...], class_rows: np.ndarray | None = None,
                  replies: dict[int, torch.Tensor] | None = None) -> dict[str, np.ndarray]:
        """Train this rank's sampled clients; returns the summed uplink buffers; fills `rows` (client x
        metric) and, if given, `class_rows` (client x class: the trained model's test accuracy per class).
        In a matching phase each client also gets its own reply, as downlink[MATCHED]["reply"]."""
        start = time.perf_counter()
        sums = {name: torch.zeros(layout.numel, dtype=torch.float64, device=self.device)
                for name, layout in phase.uplink.items()}
        self.algorithm.receive(phase, round, downlink)
        for cid in sorted(c for c in cohort if c in self.clients):
            client = self.clients[cid]
            model = self.algorithm.client_model(client, self.models[client.architecture])
            client.state = {k: v.to(self.device) for k, v in client.state.items()}
            received = downlink if replies is None else {**downlink, MATCHED: {**downlink[MATCHED], "reply": replies[cid]}}
            try:
                contributions, metrics = self.algorithm.update_client(phase, round, client, received,
                                                                      model, self.trainer)
            except Exception as err:
                err.add_note(f"hpcfl: in client {cid}, round {round}, phase '{phase.name}'")
                raise
            client.state = {k: v.detach().cpu() for k, v in client.state.items()}
            for name, (tensors, weight) in contributions.items():
                phase.uplink[name].add_into(sums[name], tensors, weight)
            if not metrics:                                     # a phase without training (FedFM's anchors)
                continue
            for split, (x, y) in client.eval_sets.items():     # the trained local model, on the client's own data
                metrics[f"{split}_acc"] = evaluate(model, x, y, self.num_classes, self.eval_batch)["acc"]
            if class_rows is not None:
                class_rows[cid] = evaluate(model, *client.test_set, self.num_classes, self.eval_batch)["class_acc"]
            for j, key in enumerate(metric_names):
                rows[cid, j] = metrics.get(key, np.nan)
        self.compute_s += time.perf_counter() - start
        return {name: buf.cpu().numpy() for name, buf in sums.items()}

    def gather(self, phase: Phase, round: int, cohort: list[int]) -> dict[int, np.ndarray]:
        """A matching phase's opening: the hosted sampled clients' tensors for the server."""
        start = time.perf_counter()
        out = {c: self.algorithm.gather_out(phase, round, self.clients[c]).detach().to(torch.float64).cpu().numpy().ravel()
               for c in sorted(cohort) if c in self.clients}
        self.compute_s += time.perf_counter() - start
        return out

    def exchange(self, phase: Phase, round: int, cohort: list[int], downlink: dict, transport) -> None:
        """A swap phase: the hosted sampled clients hand their tensors to their receivers (in memory
        on this rank, point to point across ranks); every worker reaches it with all its clients at
        the same point of training, so no rank waits on a partner that is still training."""
        start = time.perf_counter()
        self.algorithm.receive(phase, round, downlink)
        sources = self.algorithm.exchange_sources(round)
        involved = set(sources) | set(sources.values())
        items = {c: phase.exchange.pack(self.algorithm.exchange_out(phase, self.clients[c])).cpu().numpy()
                 for c in sorted(cohort) if c in self.clients and c in involved}
        for cid, buf in transport.exchange(phase.name, sources, items).items():
            flat = torch.from_numpy(np.asarray(buf, dtype=np.float64))
            self.algorithm.exchange_in(phase, self.clients[cid], phase.exchange.unpack(flat))
        self.compute_s += time.perf_counter() - start

    def client_state_bytes(self) -> int:
        """Memory held by the hosted clients' persistent state (on the CPU between rounds)."""
        return sum(t.numel() * t.element_size() for c in self.clients.values() for t in c.state.values())
