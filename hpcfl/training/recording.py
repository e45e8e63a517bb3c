"""The record-and-replay side of training clients together (hpcfl.training.batched): a worker runs each
sampled client's update in passes with a `Recording` trainer, which answers the `train` calls trained
already and records the first that is not (`Request`), then for real with a `Trained` trainer, which
loads each call's trained model. A call is named by `key`; its trainer is the one the algorithm made,
whose seed and settings it may change on a copy (FedClassAvg's warm-up, FedMA's last-layer lr)."""
import copy
from dataclasses import dataclass

import torch
from torch import nn

from hpcfl.config import TrainConfig
from hpcfl.terms import Frozen, Term

Tensors = dict[str, torch.Tensor]


class Recorded(BaseException):
    """Ends a client_update's recording pass at a `train` call (not an Exception: no handler swallows it)."""


@dataclass
class Request:
    """What one client's `train` call would train."""
    client: object
    round: int                           # what the call passed: FedClassAvg's warm-up trains as round 0
    model: nn.Module
    start: Tensors                       # the model's state_dict at the call
    terms: tuple[Term, ...]
    contexts: list[dict]                 # each term's attributes after its `start` (a Frozen as its net's state)
    epochs: range | None
    seed: int                            # the trainer's, which an algorithm may change on a copy of it
    cfg: TrainConfig                     # (FedClassAvg's warm-up draws, FedMA's last-layer lr)


def context(term: Term) -> dict:
    """A term's attributes as its `start` left them; `start` assigns new tensors, but a Frozen model is
    loaded in place, so its state is copied."""
    return {name: (FrozenState(value.net, {k: v.clone() for k, v in value.net.state_dict().items()})
                   if isinstance(value, Frozen) and value.net is not None else value)
            for name, value in vars(term).items()}


@dataclass
class FrozenState:
    """A Frozen model's net and one client's (or, stacked, every client's) state for it."""
    net: nn.Module
    state: Tensors


def as_trainer(trainer, seed: int, cfg: TrainConfig):
    """`trainer` with another seed and settings (the trainer an algorithm made from a copy of its own)."""
    if (seed, cfg) == (trainer.seed, trainer.cfg):
        return trainer
    other = copy.copy(trainer)
    other.seed, other.cfg = seed, cfg
    return other


def key(client, round: int, epochs: range | None, seed: int) -> tuple:
    """One `train` call of a client_update: FedClassAvg's warm-up and its round's training are two."""
    return client.id, round, epochs, seed


class Trained:
    """A trainer that answers a client's `train` call with the model its group trained (`results`, by
    `key`), with this trainer's seed and settings, which an algorithm may change on a copy of it."""

    def __init__(self, trainer, results: dict):
        self.results, self.trainer = results, trainer
        self.seed, self.cfg = trainer.seed, trainer.cfg
        self.answered = set()                # keys this pass answered: shared by copies, one per call

    def train(self, model: nn.Module, client, round: int, terms=(), epochs=None) -> dict[str, float]:
        call = key(client, round, epochs, self.seed)
        if call in self.answered:
            raise RuntimeError(f"client {client.id}'s update called train twice alike (round {round}, epochs "
                               f"{epochs}, seed {self.seed}): trained together the second call would get the first's "
                               "model; give it its own epochs or seed (on a copy of the trainer), or set "
                               "train.batched_clients = 0")
        self.answered.add(call)
        found = self.results.get(call)
        if found is None or found[3] != self.cfg:
            return self.missing(model, client, round, terms, epochs)
        state, metrics, contexts, _ = found
        model.train()
        with torch.no_grad():
            for name, value in model.state_dict().items():
                value.copy_(state[name])
        for term, context in zip(terms, contexts, strict=True):   # what training left in them (FedCME's sums)
            for name, value in context.items():
                setattr(term, name, value)
        return dict(metrics)

    def missing(self, model, client, round, terms, epochs) -> dict[str, float]:
        return as_trainer(self.trainer, self.seed, self.cfg).train(model, client, round, terms, epochs)


class Recording(Trained):
    """The trainer of a recording pass: answers the calls trained already, records the first that is
    not (with the model's state and the terms' contexts), then ends the client_update."""

    def __init__(self, trainer, results: dict):
        super().__init__(trainer, results)
        self.requests: list[Request] = []

    def missing(self, model, client, round, terms, epochs):
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.requests.append(Request(client, round, model, start, tuple(terms), [context(t) for t in terms],
                                     epochs, self.seed, self.cfg))
        raise Recorded
