"""Contrastive terms on the features.

- `moon`   MOON, Li, He & Song, CVPR 2021, eq. (2)-(3): mu * -log(e^{sim(z,z_glob)/T} /
           (e^{sim(z,z_glob)/T} + e^{sim(z,z_prev)/T})), cosine similarity; z_prev from the client's model
           at the end of its previous participation; at its first, none: the term is 0 (as in the authors'
           round 0, whose model pool is empty; their later pool holds every client's net, for a client
           not yet sampled not the global model, our choice). z is the output of the projection
           head of section 3.1, as in the authors' code (QinbinLi/MOON, `ModelFedCon`): features h ->
           Linear(d, d) -> ReLU -> Linear(d, projection) = z, and the classifier reads z (Linear(projection,
           C)). `projection` = 256 (their out_dim) by default; 0: no head, z = h.
           The head replaces the model's `classifier` at build time (`adapt`, on every rank), so it is
           part of the state_dict and averaged like the rest; it is drawn after the base model, from its
           own seed, so the base model's initialisation is the one every other algorithm gets.
- `supcon` Supervised contrastive loss, Khosla et al., NeurIPS 2020, eq. (2) (L^sup_out), on the
           features of two augmented views of each batch (FedClassAvg eq. 4, L^CL): weight *
           (temperature / base_temperature) * mean over the 2N anchors of -mean log-softmax over the positives.
           FedClassAvg's code feeds unnormalised features at temperature 100 (base 0.07): normalize =
           false, temperature = 100 reproduces it.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hpcfl.errors import ConfigError, HpcflError
from hpcfl.seeding import torch_seed
from hpcfl.terms.base import Frozen, Term


class ProjectedClassifier(nn.Module):
    """MOON's classifier: `head` (Linear(d, d) -> ReLU -> Linear(d, out_dim)) gives z, `out` the logits.
    `in_features` is the features' width, as for a plain Linear classifier (the anchors' width)."""

    def __init__(self, in_features: int, out_dim: int, num_classes: int):
        super().__init__()
        self.in_features = in_features
        self.head = nn.Sequential(nn.Linear(in_features, in_features), nn.ReLU(), nn.Linear(in_features, out_dim))
        self.out = nn.Linear(out_dim, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(features))


class Moon(Term):
    """MOON's model-contrastive loss: features near the global model's, far from the previous local model's."""
    batchable = True
    name, keeps_state = "moon", True

    @dataclass(frozen=True)
    class Params:
        mu: float = 1.0               # the term's weight (eq. 4's mu)
        temperature: float = 0.5      # tau of the contrastive loss (eq. 3)
        projection: int = 256         # width of z from the projection head (section 3.1); 0: no head, z = features

        def __post_init__(self):
            if self.temperature <= 0:
                raise ValueError(f"temperature = {self.temperature} must be > 0 (MOON: 0.5)")
            if self.projection < 0:
                raise ValueError(f"projection = {self.projection} must be >= 0 (256 as MOON; 0: no projection head)")

    @classmethod
    def adapt(cls, model, params, seed):
        if not params.projection:
            return
        linear = model.classifier
        if type(linear) is not nn.Linear:               # ReluLinear (model.params.preactivation) too
            raise ConfigError(f"moon's projection = {params.projection} puts a head under the classifier, which must "
                              f"be one Linear layer (this model's is {type(linear).__name__}); set projection = 0")
        with torch.random.fork_rng(devices=[]):         # leaves torch's generator as the base model left it
            torch.manual_seed(torch_seed(seed, "moon.projection"))
            head = ProjectedClassifier(linear.in_features, params.projection, linear.out_features)
        model.classifier = head.to(linear.weight.device, linear.weight.dtype)

    def __init__(self, params):
        super().__init__(params)
        self.global_model, self.previous_model = Frozen(), Frozen()

    def start(self, model, client, round, received):
        if self.params.projection and not isinstance(model.classifier, ProjectedClassifier):
            raise HpcflError("moon: the model has no projection head; build it with hpcfl.runtime.build.build_models "
                             "(or Moon.adapt), or set projection = 0")
        previous = self.state(client)
        self.global_model.load(model, received["model"])
        self.previous_model.load(model, previous or received["model"])     # (a stand-in: one shape for vmap)
        self.participated = torch.tensor(float(bool(previous)), device=client.y.device)   # 0: no term yet

    def represent(self, net, features: torch.Tensor) -> torch.Tensor:
        """MOON's z: the projection head's output, or the features themselves without a head."""
        return net.classifier.head(features) if self.params.projection else features

    def loss(self, model, x, y, features, logits):
        with torch.no_grad():
            z_global = self.represent(self.global_model.net, self.global_model.net.features(x))
            z_previous = self.represent(self.previous_model.net, self.previous_model.net.features(x))
        z = self.represent(model, features)
        positive = F.cosine_similarity(z, z_global, dim=1) / self.params.temperature
        negative = F.cosine_similarity(z, z_previous, dim=1) / self.params.temperature
        # -log(e^p / (e^p + e^n)) = logsumexp(p, n) - p
        return self.params.mu * self.participated * (torch.logaddexp(positive, negative) - positive).mean()

    def finish(self, model, client):
        self.state(client).update({k: v.detach().clone() for k, v in model.state_dict().items()})


class SupCon(Term):
    """Khosla et al.'s supervised contrastive loss over the 2N features of two views (every other
    sample of the same class is a positive), scaled by temperature / base_temperature."""
    batchable = True
    name, views = "supcon", 2

    @dataclass(frozen=True)
    class Params:
        weight: float = 1.0           # the term's weight in the local loss
        temperature: float = 0.07     # tau (FedClassAvg's code: 100)
        base_temperature: float = 0.07  # the loss is scaled by temperature / base_temperature
        normalize: bool = True        # FedClassAvg's code: False, with temperature = 100

        def __post_init__(self):
            check_temperatures(self.temperature, self.base_temperature)

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


def check_temperatures(temperature: float, base_temperature: float) -> None:
    """SupCon's temperatures (its own, and FedClassAvg's, which builds it): 0 divides by zero, and a
    negative temperature turns the loss around, pushing a class's features apart."""
    if not (temperature > 0 and base_temperature > 0):
        raise ValueError(f"temperature = {temperature} and base_temperature = {base_temperature} must be > 0 "
                         "(SupCon: 0.07 and 0.07; FedClassAvg's code: 100 and 0.07)")
