"""The algorithm contract: what is computed, never how it travels.

An algorithm is one class holding both halves of a federated method:
- it declares a round as a sequence of `Phase`s (`plan`); each phase names the broadcast payloads
  the server sends (`downlink`) and the sum-reduced payloads clients send back (`uplink`, with
  their layouts, so that a rank hosting no sampled client can still take part in the reduction);
- server hooks run on rank 0: `init_server_state`, `downlink`, `aggregate`, `global_state`, `evaluate`;
- client hooks run on the worker hosting the client: `init_client_state`, `client_update`. Local
  training goes through `train`, which adds the job's terms (hpcfl.terms) to the
  algorithm's own local terms; per-client state (`Client.state`) stays on the client's worker and
  on the CPU between rounds.

Server and client states are `State`s: tensors grouped by a declared owner, {owner: {name: tensor}}
("model" the model's state_dict, "control" SCAFFOLD's variates, "bn" a client's own BatchNorm
layers), as loss terms keep theirs under their names: a key's owner is a fact, never a prefix.

A round may also hold a swap phase (tensors go client to client) or a matching phase (a server-side
matching opens it); their hooks come with the `Swapping` and `Matching` mix-ins (hpcfl.algorithms.phases).

A phase's clients get what the round has broadcast so far (FedCME's second half trains with the
model and features of its first; FedFM's anchor phase sends the model the algorithm's phases use):
the runtime keeps a round's broadcasts, the algorithm keeps nothing of the round.

Every hook's `round` is 0-based: the first round is round 0 (`plan(0)`), the last `run.rounds - 1`.

The runtime calls these hooks directly. FedFM's anchor phase is not part of the contract: with a
feature-matching term in the job, the runtime wraps the algorithm (hpcfl.algorithms.anchored).

What the runtime may assume of an algorithm is declared in one record, `traits` (Traits). An
algorithm whose `client_update` only reads state before its `train` call declares `batched`, and its
workers may then train the sampled clients together (train.batched_clients, hpcfl.training.batched).

Uplinks are *contributions* `(tensors, weight)`: the runtime adds `weight * tensors` into one
float64 buffer per payload, in a fixed client order, and the reduction sums workers' buffers. So
an algorithm sends `weight * value` (plus the scalar WEIGHT if it needs the normaliser) and divides
in `aggregate`: weighted averaging costs one reduce whatever the number of clients.
Algorithms never import MPI; the runtime and the transport never import a concrete algorithm.
"""
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hpcfl.algorithms.phases import Phase
from hpcfl.config import JobConfig
from hpcfl.data.client import Client  # noqa: F401 - re-exported: plug-ins import it from here
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.models import load_state
from hpcfl.models.evaluation import evaluate
from hpcfl.payload import Layout
from hpcfl.terms import TERMS, Term, build_terms, matching_terms, term_params

Tensors = dict[str, torch.Tensor]
State = dict[str, Tensors]    # owner -> its tensors by name
Contribution = tuple[Mapping[str, torch.Tensor], float]
ONE = torch.ones(())          # the scalar whose weighted sum is the normaliser...
WEIGHT = "#weight"            # ...under a name no torch module can give a parameter


@dataclass(frozen=True)
class Setup:
    """What an algorithm may know at construction, identical on every rank."""

    job: JobConfig
    model_layout: Layout                  # state_dict layout of the model
    num_clients: int
    num_classes: int
    class_counts: np.ndarray              # clients x classes
    parameter_names: tuple[str, ...]      # state_dict entries that are trained (the rest are buffers)
    norm_names: tuple[str, ...] = ()      # state_dict entries of BatchNorm layers (weights and statistics)
    test_size: int = 0                    # samples in the global test set
    feature_dim: int = 0                  # width of features(x)
    template: nn.Module | None = field(default=None, repr=False)   # the model, freshly initialised
    terms: Mapping[str, Any] = field(default_factory=dict)         # algorithm.terms: name -> the term's Params

    @classmethod
    def of(cls, job: JobConfig, model: nn.Module, class_counts: np.ndarray, test_size: int = 0,
           terms: Mapping[str, Any] | None = None) -> "Setup":
        """`terms`: the job's terms resolved (hpcfl.jobs.resolve, as set-up has them), else read here."""
        terms = terms if terms is not None else {n: term_params(n, raw) for n, raw in job.algorithm.terms.items()}
        norms = tuple(f"{m}.{t}" if m else t for m, module in model.named_modules()
                      if isinstance(module, nn.modules.batchnorm._BatchNorm)
                      for t, _ in module.state_dict().items())
        return cls(job, Layout.of(model.state_dict()), class_counts.shape[0], class_counts.shape[1], class_counts,
                   tuple(n for n, _ in model.named_parameters()), norms, test_size,
                   getattr(getattr(model, "classifier", None), "in_features", 0), model, dict(terms))

    @property
    def parameter_layout(self) -> Layout:
        return self.model_layout.select(set(self.parameter_names).__contains__)


