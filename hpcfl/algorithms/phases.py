"""The kinds of phase a round is made of, and the hooks of the two that are not plain training.

- `Phase`, a train phase: the server's downlink payloads are broadcast, the sampled clients train
  (`Algorithm.client_update`) and their uplink payloads are sum-reduced onto the server
  (`Algorithm.aggregate`). Most algorithms' rounds are one train phase.
- `SwapPhase`: tensors go client to client and nothing else happens (FedCME's classifier swap). An
  algorithm that plans one mixes in `Swapping`.
- `MatchPhase`: a train phase that opens with a matching collective: every sampled client's
  `gather_out` tensor goes to the server, whose `match` answers with one tensor for all and one per
  client, of any size; `client_update` finds them in downlink[MATCHED] (FedMA's layer-wise
  matching). An algorithm that plans one mixes in `Matching`.

The runtime runs each kind with its own step (hpcfl.runtime.loop), chosen by the phase's type.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from hpcfl.payload import Layout

Tensors = dict[str, torch.Tensor]
MATCHED = "#matched"          # a matching phase's answer: {"global": one tensor for all, "reply": the client's own}


@dataclass(frozen=True)
class Phase:
    """A training phase: the `downlink` payloads are broadcast, clients train, the `uplink` ones sum-reduced."""
    name: str
    downlink: Mapping[str, Layout] = field(default_factory=dict)   # broadcast payloads
    uplink: Mapping[str, Layout] = field(default_factory=dict)     # sum-reduced payloads
    # the elements one client sends or receives of a payload whose layout holds a slot for every client
    # (FedCME's evaluation rows, its pairing): what the FL byte counts take; any other payload, its layout
    per_client: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MatchPhase(Phase):
    """A train phase that opens with gather_out -> match -> downlink[MATCHED]."""


@dataclass(frozen=True)
class SwapPhase:
    """A client-to-client exchange inside a round: each receiving client gets `exchange` from its source."""
    name: str
    exchange: Layout                    # the tensors each receiving client gets from its source


class Swapping:
    """The hooks of a swap phase, on every worker rank."""

    def exchange_sources(self, round: int, received: dict[str, Tensors]) -> dict[int, int]:
        """Receiver client -> the client whose tensors it gets, from what the round has broadcast so
        far (`received`, the same on every rank, the server's included)."""
        raise NotImplementedError

    def exchange_out(self, phase: SwapPhase, client) -> Tensors:
        """The tensors (phase.exchange's layout) this client hands to its receivers."""
        raise NotImplementedError

    def exchange_in(self, phase: SwapPhase, client, received: Tensors) -> None:
        """Take the tensors received from the client's source."""
        raise NotImplementedError


class Matching:
    """The hooks of a matching phase."""

    def gather_out(self, phase: MatchPhase, round: int, client) -> torch.Tensor:
        """On the client's worker, before the downlink: the tensor this client sends the server."""
        raise NotImplementedError

    def match(self, phase: MatchPhase, round: int, server_state: dict[str, Tensors],
              gathered: dict[int, torch.Tensor]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """On the server, from every sampled client's tensor: one tensor broadcast to all and one sent
        to each client; they reach `client_update` as downlink[MATCHED]."""
        raise NotImplementedError
