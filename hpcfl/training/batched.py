"""Several clients of one worker trained as one batched computation (train.batched_clients).

A small model leaves the hardware idle on one client's batch, so a group of clients trains together:
their parameters and buffers get a leading client axis, `torch.func.vmap` runs each batch's loss
(`hpcfl.training.batch_loss`: the model, its loss terms, a second view) once for all of them (a
convolution becomes a grouped one), one backward pass gives every client's gradient, and the step is
torch.optim's SGD or Adam arithmetic on the stacked tensors.

The algorithm's own `client_update` decides what each client trains, in passes (the worker's loop). A
pass runs every update with a `Recording` trainer, which answers the `train` calls trained already and
records the first that is not: the model's state (each client's start, FedAvg's independent first round
included), the loss terms, and each term's per-client context as `start` left it (SCAFFOLD's correction,
MOON's previous model, FedFM's anchors). The recorded calls train as groups, and the next pass goes on
from their results; when a pass records nothing, the updates run for real with a `Trained` trainer,
which loads each client's trained model and metrics. Contributions, client state, terms' `finish` and
the worker's NaN/Inf checks come from the one per-client code path. So an algorithm batches when its
code before each `train` call only reads state (Traits.batched vouches for that), and a term batches
when `start` sets its per-client context as attributes and `loss` reads them or changes them in place
(Term.batchable; a `loss` that replaces one is refused, since the group writes back what it bound).

Each client sees the batches and the augmentation draws of the sequential path. At a step where the
clients' batches differ in length (an epoch's short last batch), each length trains as its own
vmapped call, so every loss is the one the client alone would compute; a client out of batches
stops. Each step equals the sequential one to float rounding, BatchNorm included (each client's
running statistics are its own), and whole runs drift apart as any two fp32 paths do (a BatchNorm
model's within a few rounds on digits: compare runs of one mode); Adam turns the rounding of a
near-zero gradient (a convolution's bias before BatchNorm) into a full step
(docs/benchmarks/gpu.md). Randomness inside the model (dropout) is drawn per client from torch's
global generator on the sequential path, which vmap cannot reproduce: such models are refused,
naming the key. A parameter the loss never reaches keeps its value and optimizer state, as
torch.optim keeps one without a gradient (Adam counts the group's steps, so one reached on only some
steps would take torch's bias correction only if reached on all). Mixed precision (train.precision =
"bf16") is refused: torch's autocast does not reach the layers under vmap. A group whose clients'
contexts cannot be stacked (a plug-in term's tensors of different shapes) trains one client at a
time from the same records, and the log says so once."""
import logging
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from hpcfl.config import JobConfig, TrainConfig
from hpcfl.errors import ConfigError
from hpcfl.models import load_state
from hpcfl.terms import TERMS, Term
from hpcfl.training import batch_loss
from hpcfl.training.graphs import StepGraphs
from hpcfl.training.recording import FrozenState, Request, as_trainer, key

LOG = logging.getLogger(__name__)
KEY = "train.batched_clients"
# layers whose output depends on their input, parameters and (BatchNorm) buffers alone, so vmap reproduces them
PLAIN_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Linear, nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
                nn.Flatten, nn.Identity, nn.BatchNorm1d, nn.BatchNorm2d)
Tensors = dict[str, torch.Tensor]


def check_job(job: JobConfig, algorithm: type, supported: list[str]) -> None:
    """Refuse, naming the key, a job whose local update cannot be recorded and replayed (`supported`: the
    algorithms that declare Traits(batched=True), for the message) or whose terms cannot run under vmap."""
    if not algorithm.traits.batched:
        raise ConfigError(f"{KEY} = {job.train.batched_clients}: algorithm '{algorithm.name}' does not vouch that "
                          "its client update only reads state before it trains, so its clients train one at a time; "
                          f"use one of {supported}, or set {KEY} = 0")
    if job.train.precision != "fp32":
        raise ConfigError(f"{KEY} = {job.train.batched_clients}: train.precision = '{job.train.precision}' trains "
                          "clients one at a time, since torch's autocast does not reach the layers under vmap "
                          f"(pytorch/pytorch#192617: they would compute in fp32); set {KEY} = 0, or "
                          "train.precision = 'fp32'")
    odd = sorted(name for name in job.algorithm.terms if not TERMS.resolve(name, "algorithm.terms").batchable)
    if algorithm.term and not algorithm.term.batchable:           # its own, from algorithm.params (FedProx's prox)
        odd.append(f"{algorithm.term.name} (algorithm '{algorithm.name}''s own)")
    if odd:
        raise ConfigError(f"{KEY} = {job.train.batched_clients}: the terms {odd} do not declare that they run "
                          f"under vmap (Term.batchable): drop them, or set {KEY} = 0")