@dataclass(frozen=True)
class Traits:
    """What the runtime may assume of an algorithm. A subclass that declares no `traits` inherits its
    parent's but `batched` and `stateless`: those vouch for the class's own client_update, so each
    class that keeps them says so (`traits = Parent.traits.but(...)` or a new Traits)."""
    client_test: bool = False     # clients get the global test set as Client.test_set
    sgd_only: str = ""            # why the algorithm needs train.optimizer = "sgd", if it does
    shared_batchnorm: str = ""    # why it needs model.batchnorm = "average" (clients starting from the received
                                  # model, BatchNorm layers included), if it does
    anchor_phase: bool = True     # a feature-matching term wraps it in FedFM's anchor phase (anchored.py)
    global_model: bool = True     # False: no single global model (local-only, ensemble)
    heterogeneous: bool = False   # clients may have different architectures (model.architectures)
    batched: bool = False         # client_update only reads state before it calls self.train (it runs twice: a
                                  # first run records what it trains), so a worker may train its clients together
    stateless: bool = False       # its clients keep nothing between rounds (no client.state, swaps or
                                  # matching), so any worker may train any client

    def but(self, **changes) -> "Traits":
        return dataclasses.replace(self, **changes)


class Algorithm:
    """The contract of an algorithm: a round as phases, each with a client half (train, contribute) and a
    server half (aggregate); docs/how-to/write-your-own-algorithm.md builds one."""
    name: ClassVar[str]
    traits: ClassVar[Traits] = Traits()
    term: ClassVar[type[Term] | None] = None    # an own local term built from the algorithm's Params (FedProx's
                                                # prox), which shapes the model as algorithm.terms do

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        loose = [f.name for f in dataclasses.fields(Traits) if f.name in cls.__dict__]
        if loose:                               # the class flags of earlier releases would be ignored silently
            raise TypeError(f"{cls.__qualname__} sets {', '.join(loose)} as class attributes: declare them in its "
                            f"traits record, traits = Traits({', '.join(f'{n}=...' for n in loose)}) (hpcfl.Traits)")
        if "traits" not in cls.__dict__:
            cls.traits = cls.traits.but(batched=False, stateless=False)

    @classmethod
    def moves_clients(cls, job: JobConfig) -> bool:
        """Whether this job deals each round's sampled clients to any worker: run.placement is not
        'fixed', and the algorithm is stateless, its terms keep no state and BatchNorm is shared."""
        terms = [*job.algorithm.terms, *([cls.term.name] if cls.term else [])]
        return (job.run.placement != "fixed" and cls.traits.stateless and job.model.batchnorm != "local"
                and not any(TERMS[n].keeps_state for n in terms))

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params: "Algorithm.Params", setup: Setup):
        self.params, self.setup = params, setup
        self.terms: list[Term] = build_terms(setup.terms, setup.job.run.seed)

    @classmethod
    def check(cls, job: JobConfig) -> None:
        """Rules on the whole job beyond the parameters' own types; raise ConfigError naming the fix."""
        if cls.traits.sgd_only and job.train.optimizer != "sgd":
            raise ConfigError(f"algorithm '{cls.name}' needs train.optimizer = \"sgd\": {cls.traits.sgd_only}")
        if cls.traits.shared_batchnorm and job.model.batchnorm == "local":
            raise ConfigError(f"algorithm '{cls.name}' needs model.batchnorm = \"average\": "
                              f"{cls.traits.shared_batchnorm}, and a client with local BatchNorm layers (FedBN) "
                              "starts from its own")
        if len(job.architectures) > 1 and not cls.traits.heterogeneous:
            raise ConfigError(f"algorithm '{cls.name}' shares whole models, so every client needs the same one: "
                              f"model.architectures = {list(job.architectures)} needs an algorithm for "
                              "heterogeneous clients (fedclassavg, fedproto, local_only, ensemble)")
        own = [cls.term.name] if cls.term else []           # a preset's own term (FedFM's fm_cg) counts too
        matching = [*(own if cls.term and cls.term.needs_anchors else []),
                    *(name for name in matching_terms(job.algorithm.terms) if name not in own)]
        if len(matching) > 1:
            brings = f" (algorithm '{cls.name}' brings '{own[0]}' itself)" if own and own[0] in matching else ""
            raise ConfigError(f"algorithm.terms has {matching}: use one feature-matching term{brings}")
        if job.run.placement == "per_round" and not cls.moves_clients(job):
            raise ConfigError(f"run.placement = 'per_round' deals each round's clients to any worker, but with "
                              f"algorithm '{cls.name}' (its terms, model.batchnorm) clients keep state from "
                              "round to round on their worker: use run.placement = 'auto' or 'fixed'")

    def receive(self, phase: Phase, round: int, downlink: dict[str, Tensors]) -> None:
        """Every worker rank, once per phase, whether or not it hosts a sampled client (what the
        round has broadcast so far, as client_update gets it; FedMA's matched layer, FedFM-Lite's
        latest model)."""

    # -- server side (rank 0) -------------------------------------------------------------------
    def init_server_state(self, model: nn.Module) -> State:
        """The server's state before round 0, made once on rank 0: the freshly initialised `model`'s
        state_dict copied under the owner "model", where `global_state` finds it. Override to add the
        server's own tensors under owners of their own (SCAFFOLD's "control", FedOpt's "moment1");
        they are checkpointed with it."""
        return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}}

    def plan(self, round: int) -> list[Phase]:
        raise NotImplementedError

    def downlink(self, phase: Phase, round: int, server_state: State) -> dict[str, Tensors]:
        raise NotImplementedError

    def aggregate(self, phase: Phase, round: int, server_state: State, uplink: dict[str, Tensors]) -> None:
        raise NotImplementedError

    def global_state(self, server_state: State) -> Tensors:
        """The global model's state_dict."""
        return server_state["model"]

    def global_module(self, server_state: State, model: nn.Module) -> nn.Module:
        """The global model as a module (`model` loaded with it, unless its shape changes, as FedMA's)."""
        load_state(model, self.global_state(server_state))
        return model

    def evaluate(self, server_state: State, model: nn.Module, x, y, batch_size: int) -> dict | None:
        """The server's model on the global test set (None for an algorithm without one)."""
        return evaluate(self.global_module(server_state, model), x, y, self.setup.num_classes, batch_size)

    def carried_state(self) -> Tensors:
        """What this object carries from round to round on every rank, beyond the server's and the
        clients' states (FedMA's global widths); checkpoints keep the server's (rank 0's) and give it
        back to every rank, so it must be the same on every rank, or set on the server (in `downlink`,
        as FedFM-Lite keeps its latest model), never only on the workers."""
        return {}

    def load_carried_state(self, state: Tensors) -> None:
        """Take back `carried_state()` from a checkpoint."""

    def server_metrics(self, server_state: State) -> dict[str, float]:
        """Extra per-round figures of the server's state, recorded as round/<key>."""
        return {}

    # -- client side (the worker hosting the client) ---------------------------------------------
    def client_model(self, client: Client, model: nn.Module) -> nn.Module:
        """The module the client trains this phase: the worker's shared instance of its architecture
        (FedMA: a copy it may resize)."""
        return model

    def init_client_state(self, client: Client, initial_model: nn.Module) -> State:
        """The client's state before round 0 ({owner: {name: tensor}}); `initial_model` is the freshly
        initialised model."""
        return {}

    def client_update(self, phase: Phase, round: int, client: Client, downlink: dict[str, Tensors],
                      model: nn.Module, trainer: Any) -> tuple[dict[str, Contribution], dict[str, float]]:
        """Returns the uplink contributions by payload name and the client's metrics for the round.
        `downlink`: what the round has broadcast so far, by payload (a phase's own replace earlier
        ones of the same name), so a phase without a downlink works with the round's model."""
        raise NotImplementedError

    def start_from(self, model: nn.Module, client: Client, state: Mapping[str, torch.Tensor]) -> None:
        """Load a received model; with model.batchnorm = "local" the client keeps its own BN layers."""
        load_state(model, {**state, **client.state.get("bn", {})})

    def train(self, model: nn.Module, client: Client, round: int, trainer, received: Mapping[str, Tensors],
              extra: tuple[Term, ...] = (), epochs: range | None = None) -> dict[str, float]:
        """Local training with the configured terms (plus the algorithm's own `extra` terms);
        `received` holds what the client got this round, received["model"] the model it started from;
        `epochs`: a part of the local epochs (FedCME trains a round in two)."""
        terms = [*self.terms, *extra]
        if "model" in received and client.state.get("bn"):      # what it started from: its own BatchNorm layers
            received = {**received, "model": {**received["model"], **client.state["bn"]}}
        for term in terms:
            term.start(model, client, round, received)
        metrics = trainer.train(model, client, round, terms, epochs)
        for term in terms:
            term.finish(model, client)
        if self.setup.job.model.batchnorm == "local":
            client.state["bn"] = {k: v.detach().clone() for k, v in model.state_dict().items()
                                  if k in self.setup.norm_names}
        return metrics


