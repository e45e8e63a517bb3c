"""The transport contract: collectives on flat NumPy buffers, with byte and wait accounting (`Traffic`).

Rank 0 is the server; ranks >= 1 are workers hosting clients (one process: rank 0 hosts them all).
Every method is collective: every rank calls it, in the same order, even with nothing to send.
Algorithms never see this layer; the round loop (hpcfl.runtime.loop) turns the payloads a phase
declares into these calls.

- `broadcast`: server -> every rank (a phase's downlink payloads: the model, FedFM's anchors,
  FedCME's partners; a matching phase's shared answer; the round's checkpoint/stop decision).
- `reduce_sum`: float64 sum over ranks onto the server (a phase's uplink sums, the round's report,
  the ranks' stop signals).
- `gather` / `scatter`: per-client buffers to / from the server (a matching phase: FedMA's layers
  in, each client's assignment out).
- `exchange`: client-to-client buffers, each receiver getting its source's (a swap phase: FedCME's
  classifier swap, both directions of each pair; many-to-one matching: one source may feed several
  receivers). `deliver_in_memory` is the part of it that stays on one rank.
- `share`: every rank's small info dict, in rank order (set-up reports and failures, checkpoint
  file digests): bookkeeping, never payloads.
"""
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Traffic:
    """What this rank's round moved, in the two measures a result file holds, and how long it waited
    (since the last `take_stats`):
    - FL bytes (`fl`, counted by the round loop): what clients would send and receive as float32, by
      direction and payload, the same on 1 or N ranks (round/bytes_<direction>/<payload>);
    - wire bytes (`sent`, `received`, counted by the transport): what this rank really moved
      (rank/wire_sent_bytes, rank/wire_received_bytes)."""

    fl: dict[str, dict[str, int]] = field(default_factory=lambda: {"down": {}, "up": {}, "exchange": {}})
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))       # bytes by payload name
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wait_s: float = 0.0                                                           # blocked in collectives

    def count(self, direction: str, name: str, elements: int) -> None:
        """FL bytes of `elements` float32 values going `direction` ("down", "up", "exchange") as `name`."""
        self.fl[direction][name] = self.fl[direction].get(name, 0) + 4 * elements


class Transport(ABC):
    rank: int = 0
    size: int = 1
    round: int = -1             # the round in progress (-1: set-up), set by the round loop; for messages
    timeout_s: float = 0.0      # run.round_timeout_s: how long a collective waits for a silent rank

    def __init__(self, client_rank: dict[int, int]):
        self.client_rank = dict(client_rank)      # client id -> its home rank (where it trains unless dealt per round)
        self.stats = Traffic()

    @property
    def is_server(self) -> bool:
        return self.rank == 0

    def take_stats(self) -> Traffic:
        stats, self.stats = self.stats, Traffic()
        return stats

    @abstractmethod
    def broadcast(self, name: str, array: np.ndarray | None) -> np.ndarray:
        """The server's flat (1-D) `array` on every rank, dtype kept (read-only: it may be shared in one process)."""

    @abstractmethod
    def reduce_sum(self, name: str, array: np.ndarray) -> np.ndarray | None:
        """Element-wise float64 sum of every rank's `array` (same size everywhere) on the server."""

    @abstractmethod
    def gather(self, name: str, items: dict[int, np.ndarray]) -> dict[int, np.ndarray] | None:
        """Per-client buffers of every rank, collected on the server in client order (None elsewhere)."""

    @abstractmethod
    def scatter(self, name: str, items: dict[int, np.ndarray] | None, clients: list[int]) -> dict[int, np.ndarray]:
        """Server's `items[c]` delivered to the rank hosting client c; `clients` are this rank's receivers."""

    @abstractmethod
    def exchange(self, name: str, sources: dict[int, int], items: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Receiver r gets the buffer of client `sources[r]`. Every rank passes the same `sources`;
        `items` holds the buffers of this rank's clients that appear in it, receivers included (what
        a receiver gets has the size of its own buffer)."""

    @abstractmethod
    def share(self, info: dict) -> list[dict]:
        """Every rank's small `info` dict (host, device, setup error, checkpoint file digests), in rank
        order: bookkeeping at set-up and checkpoints, never payloads."""

    def close(self) -> None:  # noqa: B027 (a no-op hook)
        pass


def deliver_in_memory(sources: dict[int, int], items: dict[int, np.ndarray], hosted) -> dict[int, np.ndarray]:
    """The deliveries whose receiver is `hosted` here and whose source's buffer is in `items`."""
    return {r: items[s] for r, s in sources.items() if hosted(r) and s in items}
