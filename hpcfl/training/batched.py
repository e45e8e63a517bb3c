"""Several clients of one worker trained as one batched computation (train.batched_clients).

A small model leaves the hardware idle on one client's batch, so a group of clients trains together:
their parameters get a leading client axis, `torch.func.vmap` runs the model once for all of them
(a convolution becomes a grouped one), one backward pass gives every client's gradient, and the
step is torch.optim's SGD or Adam arithmetic on the stacked tensors. Each client sees the batches of
the sequential path (LocalTrainer.batches) and, with crop_flip, the same augmentation draws: a
short last batch is padded with masked samples, so its loss stays the mean over real ones, and a
client out of batches is masked whole, its parameters and optimizer state keeping their values.
`Trained` then stands in for the trainer in the algorithm's own client_update, so contributions,
metrics and the worker's NaN/Inf checks come from the one per-client code path.

The results equal the sequential ones to float rounding only for plain training: cross-entropy
without local loss terms, on a model without randomness or running statistics (dropout,
BatchNorm). Jobs that are more than that are refused, naming the key.
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from hpcfl.config import JobConfig, TrainConfig
from hpcfl.data.augment import random_crop_flip
from hpcfl.errors import ConfigError
from hpcfl.seeding import torch_generator

KEY = "train.batched_clients"
# layers whose output depends on their input and parameters alone, so vmap reproduces them exactly
PLAIN_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Linear, nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
                nn.Flatten, nn.Identity)
Tensors = dict[str, torch.Tensor]


def check_job(job: JobConfig, algorithm: type, supported: list[str]) -> None:
    """Refuse, naming the key, a job whose local training is more than plain training from the global model
    (`supported`: the algorithms that declare Traits(batched=True), for the message)."""
    if not algorithm.traits.batched:
        raise ConfigError(f"{KEY} = {job.train.batched_clients}: algorithm '{algorithm.name}' does more than plain "
                          "training from the global model (local terms, per-client models or training in parts), so "
                          f"its clients train one at a time; use one of {supported}, or set {KEY} = 0")
    if job.algorithm.terms:
        raise ConfigError(f"{KEY} = {job.train.batched_clients} trains plain cross-entropy: drop "
                          f"algorithm.terms {sorted(job.algorithm.terms)}, or set {KEY} = 0")


def check_model(model: nn.Module) -> None:
    """Refuse a model with layers whose randomness or statistics batched training would not reproduce."""
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

    def step(self, params: Tensors, grads: Tensors, state: dict[str, Tensors], step: int,
             active: torch.Tensor | None = None) -> tuple[Tensors, dict[str, Tensors]]:
        """The new parameters and state after step number `step` (1-based, shared: clients start together
        and one out of batches never resumes); clients not `active` keep theirs."""
        cfg, new, slots = self.cfg, {}, {slot: {} for slot in self.slots}
        for n, p in params.items():
            g = grads[n].add(p, alpha=cfg.weight_decay) if cfg.weight_decay else grads[n]
            if cfg.optimizer == "adam":
                beta1, beta2 = cfg.betas
                m = slots["exp_avg"][n] = state["exp_avg"][n].lerp(g, 1 - beta1)
                v = slots["exp_avg_sq"][n] = state["exp_avg_sq"][n].mul(beta2).addcmul(g, g, value=1 - beta2)
                denom = (v.sqrt() / (1 - beta2 ** step) ** 0.5).add(1e-8)      # torch.optim.Adam's eps
                new[n] = p.addcdiv(m, denom, value=-cfg.lr / (1 - beta1 ** step))
                continue
            if cfg.momentum:        # torch starts the buffer at the first gradient: 0 * momentum + g is that
                g = slots["momentum"][n] = state["momentum"][n].mul(cfg.momentum).add(g)
            new[n] = p.add(g, alpha=-cfg.lr)
        if active is None:
            return new, slots
        return ({n: _keep(active, new[n], params[n]) for n in new},
                {s: {n: _keep(active, t, state[s][n]) for n, t in by_name.items()} for s, by_name in slots.items()})


def _keep(active: torch.Tensor, now: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """`now` for the active clients (first axis), `old` for the others."""
    return torch.where(active.view(-1, *[1] * (now.dim() - 1)), now, old)


class BatchedTrainer:
    """Trains a worker's clients `group` at a time, each group as one computation (see the module)."""

    def __init__(self, trainer, model: nn.Module, group: int):
        check_model(model)
        self.trainer, self.model, self.group = trainer, model, group
        self.optimizer = Optimizer(trainer.cfg)
        self.forward = vmap(lambda params, x: functional_call(model, params, (x,)))

    def train(self, clients: list, round: int, start: Tensors) -> "Trained":
        """Every client's local training of `round` from the model state `start`."""
        results = {}
        for first in range(0, len(clients), self.group):
            part = clients[first:first + self.group]
            try:
                results.update(self._train_group(part, round, start))
            except Exception as err:
                err.add_note(f"hpcfl: in clients {[c.id for c in part]} trained together, round {round + 1}")
                raise
        return Trained(results)

    def _train_group(self, clients: list, round: int, start: Tensors) -> dict[int, tuple[Tensors, dict]]:
        """Step t trains every client on its t-th batch; returns each client's parameters and metrics."""
        cfg, device, size = self.trainer.cfg, clients[0].y.device, len(clients)
        index, mask = self._plan(clients, round)
        lengths = mask.sum(2)                                   # step x client: real samples, 0 once out of batches
        index, mask, counts, active = index.to(device), mask.to(device), lengths.to(device), (lengths > 0).to(device)
        x, y = torch.cat([c.inputs() for c in clients]), torch.cat([c.y for c in clients])
        params = {n: start[n].to(device, p.dtype).expand(size, *p.shape).clone()
                  for n, p in self.model.named_parameters()}
        state = self.optimizer.init(params)
        augment = ([torch_generator(self.trainer.seed, "augment", round, c.id, device=device) for c in clients]
                   if cfg.augment == "crop_flip" else None)
        total = torch.zeros(size, device=device)
        for t, real in enumerate(lengths.tolist()):
            xt, yt = x[index[t]], y[index[t]]
            for c, n in enumerate(real if augment else ()):
                if n:
                    xt[c, :n] = random_crop_flip(xt[c, :n], augment[c])
            loss, grads = self._gradients(params, xt, yt, mask[t], counts[t])
            params, state = self.optimizer.step(params, grads, state, t + 1, None if all(real) else active[t])
            total += loss * counts[t]
        seen, steps = lengths.sum(0).tolist(), (lengths > 0).sum(0).tolist()
        return {c.id: ({n: p[i] for n, p in params.items()},
                       {"train_loss": loss_sum / max(seen[i], 1), "steps": float(steps[i])})
                for i, (c, loss_sum) in enumerate(zip(clients, total.tolist(), strict=True))}

    def _plan(self, clients: list, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step x client x batch_size indices into the group's concatenated data, from each client's
        own index batches, and the mask of real samples (padding points at the client's first sample)."""
        batches = [self.trainer.batches(c.num_samples, round, c.id, "cpu") for c in clients]
        shape = (max(map(len, batches)), len(clients), self.trainer.cfg.batch_size)
        index, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.bool)
        offset = 0
        for c, (client, own) in enumerate(zip(clients, batches, strict=True)):
            index[:, c] = offset
            for t, idx in enumerate(own):
                index[t, c, :len(idx)] = idx + offset
                mask[t, c, :len(idx)] = True
            offset += client.num_samples
        return index, mask

    def _gradients(self, params: Tensors, x, y, mask, counts) -> tuple[torch.Tensor, Tensors]:
        """Each client's mean loss over its real samples, and its gradients, from one backward pass
        (a masked entry is selected away, so a padded sample's Inf loss cannot turn the mean NaN)."""
        params = {n: p.requires_grad_() for n, p in params.items()}
        with torch.enable_grad():
            logits = self.forward(params, x)
            per_sample = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
            loss = torch.where(mask, per_sample, 0.0).sum(1) / counts.clamp(min=1)
            grads = torch.autograd.grad(loss.sum(), list(params.values()))
        return loss.detach(), dict(zip(params, grads, strict=True))


class Trained:
    """Stands in for the trainer in an algorithm's client_update: loads the model its group trained."""

    def __init__(self, results: dict[int, tuple[Tensors, dict]]):
        self.results = results

    def train(self, model: nn.Module, client, round: int, terms=(), epochs=None) -> dict[str, float]:
        assert not terms and epochs is None, "batched clients train without local terms, every epoch at once"
        params, metrics = self.results.pop(client.id)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(params[name])
        return dict(metrics)
