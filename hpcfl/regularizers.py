"""Local loss terms: small pieces added to a client's task loss, composable by configuration.

A job names them in `[algorithm] regularizers = ["prox", "moon"]` (parameters in
`[algorithm.regularizers.<name>]`), and any algorithm trains with them, so FedProx is FedAvg plus
`prox` and FedFM's feature matching can be added to MOON or FedNova by configuration.

A term sees what the client received this round (`start`: the reference model under "model", and
payloads such as FedFM's global anchors under "anchors"), may rescale the logits
before the task loss (`logits`), adds to the loss each batch (`loss`), and may keep per-client state
that lives with the client on its worker, off the GPU between rounds (`finish`, keys `<name>.*`).

- `prox`   FedProx, Li et al., MLSys 2020, eq. (2): mu/2 * ||w - w_ref||^2 over the parameters.
           scope = "classifier" restricts it to the head (FedClassAvg eq. 5); reduction = "mean" takes
           each tensor's mean squared difference, as FedClassAvg's code does (MSELoss per tensor).
- `moon`   MOON, Li, He & Song, CVPR 2021, eq. (2)-(3): mu * -log(e^{sim(z,z_glob)/T} /
           (e^{sim(z,z_glob)/T} + e^{sim(z,z_prev)/T})), z = features(x), cosine similarity; z_prev
           from the client's model at the end of its previous participation (the reference model at
           its first, as in the authors' code, which starts the model pool from the global model).
- `fedrs`  FedRS, Li & Zhan, KDD 2021, restricted softmax: logits of class c scaled by
           s_c = alpha + (1 - alpha) * n_c / max_c' n_c', as in the authors' code (lxcnju/FedRepo): a
           class the client lacks gets alpha, its most frequent class 1. Their code scales W h and
           leaves the bias out of the local logits; here the whole logit (bias included) is scaled,
           so the model trained is the model evaluated.
- `fm_cg`  FedFM, Ye et al., "FedFM: Anchor-based Feature Matching for Data Heterogeneity in
           Federated Learning", IEEE TSP 2023, section IV-C: weight * CE(softmax(<a_n, z> / tau), c)
           over the C global anchors a_n, with z = features(x) and the anchors L2-normalised (the
           authors' code), from round `start_round` (T_s) on. `fm_l2`: eq. (3), weight * ||z - a_c||^2
           with z and a_c normalised (section V-A), averaged over batch and dimensions as in the
           authors' `matching_l2`; both terms default to the paper's lambda = 50.
           Both need global anchors: the algorithm adds FedFM's anchor phase (hpcfl.anchors) to its rounds.
- `supcon` Supervised contrastive loss, Khosla et al., NeurIPS 2020, eq. (2) (L^sup_out), on the
           features of two augmented views of each batch (FedClassAvg eq. 4, L^CL): weight *
           (temperature / base_temperature) * mean over the 2N anchors of -mean log-softmax over the positives.
           FedClassAvg's code feeds unnormalised features at temperature 100 (base 0.07): normalize =
           false, temperature = 100 reproduces it.
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
- `ntd`    FedNTD, Lee et al., NeurIPS 2022, eq. (4): beta * tau^2 * KL(q_glob || q_local) over the
           not-true classes, both softmaxes at temperature tau (tau^2 scaling and the defaults beta = 1,
           tau = 3 as in the authors' code).
"""
import copy
from dataclasses import dataclass
from typing import ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from hpcfl.config import params_from
from hpcfl.errors import ConfigError
from hpcfl.models import load_state
from hpcfl.seeding import torch_generator

Tensors = dict[str, torch.Tensor]


class Regularizer:
    name: ClassVar[str]

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params):
        self.params = params

    needs_anchors: ClassVar[bool] = False
    needs_shared: ClassVar[bool] = False   # the run's shared set S (one sample per class) as client.shared
    seed: int = 0                          # the run's seed, for terms that draw per (round, client)
    views: ClassVar[int] = 1       # 2: the trainer makes two augmented views of each batch (SupCon), and
                                   # `loss` gets their features as N x 2 x d (view 1 is what the task loss sees)

    def start(self, model: nn.Module, client, round: int, received: Mapping[str, Tensors]) -> None:
        """Before local training; received["model"] is the model state the client started from."""

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def loss(self, model: nn.Module, x, y, features, logits) -> torch.Tensor | None:
        return None

    def finish(self, model: nn.Module, client) -> None:
        """After local training: update the client's state."""


