"""Terms on the logits: restricted softmax, not-true distillation, knowledge anchors.

- `fedrs`  FedRS, Li & Zhan, KDD 2021, restricted softmax: logits of class c scaled by
           s_c = alpha + (1 - alpha) * n_c / max_c' n_c', as in the authors' code (lxcnju/FedRepo): a
           class the client lacks gets alpha, its most frequent class 1 (the scaling of the classes a
           client holds by their counts is the code's; the paper restricts the classes it lacks). The
           paper's logit is w_c^T h, with no bias. `bias` says what happens to the classifier's bias
           b_c: "scale" (default, ours): s_c (w_c^T h + b_c), the paper's rule with the bias read as a
           weight on a constant feature; "drop": s_c w_c^T h, the bias left out of the local logits, as
           the authors' code does (it multiplies h W^T by s and adds no bias; the bias gets no gradient
           from the task loss, and the evaluated model still adds it); "keep": s_c w_c^T h + b_c, only
           w^T h restricted.
- `ntd`    FedNTD, Lee et al., NeurIPS 2022, eq. (4)-(5): beta * KL(q_glob || q_local) over the not-true
           classes, both softmaxes at temperature tau, averaged over the batch, with no tau^2 factor, as
           in the authors' NTD_Loss (Lee-Gihun/FedNTD); defaults beta = 1, tau = 1 as in the paper's
           experiments and the authors' config (config/fedntd.json; the NTD_Loss class itself defaults
           to tau = 3, which the config overrides). The global model (the teacher) runs in eval mode
           (our choice; the authors' copy keeps the mode the model was in: with BatchNorm or dropout its
           teacher uses batch statistics or drops units).
- `ka`     FedKA, Chen, Zhu & Zheng, "Towards Fast and Stable Federated Learning: Confronting
           Heterogeneity via Knowledge Anchor", ACM MM 2023, eq. (2)-(3) (no released code; the paper is
           the specification). Classes are dominant / non-dominant / missing by their share of the
           client's data against gamma (Definition 1; gamma is not given: default 1/K, "at least a uniform
           share"). Each round T_i = the shared set's sample of every missing class + one random own sample
           of every non-dominant class (drawn per (seed, round, client)), randomly cut to `size` (mu = 10);
           the loss is weight * D(Phi(f_g(T)), Phi(f_i(T))), Phi dropping the dominant classes' logits, f_g
           the round's received model, fixed for the round. D: reduction = "sum" is eq. 3 as printed,
           ||.||^2 summed over the kept logits / |T|; "mean" (default, ours) is the element-wise mean, i.e.
           "sum" / |kept classes|, so the same weight (beta) is |kept| times weaker: 9 on CIFAR-10 with one
           dominant class, ~99 on CIFAR-100. We default to "mean": under "sum" a beta's strength grows with
           the number of kept classes (so it differs between clients and data sets), where "mean" (what
           an MSELoss computes) keeps one beta meaning the same everywhere.
           Both models run on T in eval mode (our choice; the paper does not say): BatchNorm normalises T
           with its running statistics and does not update them (a separate batch of T's 1-10 samples in
           training mode would pull the statistics towards T's at every step, and a batch of one fails in
           BatchNorm1d), dropout is off, and the local model computes T's logits as the global one did, so
           the term is 0 at the round's start (to bf16's rounding under train.precision = "bf16", where
           the local logits run under autocast and the targets, taken before, in fp32) and measures only
           what local training changed; gradients
           flow as usual. Concatenating T to each batch would instead mix T into the batch's
           normalisation and statistics and still compare training-mode with eval-mode logits. beta =
           0.1 by default (the paper tunes it in {0.5, 0.1, 0.01, 0.001}).
           Implementation, ours: T is padded to `size` rows and the padding masked out (every client's
           T then has one shape, so clients train together under vmap); the loss is the same to
           rounding, and 0 (no gradient) where T is empty.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcfl.data.splits import class_categories
from hpcfl.seeding import torch_generator
from hpcfl.terms.base import Frozen, Term


class RestrictedSoftmax(Term):
    """FedRS's restricted softmax: each class's logit scaled by alpha + (1 - alpha) n_c / max n (a class
    the client lacks: alpha; its most frequent: 1)."""
    batchable = True
    name = "fedrs"

    @dataclass(frozen=True)
    class Params:
        alpha: float = 0.5            # the scale of a class the client does not hold (others: up to 1 by count)
        bias: str = "scale"           # scale: s (w^T h + b) | drop: s w^T h (the authors' code) | keep: s w^T h + b

        def __post_init__(self):
            if not 0 <= self.alpha <= 1:
                raise ValueError(f"alpha = {self.alpha} must be in [0, 1] (1: plain softmax)")
            if self.bias not in ("scale", "drop", "keep"):
                raise ValueError(f"bias = {self.bias!r}; choose 'scale', 'drop' (the authors' code) or 'keep'")

    def start(self, model, client, round, received):
        counts = torch.as_tensor(client.class_counts, dtype=torch.float32, device=client.y.device)
        self.scale = self.params.alpha + (1.0 - self.params.alpha) * counts / counts.max().clamp(min=1.0)
        layer = getattr(model.classifier, "out", model.classifier)     # the Linear that gives the logits
        self.layer = None if self.params.bias == "scale" or layer.bias is None else layer  # its bias read per batch

    def logits(self, logits):
        if self.layer is None:            # bias = "scale" (or a classifier without a bias)
            return logits * self.scale
        bias = self.layer.bias.to(logits.dtype)       # in the logits' precision, so that b's gradient cancels
        restricted = (logits - bias) * self.scale     # exactly under bf16 too: s_c w_c^T h
        return restricted + bias if self.params.bias == "keep" else restricted


class NotTrueDistillation(Term):
    """FedNTD's not-true distillation: KL to the global model's softmax over the classes other than the label."""
    batchable = True
    name = "ntd"

    @dataclass(frozen=True)
    class Params:
        beta: float = 1.0         # the distillation term's weight
        tau: float = 1.0          # the distillation temperature: the paper's and the authors' config (their
                                  # NTD_Loss class defaults to 3)

        def __post_init__(self):
            if self.tau <= 0 or self.beta < 0:
                raise ValueError(f"tau = {self.tau} must be > 0 and beta = {self.beta} >= 0 (FedNTD: both 1)")

    def __init__(self, params):
        super().__init__(params)
        self.global_model = Frozen()

    def start(self, model, client, round, received):
        self.global_model.load(model, received["model"])

    def loss(self, model, x, y, features, logits):
        with torch.no_grad():
            teacher = self.global_model.net(x)
        others = torch.arange(logits.shape[1] - 1, device=y.device)
        not_true = others + (others >= y[:, None])          # each row's classes but its label, in order
        tau = self.params.tau
        local = F.log_softmax(logits.gather(1, not_true) / tau, dim=1)
        target = F.softmax(teacher.gather(1, not_true) / tau, dim=1)
        kl = torch.special.xlogy(target, target) - target * local      # F.kl_div's terms (it has no vmap rule)
        return self.params.beta * kl.sum() / len(y)


class KnowledgeAnchor(Term):
    """FedKA: beta * the squared distance between the global and the local model's logits on T over the
    non-dominant and missing classes (summed / |T|, or the element-wise mean), T = the shared sample of
    each missing class + one random own sample of each non-dominant class."""
    batchable = True
    name, needs_shared = "ka", True

    @dataclass(frozen=True)
    class Params:
        weight: float = 0.1           # beta
        size: int = 10                # mu: T is down-sampled to at most this many samples
        gamma: float = 0.0            # dominance threshold; 0: 1 / num_classes
        classes: str = "all"          # all | non_dominant | missing (Table 6's ablations)
        reduction: str = "mean"       # mean: element-wise | sum: eq. 3 as printed (beta |kept classes| times stronger)

        def __post_init__(self):
            if self.classes not in ("all", "non_dominant", "missing"):
                raise ValueError(f"classes = {self.classes!r}; choose 'all', 'non_dominant' or 'missing'")
            if self.reduction not in ("mean", "sum"):
                raise ValueError(f"reduction = {self.reduction!r}; choose 'mean' or 'sum' (eq. 3 as printed)")
            if self.weight < 0:
                raise ValueError(f"weight = {self.weight} must be >= 0 (beta; the paper tunes it in [0.001, 0.5])")
            if self.size < 1 or not 0 <= self.gamma <= 1:
                raise ValueError(f"size = {self.size} must be >= 1 and gamma = {self.gamma} in [0, 1]")

    def __init__(self, params):
        super().__init__(params)
        self.global_model = Frozen()

    def categories(self, client) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts = client.class_counts
        return tuple(map(torch.from_numpy, class_categories(counts, self.params.gamma or 1.0 / len(counts))))

    def anchor(self, client, round: int, categories=None) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's knowledge anchor T_i (eq. 2), down-sampled to `size`: (x, y)."""
        _, non_dominant, missing = categories or self.categories(client)
        generator = torch_generator(self.seed, "ka", round, client.id)
        none = client.y[:0]                          # T is empty when no class is missing or non-dominant
        xs, ys = [client.inputs(none)], [none]
        if self.params.classes != "non_dominant":
            shared_x, shared_y = client.shared
            pick = missing[shared_y.cpu()].to(shared_y.device)
            xs.append(shared_x[pick])
            ys.append(shared_y[pick])
        if self.params.classes != "missing":
            for k in torch.nonzero(non_dominant).flatten().tolist():
                own = torch.nonzero(client.y == k).flatten()
                j = own[torch.randint(len(own), (1,), generator=generator).item()]
                xs.append(client.inputs(j.view(1)))
                ys.append(client.y[j:j + 1])
        x, y = torch.cat(xs), torch.cat(ys)
        if len(y) > self.params.size:
            keep = torch.randperm(len(y), generator=generator)[:self.params.size].sort().values.to(y.device)
            x, y = x[keep], y[keep]
        return x, y

    def start(self, model, client, round, received):
        categories = self.categories(client)
        x, _ = self.anchor(client, round, categories)
        # T padded to `size` rows, with a mask: every client's T has one shape (train.batched_clients)
        self.rows = torch.arange(self.params.size, device=client.y.device) < len(x)
        self.x = torch.cat([x, x.new_zeros((self.params.size - len(x), *x.shape[1:]))])
        self.kept = (~categories[0]).to(client.y.device, torch.float32)     # 1: a class whose logits count
        self.global_model.load(model, received["model"])
        with torch.no_grad():
            self.target = self.global_model.net(self.x)

    def loss(self, model, x, y, features, logits):
        model.eval()                      # as the global model: BatchNorm's statistics used, not updated
        try:
            local = model(self.x)
        finally:
            model.train()
        squares = (self.target - local) ** 2 * self.kept * self.rows[:, None]   # masks: vmap-safe, no shapes
        summed = squares.sum() / self.rows.sum().clamp(min=1)                    # that depend on the data
        mean = self.params.reduction == "mean"
        return self.params.weight * (summed / self.kept.sum().clamp(min=1) if mean else summed)
