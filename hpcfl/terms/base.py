"""What every local loss term is: the hooks the trainer calls, and a frozen model copy for terms that
compare the local model with a reference one."""
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from hpcfl.models import load_state

Tensors = dict[str, torch.Tensor]


class Term:
    """A local loss term added to any algorithm's training: it sees the model the client started from, may
    rescale the logits and adds to each batch's loss."""
    name: ClassVar[str]

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params):
        self.params = params

    needs_anchors: ClassVar[bool] = False
    needs_shared: ClassVar[bool] = False   # the run's shared set S (one sample per class) as client.shared
    keeps_state: ClassVar[bool] = False    # `finish` writes `state(client)`, so the client stays on one worker
    batchable: ClassVar[bool] = False      # runs under vmap (train.batched_clients): `start` sets each client's
                                           # context as attributes (tensors, dicts of them, Frozen models) that
                                           # `logits`/`loss` only read, with no data-dependent shapes
    seed: int = 0                          # the run's seed, for terms that draw per (round, client)
    views: ClassVar[int] = 1       # 2: the trainer makes two augmented views of each batch (SupCon), and
                                   # `loss` gets their features as N x 2 x d (view 1 is what the task loss sees)

    @classmethod
    def adapt(cls, model: nn.Module, params, seed: int) -> None:
        """At model build time, on every rank (the server's model too), after the model's own
        initialisation: add what the term needs to the architecture (MOON's projection head). What it
        adds is in the state_dict, so it travels and is averaged like the rest; it must be built the
        same on every rank, from a generator derived from `seed` (hpcfl.seeding)."""

    def start(self, model: nn.Module, client, round: int, received: Mapping[str, Tensors]) -> None:
        """Before local training; received["model"] is the model state the client started from."""

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def loss(self, model: nn.Module, x, y, features, logits) -> torch.Tensor | None:
        return None

    def finish(self, model: nn.Module, client) -> None:
        """After local training: update the client's state."""

    def state(self, client) -> Tensors:
        """This term's own part of the client's persistent state (a term that writes it declares
        keeps_state); no other term or the algorithm sees its keys."""
        return client.term_state.setdefault(self.name, {})


Regularizer = Term      # its name in 0.1, accepted until the next release


class Frozen:
    """A copy of the model, made once per worker and architecture and reused, that holds a reference
    state and runs without gradients in eval mode (no dropout; BatchNorm uses its running statistics).
    `net` is the copy last loaded."""

    def __init__(self):
        self.net: nn.Module | None = None
        self.copies: dict[int, nn.Module] = {}      # by the worker's model it copies: one per architecture

    def load(self, model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        if id(model) not in self.copies:
            self.copies[id(model)] = copy.deepcopy(model).requires_grad_(False).eval()
        self.net = self.copies[id(model)]
        load_state(self.net, state)