AUTO_GROUP = 16    # 'auto' on a GPU: at most this many clients a group (memory grows with it: 16 ResNet-18s
                   # with SGD momentum hold about 2 GB of weights, gradients and buffers before activations)


def group_size(job: JobConfig, algorithm: type, models, device: torch.device) -> int:
    """How many of its sampled clients a worker trains together: train.batched_clients as given, or for
    'auto' its share of the cohort on a GPU (up to AUTO_GROUP), where a step of one small client leaves
    the device idle, if the job allows it (else the log says why), and none on a CPU, where batching is
    slower."""
    group = job.train.batched_clients
    if group != "auto":
        return group
    if device.type != "cuda":
        return 0
    try:
        check_job(job, algorithm, [])
        for model in models:
            check_model(model)
    except ConfigError as why:
        LOG.info(f"{KEY} = 'auto': clients train one after another: {why}")
        return 0
    return min(job.train.clients_per_round, AUTO_GROUP)


def check_model(model: nn.Module) -> None:
    """Refuse a model with layers whose randomness batched training would not reproduce."""
    odd = sorted({type(m).__name__ for m in model.modules()
                  if not any(m.children()) and not isinstance(m, PLAIN_LAYERS)})
    if odd:
        raise ConfigError(f"{KEY} reproduces sequential training only for models of plain layers "
                          f"({', '.join(t.__name__ for t in PLAIN_LAYERS)}); this model has {odd}: "
                          f"pick another model or set {KEY} = 0")


class Optimizer:
    """torch.optim.SGD (momentum, weight decay) or Adam, functionally, on tensors with a client axis."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.slots = ("exp_avg", "exp_avg_sq") if cfg.optimizer == "adam" else ("momentum",) if cfg.momentum else ()

    def init(self, params: Tensors) -> dict[str, Tensors]:
        return {slot: {n: torch.zeros_like(p) for n, p in params.items()} for slot in self.slots}

    def step(self, params: Tensors, grads: Tensors, state: dict[str, Tensors],
             step: torch.Tensor) -> tuple[Tensors, dict[str, Tensors]]:
        """The new parameters and state after step number `step` (1-based: clients start together, and
        every client still training has taken every step before), a tensor on the device, so that a
        captured step reads the current one."""
        cfg, new, slots = self.cfg, {}, {slot: {} for slot in self.slots}
        for n, p in params.items():
            if grads[n] is None:            # outside the loss: kept, state and all, as torch.optim does
                new[n] = p
                for slot in self.slots:
                    slots[slot][n] = state[slot][n]
                continue
            g = grads[n].add(p, alpha=cfg.weight_decay) if cfg.weight_decay else grads[n]
            if cfg.optimizer == "adam":
                beta1, beta2 = cfg.betas
                m = slots["exp_avg"][n] = state["exp_avg"][n].lerp(g, 1 - beta1)
                v = slots["exp_avg_sq"][n] = state["exp_avg_sq"][n].mul(beta2).addcmul(g, g, value=1 - beta2)
                denom = (v.sqrt() / (1 - beta2 ** step).sqrt()).add(1e-8)      # torch.optim.Adam's eps
                new[n] = p.addcdiv(m * (-cfg.lr / (1 - beta1 ** step)), denom)
                continue
            if cfg.momentum:        # torch starts the buffer at the first gradient: 0 * momentum + g is that
                g = slots["momentum"][n] = state["momentum"][n].mul(cfg.momentum).add(g)
            new[n] = p.add(g, alpha=-cfg.lr)
        return new, slots


class Unbatchable(Exception):
    """The group's contexts cannot be stacked; its clients train one at a time."""


@dataclass
class _PerClient:
    """A context value with a client axis: a tensor, a dict of tensors, or a FrozenState whose state has one."""
    value: object


