"""Terms on the logits: restricted softmax, not-true distillation, knowledge anchors.

- `fedrs`  FedRS, Li & Zhan, KDD 2021, restricted softmax: logits of class c scaled by
           s_c = alpha + (1 - alpha) * n_c / max_c' n_c', as in the authors' code (lxcnju/FedRepo): a
           class the client lacks gets alpha, its most frequent class 1. Their code scales W h and
           leaves the bias out of the local logits; here the whole logit (bias included) is scaled,
           so the model trained is the model evaluated.
- `ntd`    FedNTD, Lee et al., NeurIPS 2022, eq. (4): beta * tau^2 * KL(q_glob || q_local) over the
           not-true classes, both softmaxes at temperature tau (tau^2 scaling and the defaults beta = 1,
           tau = 3 as in the authors' code).
- `ka`     FedKA, Chen, Zhu & Zheng, "Towards Fast and Stable Federated Learning: Confronting
           Heterogeneity via Knowledge Anchor", ACM MM 2023, eq. (2)-(3) (no released code; the paper is
           the specification). Classes are dominant / non-dominant / missing by their share of the
           client's data against gamma (Definition 1; gamma is not given: default 1/K, "at least a uniform
           share"). Each round T_i = the shared set's sample of every missing class + one random own sample
           of every non-dominant class (drawn per (seed, round, client)), randomly cut to `size` (mu = 10);
           the loss is weight * ||Phi(f_g(T)) - Phi(f_i(T))||^2 / |T|, Phi dropping the dominant classes'
           logits, f_g the round's received model (eval mode, fixed for the round), f_i the local model in
           its training mode on T as a separate small batch. beta = 0.1 by default (the paper tunes it in
           {0.5, 0.1, 0.01, 0.001}).
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcfl.regularizers.base import Frozen, Regularizer
from hpcfl.seeding import torch_generator


class RestrictedSoftmax(Regularizer):
    name = "fedrs"

    @dataclass(frozen=True)
    class Params:
        alpha: float = 0.5

    def start(self, model, client, round, received):
        counts = torch.as_tensor(client.class_counts, dtype=torch.float32, device=client.y.device)
        self.scale = self.params.alpha + (1.0 - self.params.alpha) * counts / counts.max().clamp(min=1.0)

    def logits(self, logits):
        return logits * self.scale


class NotTrueDistillation(Regularizer):
    name = "ntd"

    @dataclass(frozen=True)
    class Params:
        beta: float = 1.0
        tau: float = 3.0          # the authors' default (Lee-Gihun/FedNTD, NTD_Loss)

    def __init__(self, params):
        super().__init__(params)
        self.global_model = Frozen()

    def start(self, model, client, round, received):
        self.global_model.load(model, received["model"])

    def loss(self, model, x, y, features, logits):
        with torch.no_grad():
            teacher = self.global_model.net(x)
        not_true = ~F.one_hot(y, logits.shape[1]).bool()
        rows = y.shape[0]
        tau = self.params.tau
        local = F.log_softmax(logits[not_true].view(rows, -1) / tau, dim=1)
        target = F.softmax(teacher[not_true].view(rows, -1) / tau, dim=1)
        kl = F.kl_div(local, target, reduction="batchmean")
        return self.params.beta * tau ** 2 * kl


def class_categories(class_counts, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FedKA Definition 1: boolean masks of a client's dominant (share >= gamma), non-dominant
    (0 < share < gamma) and missing classes."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64)
    share = counts / counts.sum().clamp(min=1)
    return share >= gamma, (share > 0) & (share < gamma), share == 0


class KnowledgeAnchor(Regularizer):
    """FedKA: beta / |T| * ||logits_global(T) - logits_local(T)||^2 over the non-dominant classes' logits,
    T = the shared sample of each missing class + one random own sample of each non-dominant class."""
    name, needs_shared = "ka", True

    @dataclass(frozen=True)
    class Params:
        weight: float = 0.1           # beta
        size: int = 10                # mu: T is down-sampled to at most this many samples
        gamma: float = 0.0            # dominance threshold; 0: 1 / num_classes
        classes: str = "all"          # all | non_dominant | missing (Table 6's ablations)

        def __post_init__(self):
            if self.classes not in ("all", "non_dominant", "missing"):
                raise ValueError(f"classes = {self.classes!r}; choose 'all', 'non_dominant' or 'missing'")
            if self.size < 1 or not 0 <= self.gamma <= 1:
                raise ValueError(f"size = {self.size} must be >= 1 and gamma = {self.gamma} in [0, 1]")

    def __init__(self, params):
        super().__init__(params)
        self.global_model = Frozen()

    def categories(self, client) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts = client.class_counts
        return class_categories(counts, self.params.gamma or 1.0 / len(counts))

    def anchor(self, client, round: int, categories=None) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's knowledge anchor T_i (eq. 2), down-sampled to `size`: (x, y)."""
        _, non_dominant, missing = categories or self.categories(client)
        generator = torch_generator(self.seed, "ka", round, client.id)
        xs, ys = [], []
        if self.params.classes != "non_dominant":
            shared_x, shared_y = client.shared
            pick = missing[shared_y.cpu()].to(shared_y.device)
            xs.append(shared_x[pick])
            ys.append(shared_y[pick])
        if self.params.classes != "missing":
            for k in torch.nonzero(non_dominant).flatten().tolist():
                own = torch.nonzero(client.y == k).flatten()
                j = own[torch.randint(len(own), (1,), generator=generator).item()]
                xs.append(client.x[j:j + 1])
                ys.append(client.y[j:j + 1])
        x, y = torch.cat(xs), torch.cat(ys)
        if len(y) > self.params.size:
            keep = torch.randperm(len(y), generator=generator)[:self.params.size].sort().values.to(y.device)
            x, y = x[keep], y[keep]
        return x, y

    def start(self, model, client, round, received):
        categories = self.categories(client)
        self.x, _ = self.anchor(client, round, categories)
        self.kept = ~categories[0].to(client.y.device)
        if len(self.x):
            self.global_model.load(model, received["model"])
            with torch.no_grad():
                self.target = self.global_model.net(self.x)[:, self.kept]

    def loss(self, model, x, y, features, logits):
        if not len(self.x):
            return None
        local = model(self.x)[:, self.kept]
        return self.params.weight * ((self.target - local) ** 2).sum() / len(self.x)
