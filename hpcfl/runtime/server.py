"""The server (rank 0): holds the algorithm's server state and runs its server hooks on it. Each
phase it packs the downlink payloads into flat buffers, unpacks the reduced uplink sums and
aggregates them, and in a matching phase answers the gathered clients (FedMA); it evaluates the
global model on the test set and on the clients' held-out validation samples, and the features'
quality (FedFM's NMI and silhouette). The round loop (hpcfl.runtime.loop) moves the buffers, and
hpcfl.runtime.report records what a round measured, the server's compute time (`compute_s`) with it.

In a one-process run rank 0 is also the only worker; the server code is the same either way.
"""
import time

import numpy as np
import torch

from hpcfl.algorithms.base import Algorithm, owned
from hpcfl.algorithms.phases import MatchPhase, Phase
from hpcfl.errors import PayloadError
from hpcfl.metrics.feature_space import feature_quality


class Server:
    def __init__(self, algorithm: Algorithm, model: torch.nn.Module, test_x, test_y, eval_batch: int, device,
                 validation: tuple[torch.Tensor, torch.Tensor] | None = None):
        """`validation`: every client's held-out samples (data.validation_fraction), for model selection."""
        self.algorithm, self.model, self.device = algorithm, model, device
        state = owned(algorithm.init_server_state(model), f"{algorithm.name}.init_server_state")
        self.state = {owner: {k: v.to(device) for k, v in tensors.items()} for owner, tensors in state.items()}
        self.test_x, self.test_y = test_x.to(device), test_y.to(device)
        self.sets = {"test": (self.test_x, self.test_y)}
        if validation is not None:
            self.sets["validation"] = tuple(t.to(device) for t in validation)
        self.eval_batch = eval_batch
        self.compute_s = 0.0

    def downlink(self, phase: Phase, round: int) -> dict[str, np.ndarray]:
        """The phase's broadcast payloads, each packed into one float32 buffer."""
        if not phase.downlink:
            return {}
        start = time.perf_counter()
        payloads = self.algorithm.downlink(phase, round, self.state)
        out = {name: layout.pack(payloads[name], dtype=torch.float32).cpu().numpy()
               for name, layout in phase.downlink.items()}
        self.compute_s += time.perf_counter() - start
        return out

    def aggregate(self, phase: Phase, round: int, sums: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        uplink = {name: layout.unpack(torch.from_numpy(sums[name]).to(self.device))
                  for name, layout in phase.uplink.items()}
        self.algorithm.aggregate(phase, round, self.state, uplink)
        self.compute_s += time.perf_counter() - start

    def match(self, phase: MatchPhase, round: int,
              gathered: dict[int, np.ndarray]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """A matching phase's server step: the gathered per-client buffers in, one buffer for every
        rank and one per client out (float64)."""
        start = time.perf_counter()
        shared, replies = self.algorithm.match(phase, round, self.state,
                                               {c: torch.from_numpy(v) for c, v in gathered.items()})
        if replies.keys() != gathered.keys():           # a client left out would get an empty reply
            raise PayloadError(f"{self.algorithm.name}.match answered clients {sorted(replies)}, not the gathered "
                               f"{sorted(gathered)}: a matching phase replies to each gathered client")
        as_numpy = lambda t: t.detach().to(torch.float64).cpu().numpy().ravel()      # noqa: E731
        out = as_numpy(shared), {c: as_numpy(t) for c, t in replies.items()}
        self.compute_s += time.perf_counter() - start
        return out

    def feature_quality(self, seed: int) -> dict[str, float]:
        """NMI and silhouette of the global model's features on a test sample (FedFM Table IV)."""
        model = self.algorithm.global_module(self.state, self.model)
        return feature_quality(model, self.test_x, self.test_y, self.algorithm.setup.num_classes, seed)

    def evaluate(self, on: str = "test") -> dict | None:
        """Accuracy, loss and per-class accuracy of the server's model on the test set or the clients'
        held-out validation samples (None if it has no model, or no such set)."""
        if on not in self.sets:
            return None
        start = time.perf_counter()
        result = self.algorithm.evaluate(self.state, self.model, *self.sets[on], self.eval_batch)
        self.compute_s += time.perf_counter() - start
        return result
