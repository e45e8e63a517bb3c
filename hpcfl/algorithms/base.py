"""The algorithm contract: what is computed, never how it travels.

An algorithm is one class holding both halves of a federated method:
- it declares a round as a sequence of `Phase`s (`plan`); each phase names the broadcast payloads
  the server sends (`downlink`) and the sum-reduced payloads clients send back (`uplink`, with
  their layouts, so that a rank hosting no sampled client can still take part in the reduction);
- server hooks run on rank 0: `init_server_state`, `downlink`, `aggregate`, `global_state`;
- client hooks run on the worker hosting the client: `init_client_state`, `client_update`.

Uplinks are *contributions* `(tensors, weight)`: the runtime adds `weight * tensors` into one
float64 buffer per payload, in a fixed client order, and the reduction sums workers' buffers. So
an algorithm sends `weight * value` (plus the scalar WEIGHT if it needs the normaliser) and divides
in `aggregate`: weighted averaging costs one reduce whatever the number of clients.
Algorithms never import MPI; the runtime and the transport never import a concrete algorithm.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np
import torch
from torch import nn

from hpcfl.config import JobConfig
from hpcfl.payload import Layout

Tensors = dict[str, torch.Tensor]
Contribution = tuple[Mapping[str, torch.Tensor], float]
ONE = torch.ones(())          # the scalar whose weighted sum is the normaliser...
WEIGHT = "#weight"            # ...under a name no torch module can give a parameter


@dataclass(frozen=True)
class Phase:
    name: str
    downlink: Mapping[str, Layout] = field(default_factory=dict)   # broadcast payloads
    uplink: Mapping[str, Layout] = field(default_factory=dict)     # sum-reduced payloads


@dataclass
class Client:
    """One client as its worker sees it: its data (on the worker's device) and persistent state."""

    id: int
    x: torch.Tensor
    y: torch.Tensor
    class_counts: np.ndarray
    state: Tensors = field(default_factory=dict)       # kept on CPU between rounds
    eval_sets: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)   # "val", "local_test"

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Setup:
    """What an algorithm may know at construction, identical on every rank."""

    job: JobConfig
    model_layout: Layout                  # state_dict layout of the model
    num_clients: int
    num_classes: int
    class_counts: np.ndarray              # clients x classes


class Algorithm:
    name: ClassVar[str]

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params: "Algorithm.Params", setup: Setup):
        self.params, self.setup = params, setup

    # -- server side (rank 0) -------------------------------------------------------------------
    def init_server_state(self, model: nn.Module) -> Tensors:
        return {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}

    def plan(self, round: int) -> list[Phase]:
        raise NotImplementedError

    def downlink(self, phase: Phase, round: int, server_state: Tensors) -> dict[str, Tensors]:
        raise NotImplementedError

    def aggregate(self, phase: Phase, round: int, server_state: Tensors, uplink: dict[str, Tensors]) -> None:
        raise NotImplementedError

    def global_state(self, server_state: Tensors) -> Tensors:
        """The global model's state_dict, for evaluation."""
        return {k[len("model."):]: v for k, v in server_state.items() if k.startswith("model.")}

    # -- client side (the worker hosting the client) ---------------------------------------------
    def init_client_state(self, client: Client) -> Tensors:
        return {}

    def client_update(self, phase: Phase, round: int, client: Client, downlink: dict[str, Tensors],
                      model: nn.Module, trainer: Any) -> tuple[dict[str, Contribution], dict[str, float]]:
        """Returns the uplink contributions by payload name and the client's metrics for the round."""
        raise NotImplementedError


def weighted_model_layout(setup: Setup) -> Layout:
    """The model's tensors plus the scalar WEIGHT: the uplink of every weighted average."""
    return setup.model_layout + Layout((WEIGHT,), ((),))


def load_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` (any dtype/device) into the model's own tensors."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])


def params_from(cls: type, raw: Mapping[str, Any], where: str):
    """Build an algorithm's Params from a config table, naming bad keys."""
    from hpcfl.errors import ConfigError

    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in [{where}]; valid: {names or 'none'}")
    try:
        return cls(**raw)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"[{where}]: {err}") from None