def _stack(name: str, values: list):
    """One term attribute across the group's clients: the value they share, or _PerClient."""
    first = values[0]
    if isinstance(first, FrozenState):                  # a Frozen model's state: always the client's own
        return _PerClient(FrozenState(first.net, _stacked(name, [v.state for v in values])))
    if len(values) > 1 and all(v is first for v in values):     # what a term received (FedFM's anchors)
        return first
    if isinstance(first, torch.Tensor) or (isinstance(first, dict) and
                                           all(isinstance(v, torch.Tensor) for v in first.values())):
        return _PerClient(_stacked(name, values))
    try:
        same = all(type(v) is type(first) and bool(v == first) for v in values)
    except (RuntimeError, ValueError, TypeError):       # lists of tensors, arrays: no single truth to compare
        same = False
    if same:
        return first
    raise Unbatchable(f"'{name}' differs between clients and is not a tensor")


def _stacked(name: str, values: list):
    """Tensors (or dicts of them) with a new leading client axis."""
    first = values[0]
    if isinstance(first, dict):
        return {k: _stacked(f"{name}.{k}", [v[k] for v in values]) for k in first}
    if any(v.shape != first.shape for v in values):
        raise Unbatchable(f"'{name}' has shapes {sorted({tuple(v.shape) for v in values})}")
    return torch.stack(values)


def _select(tree, index: torch.Tensor | None):
    """The stacked tensors of `tree` (nested dicts) for the clients `index` (all when None)."""
    if index is None:
        return tree
    if isinstance(tree, dict):
        return {k: _select(v, index) for k, v in tree.items()}
    return tree.index_select(0, index)


def _put(tree, index: torch.Tensor | None, part) -> None:
    """`part` (the clients `index`, all when None) written into the stacked tensors of `tree`, in place:
    a group's tensors keep their storage from step to step, as a captured step needs."""
    if isinstance(tree, dict):
        for k in tree:
            _put(tree[k], index, part[k])
    elif index is not None:
        tree.index_copy_(0, index, part)
    elif part is not tree:
        tree.copy_(part)


class _Step(nn.Module):
    """The model and the terms' frozen nets as one module, so that one functional_call sets every
    parameter and buffer they read to one client's."""

    def __init__(self, model: nn.Module, nets: list[nn.Module], terms: tuple[Term, ...]):
        super().__init__()
        self.model, self.nets, self.terms = model, nn.ModuleList(nets), terms

    def forward(self, x, second, y):
        return batch_loss(self.model, self.terms, x, second, y)


class BatchedTrainer:
    """Trains a worker's recorded clients `group` at a time, each group as one computation (see the module)."""

    def __init__(self, trainer, models, group: int):
        for model in models:
            check_model(model)
        self.trainer, self.group = trainer, group
        self.said = False

    def train(self, requests: list[Request]) -> dict:
        """Every recorded call's trained model, metrics and terms' contexts, by `key`."""
        kinds = defaultdict(list)            # the same model instance, terms, part of the epochs and trainer
        for r in requests:
            kinds[r.round, id(r.model), tuple(map(id, r.terms)), r.epochs, r.seed, repr(r.cfg)].append(r)
        results = {}
        for same in kinds.values():
            for first in range(0, len(same), self.group):
                part = same[first:first + self.group]
                try:
                    results.update(self._train_group(part))
                except Unbatchable as why:
                    if not self.said:
                        LOG.info(f"{KEY}: clients {[r.client.id for r in part]} train one at a time: {why}")
                        self.said = True
                    results.update(self._train_alone(r) for r in part)
                except Exception as err:
                    err.add_note(f"hpcfl: in clients {[r.client.id for r in part]} trained together, "
                                 f"round {part[0].round + 1}")
                    raise
                finally:
                    _restore(part[0])
        return results

    def _train_alone(self, r: Request) -> tuple[tuple, tuple]:
        """One recorded call trained on its own, as the sequential path would."""
        trainer = as_trainer(self.trainer, r.seed, r.cfg)
        load_state(r.model, r.start)
        for term, ctx in zip(r.terms, r.contexts, strict=True):
            for name, value in ctx.items():
                if isinstance(value, FrozenState):
                    load_state(value.net, value.state)
                else:
                    setattr(term, name, value)
        metrics = trainer.train(r.model, r.client, r.round, r.terms, r.epochs)
        state = {k: v.detach().clone() for k, v in r.model.state_dict().items()}
        after = [{name: getattr(term, name) for name, v in ctx.items() if not isinstance(v, FrozenState)}
                 for term, ctx in zip(r.terms, r.contexts, strict=True)]
        return key(r.client, r.round, r.epochs, r.seed), (state, metrics, after, r.cfg)

    def _train_group(self, requests: list[Request]) -> dict:
        """Step t trains every client that has a t-th batch, one vmapped call per batch length."""
        group = _Group(requests, as_trainer(self.trainer, requests[0].seed, requests[0].cfg))
        for t in range(group.steps):
            for members in group.by_length(t):
                group.step(t, members)
        return group.results()