def check_job(cls: type[Algorithm], job: JobConfig) -> None:
    """The job's rules for algorithm `cls`: those its traits imply (`Algorithm.check`), then its own
    `check`, which cannot switch the first off by not calling super().check."""
    Algorithm.check.__func__(cls, job)
    if cls.check.__func__ is not Algorithm.check.__func__:
        cls.check(job)


def weighted(layout: Layout) -> Layout:
    """`layout` plus the scalar WEIGHT: the uplink of every weighted average."""
    return layout + Layout((WEIGHT,), ((),))


def weighted_mean(sums: Mapping[str, torch.Tensor]) -> Tensors | None:
    """Summed contributions divided by their summed WEIGHT, in place (they are the phase's fresh reduce
    buffers, and a model-sized copy would cost the server 2x the model in float64); None when nobody
    contributed."""
    total = float(sums[WEIGHT])
    if total == 0.0:
        return None
    return {name: value.div_(total) for name, value in sums.items() if name != WEIGHT}


def owned(state: State, hook: str) -> State:
    """`state` as it is, if it groups its tensors by owner; else the error that names the fix (a plug-in
    written for flat names)."""
    loose = [owner for owner, tensors in state.items() if not isinstance(tensors, Mapping)]
    if loose:
        raise HpcflError(f"{hook} returned {loose[:3]} as tensors of their own: a state groups its tensors by "
                         "owner, {'model': {name: tensor}, 'control': {...}} (hpcfl.algorithms.base.State)")
    return state


def finite(tensors) -> bool:
    """Whether every element of `tensors` is finite, in one host sync. A float64 sum is NaN/Inf exactly
    when some element is (float32 values cannot overflow it), and reads each tensor once: 5x faster
    than isfinite(t).all() on ResNet-18 (6 vs 29 ms). Integer tensors are finite."""
    sums = [t.sum(dtype=torch.float64) for t in tensors if t.is_floating_point()]
    device = next((s.device for s in sums if s.device.type != "cpu"), torch.device("cpu"))   # where the model is
    return bool(torch.stack([s.to(device) for s in sums]).isfinite().all()) if sums else True


def assign(tensors: Tensors, values: Mapping[str, torch.Tensor]) -> None:
    """tensors[name] <- value in place, rounding for integer buffers (BatchNorm's step counter)."""
    for name, value in values.items():
        target = tensors[name]
        target.copy_(value if target.is_floating_point() else torch.round(value))    # copy_ converts, no temporary