class Frozen:
    """A copy of the model, made once per worker and reused, that holds a reference state and runs
    without gradients in eval mode (no dropout; BatchNorm uses its running statistics)."""

    def __init__(self):
        self.net: nn.Module | None = None

    def load(self, model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        if self.net is None:
            self.net = copy.deepcopy(model).requires_grad_(False).eval()
        load_state(self.net, state)


class Prox(Regularizer):
    name = "prox"

    @dataclass(frozen=True)
    class Params:
        mu: float = 0.01
        scope: str = "model"          # model | classifier (FedClassAvg eq. 5: the head only)
        reduction: str = "sum"        # sum: ||w - w_ref||^2 (FedProx); mean: per tensor (FedClassAvg's code)

        def __post_init__(self):
            if self.scope not in ("model", "classifier"):
                raise ValueError(f"scope = {self.scope!r}; choose 'model' or 'classifier'")
            if self.reduction not in ("sum", "mean"):
                raise ValueError(f"reduction = {self.reduction!r}; choose 'sum' or 'mean'")

    def start(self, model, client, round, received):
        self.reference = {n: received["model"][n].detach() for n, _ in self.parameters(model)}

    def parameters(self, model):
        return model.classifier.named_parameters(prefix="classifier") if self.params.scope == "classifier" \
            else model.named_parameters()

    def loss(self, model, x, y, features, logits):
        squares = (((p - self.reference[n]) ** 2) for n, p in self.parameters(model))
        total = sum(d.mean() if self.params.reduction == "mean" else d.sum() for d in squares)
        return 0.5 * self.params.mu * total


class Linear(Regularizer):
    """<v, w> over the parameters, for a per-client vector v the algorithm sets (SCAFFOLD's c - c_i,
    FedDyn's -grad): its gradient adds v to every step's gradient. Not selectable by name."""

    name = "linear"

    def __init__(self):
        super().__init__(None)
        self.vector: Tensors = {}

    def loss(self, model, x, y, features, logits):
        return sum((self.vector[n] * p).sum() for n, p in model.named_parameters())


class Moon(Regularizer):
    name = "moon"

    @dataclass(frozen=True)
    class Params:
        mu: float = 1.0
        temperature: float = 0.5

    def __init__(self, params):
        super().__init__(params)
        self.global_model, self.previous_model = Frozen(), Frozen()

    def start(self, model, client, round, received):
        previous = {k[len("moon.previous."):]: v for k, v in client.state.items() if k.startswith("moon.previous.")}
        self.global_model.load(model, received["model"])
        self.previous_model.load(model, previous or received["model"])

    def loss(self, model, x, y, features, logits):
        with torch.no_grad():
            z_global, z_previous = self.global_model.net.features(x), self.previous_model.net.features(x)
        positive = F.cosine_similarity(features, z_global, dim=1) / self.params.temperature
        negative = F.cosine_similarity(features, z_previous, dim=1) / self.params.temperature
        # -log(e^p / (e^p + e^n)) = logsumexp(p, n) - p
        return self.params.mu * (torch.logaddexp(positive, negative) - positive).mean()

    def finish(self, model, client):
        client.state.update({f"moon.previous.{k}": v.detach().clone() for k, v in model.state_dict().items()})


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


class FeatureMatching(Regularizer):
    """Pulls each sample's features towards its class's global anchor (FedFM); off before `start_round`."""

    needs_anchors = True

    @dataclass(frozen=True)
    class Params:
        weight: float = 50.0             # lambda
        tau: float = 0.1                 # contrastive guiding's temperature (alpha in section IV-C)
        start_round: int = 20            # T_s: plain training before it
        anchor_weighting: str = "samples"   # samples (eq. 9) | uniform (Table VI)

        def __post_init__(self):
            if self.anchor_weighting not in ("samples", "uniform"):
                raise ValueError(f"anchor_weighting = {self.anchor_weighting!r}; choose 'samples' or 'uniform'")

    def start(self, model, client, round, received):
        self.active = round >= self.params.start_round
        if self.active:
            self.anchors = received["anchors"]["anchors"]

    def loss(self, model, x, y, features, logits):
        return self.params.weight * self.match(features, y) if self.active else None


class ContrastiveGuiding(FeatureMatching):
    name = "fm_cg"

    def match(self, features, y):
        similarity = F.normalize(features, dim=1) @ F.normalize(self.anchors, dim=1).T
        return F.cross_entropy(similarity / self.params.tau, y)


class L2Matching(FeatureMatching):
    """Squared distance between normalised feature and anchor, averaged over samples and dimensions
    (section V-A normalises features before either loss; the authors' `matching_l2` takes the MSE)."""
    name = "fm_l2"

    def match(self, features, y):
        return F.mse_loss(F.normalize(features, dim=1), F.normalize(self.anchors, dim=1)[y])


class SupCon(Regularizer):
    """Khosla et al.'s supervised contrastive loss over the 2N features of two views (every other
    sample of the same class is a positive), scaled by temperature / base_temperature."""
    name, views = "supcon", 2

    @dataclass(frozen=True)
    class Params:
        weight: float = 1.0
        temperature: float = 0.07
        base_temperature: float = 0.07
        normalize: bool = True        # FedClassAvg's code: False, with temperature = 100

    def loss(self, model, x, y, features, logits):
        z = torch.cat(features.unbind(1))                           # view 1 of every sample, then view 2
        if self.params.normalize:
            z = F.normalize(z, dim=1)
        labels = y.repeat(features.shape[1])
        self_pair = torch.eye(len(labels), dtype=torch.bool, device=z.device)
        similarity = (z @ z.T / self.params.temperature).masked_fill(self_pair, float("-inf"))
        log_prob = similarity - torch.logsumexp(similarity, dim=1, keepdim=True)
        positive = (labels[:, None] == labels[None, :]) & ~self_pair
        mean_positive = log_prob.masked_fill(~positive, 0.0).sum(1) / positive.sum(1)
        scale = self.params.temperature / self.params.base_temperature
        return -self.params.weight * scale * mean_positive.mean()


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

    def anchor(self, client, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's knowledge anchor T_i (eq. 2), down-sampled to `size`: (x, y)."""
        counts = client.class_counts
        dominant, non_dominant, missing = class_categories(counts, self.params.gamma or 1.0 / len(counts))
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
        self.x, _ = self.anchor(client, round)
        dominant, _, _ = class_categories(client.class_counts, self.params.gamma or 1.0 / len(client.class_counts))
        self.kept = ~dominant.to(client.y.device)
        if len(self.x):
            self.global_model.load(model, received["model"])
            with torch.no_grad():
                self.target = self.global_model.net(self.x)[:, self.kept]

    def loss(self, model, x, y, features, logits):
        if not len(self.x):
            return None
        local = model(self.x)[:, self.kept]
        return self.params.weight * ((self.target - local) ** 2).sum() / len(self.x)


REGULARIZERS: dict[str, type[Regularizer]] = {
    cls.name: cls for cls in (Prox, Moon, RestrictedSoftmax, NotTrueDistillation, ContrastiveGuiding, L2Matching,
                              SupCon, KnowledgeAnchor)}


def regularizer_params(name: str, raw: Mapping) -> Regularizer.Params:
    """The named term's Params from its config table, naming bad keys."""
    if name not in REGULARIZERS:
        raise ConfigError(f"algorithm.regularizers: '{name}' is unknown; valid: {sorted(REGULARIZERS)}")
    return params_from(REGULARIZERS[name].Params, raw, f"algorithm.regularizers.{name}")


def build_regularizers(tables: Mapping[str, Mapping], seed: int = 0) -> list[Regularizer]:
    terms = [REGULARIZERS[name](regularizer_params(name, raw)) for name, raw in tables.items()]
    for term in terms:
        term.seed = seed
    return terms
