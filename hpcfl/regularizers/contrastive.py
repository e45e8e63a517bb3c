"""Contrastive terms on the features.

- `moon`   MOON, Li, He & Song, CVPR 2021, eq. (2)-(3): mu * -log(e^{sim(z,z_glob)/T} /
           (e^{sim(z,z_glob)/T} + e^{sim(z,z_prev)/T})), z = features(x), cosine similarity; z_prev
           from the client's model at the end of its previous participation (the reference model at
           its first, as in the authors' code, which starts the model pool from the global model).
- `supcon` Supervised contrastive loss, Khosla et al., NeurIPS 2020, eq. (2) (L^sup_out), on the
           features of two augmented views of each batch (FedClassAvg eq. 4, L^CL): weight *
           (temperature / base_temperature) * mean over the 2N anchors of -mean log-softmax over the positives.
           FedClassAvg's code feeds unnormalised features at temperature 100 (base 0.07): normalize =
           false, temperature = 100 reproduces it.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcfl.regularizers.base import Frozen, Regularizer


class Moon(Regularizer):
    name, keeps_state = "moon", True

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