class _Group:
    """One group's stacked state while it trains: parameters, buffers, optimizer slots, the terms'
    per-client contexts, each client's batches, and its summed loss (on the device: no host reads)."""

    def __init__(self, requests: list[Request], trainer):
        first = requests[0]
        odd = [type(term).__name__ for term in first.terms if not term.batchable]
        if odd:                               # an algorithm's own extra terms, which the job check cannot see
            raise Unbatchable(f"terms {odd} are not batchable (Term.batchable)")
        self.model, self.terms, self.epochs, self.round = first.model, first.terms, first.epochs, first.round
        self.trainer, self.optimizer = trainer, Optimizer(trainer.cfg)
        self.clients, self.device = [r.client for r in requests], first.client.y.device
        contexts = [{name: _stack(f"{type(term).__name__}.{name}", [r.contexts[j][name] for r in requests])
                     for name in first.contexts[j]} for j, term in enumerate(self.terms)]
        for term, ctx in zip(self.terms, contexts, strict=True):        # what the clients share, set once
            for name, value in ctx.items():
                if not isinstance(value, _PerClient):
                    setattr(term, name, value)
        self.own = [{name: v.value for name, v in ctx.items() if isinstance(v, _PerClient)} for ctx in contexts]
        nets = {id(v.net): v.net for ctx in self.own for v in ctx.values() if isinstance(v, FrozenState)}
        self.prefix = {key: f"nets.{i}." for i, key in enumerate(nets)}
        self.module = _Step(self.model, list(nets.values()), self.terms)
        self.buffers = _stacked("model", [r.start for r in requests])
        self.params = {n: self.buffers.pop(n) for n, p in self.model.named_parameters() if p.requires_grad}
        self.slots = self.optimizer.init(self.params)
        self.plans = [trainer.plan(self.model, c, self.round, "cpu", self.epochs) for c in self.clients]
        self.augment = [trainer.augmenter(c, self.round, self.terms, self.epochs) for c in self.clients]
        self.offsets = torch.tensor([0, *[c.num_samples for c in self.clients]]).cumsum(0).tolist()
        self.x, self.y = torch.cat([c.inputs() for c in self.clients]), torch.cat([c.y for c in self.clients])
        self.totals = torch.zeros(len(self.clients), device=self.device)
        # the step number, in float64 as torch.optim.Adam's bias corrections are; the members' indices
        self.count, self.indices = torch.zeros((), dtype=torch.float64, device=self.device), {}
        self.graphs = StepGraphs() if trainer.cfg.cuda_graphs and self.device.type == "cuda" else None
        self.steps = max(map(len, self.plans))
        self.model.train()

    def by_length(self, t: int) -> list[list[int]]:
        """The clients with a t-th batch, by its length (a short last batch trains apart)."""
        lengths = defaultdict(list)
        for c, plan in enumerate(self.plans):
            if t < len(plan):
                lengths[len(plan[t])].append(c)
        return list(lengths.values())

    def loss_of(self, params, buffers, own, x, y, second):
        """One client's batch loss (under vmap: every client's), its own context bound to the terms."""
        tensors = {f"model.{n}": v for n, v in {**params, **buffers}.items()}
        for term, values, kinds in zip(self.terms, own, self.own, strict=True):
            for name, value in values.items():
                if isinstance(kinds[name], FrozenState):
                    tensors.update({self.prefix[id(kinds[name].net)] + k: v for k, v in value.items()})
                else:
                    setattr(term, name, value)
        loss = functional_call(self.module, tensors, (x, second, y))
        for term, values, kinds in zip(self.terms, own, self.own, strict=True):
            replaced = [name for name, value in values.items()
                        if not isinstance(kinds[name], FrozenState) and getattr(term, name) is not value]
            if replaced:                      # the group would lose it: it writes back what it bound
                raise ConfigError(f"loss term {type(term).__name__} replaced its attribute(s) {replaced} in `loss`; "
                                  "trained together, a term's `loss` may only read its per-client attributes or "
                                  f"change them in place (Term.batchable): do that, or set {KEY} = 0")
        return loss

    def batch(self, rows: torch.Tensor, members: list[int]):
        """The members' batches (`rows` of the group's data), as the loss takes them (augmented with each
        client's own draws)."""
        if all(a is None for a in self.augment):
            return self.x[rows], self.y[rows], None
        views = [self.trainer.views(self.x[r], self.augment[c], self.terms) for r, c in zip(rows, members, strict=True)]
        second = None if views[0][1] is None else torch.stack([v[1] for v in views])
        return torch.stack([v[0] for v in views]), self.y[rows], second

    def step(self, t: int, members: list[int]) -> None:
        """The members' t-th optimizer step: captured and replayed (train.cuda_graphs, no augmentation),
        or eager."""
        rows = torch.stack([self.plans[c][t] + self.offsets[c] for c in members]).to(self.device)
        self.count.fill_(t + 1)
        if self.graphs and all(a is None for a in self.augment):
            self.graphs.run((tuple(members), rows.shape[1]), rows, lambda r: self.update(members, r))
        else:
            self.update(members, rows)

    def update(self, members: list[int], rows: torch.Tensor) -> None:
        """One optimizer step of the members (all clients: no gathering) on their batches `rows`, their
        loss added to their sums; every tensor of the group is written in place."""
        if tuple(members) not in self.indices:
            self.indices[tuple(members)] = torch.tensor(members, device=self.device)
        index = self.indices[tuple(members)]
        part = None if len(members) == len(self.clients) else index
        x, y, second = self.batch(rows, members)
        own = [{name: _select(v.state if isinstance(v, FrozenState) else v, part) for name, v in ctx.items()}
               for ctx in self.own]
        params = {n: v.detach().requires_grad_() for n, v in _select(self.params, part).items()}
        buffers = _select(self.buffers, part)                   # BatchNorm updates its statistics in place
        with torch.enable_grad():
            loss = vmap(self.loss_of, in_dims=(0, 0, 0, 0, 0, None if second is None else 0),
                        randomness="error")(params, buffers, own, x, y, second)
            grads = dict(zip(params, torch.autograd.grad(loss.sum(), list(params.values()), allow_unused=True),
                             strict=True))
        new, slots = self.optimizer.step({n: v.detach() for n, v in params.items()}, grads,
                                         _select(self.slots, part), self.count)
        _put(self.params, part, new)
        _put(self.buffers, part, buffers)
        _put(self.slots, part, slots)
        for ctx, mine in zip(self.own, own, strict=True):                 # what `loss` updated in place
            _put({n: v for n, v in ctx.items() if not isinstance(v, FrozenState)}, part, mine)
        self.totals.index_add_(0, index, loss.detach() * y.shape[1])

    def results(self) -> dict:
        """Each client's trained model state, metrics and terms' contexts, by `key` (one host read)."""
        totals = self.totals.tolist()
        return {key(c, self.round, self.epochs, self.trainer.seed): (
                    {n: v[i] for n, v in {**self.params, **self.buffers}.items()},
                    {"train_loss": totals[i] / max(sum(len(b) for b in self.plans[i]), 1),
                     "steps": float(len(self.plans[i]))},
                    [{name: _row(v, i) for name, v in ctx.items() if not isinstance(v, FrozenState)}
                     for ctx in self.own],
                    self.trainer.cfg)
                for i, c in enumerate(self.clients)}


def _row(tree, i: int):
    """Client i's part of stacked tensors (nested dicts)."""
    return {k: _row(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]


def _restore(request: Request) -> None:
    """Give the terms back plain attributes (vmap left its per-client stand-ins on them)."""
    for term, ctx in zip(request.terms, request.contexts, strict=True):
        for name, value in ctx.items():
            if not isinstance(value, FrozenState):
                setattr(term, name, value)


