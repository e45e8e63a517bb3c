"""FedFM's feature matching against global class anchors.

- `fm_cg`  FedFM, Ye et al., "FedFM: Anchor-based Feature Matching for Data Heterogeneity in
           Federated Learning", IEEE TSP 2023, section IV-C: weight * CE(softmax(<a_n, z> / tau), c)
           over the C global anchors a_n, with z = features(x) and the anchors L2-normalised (the
           authors' code), from round `start_round` (T_s) on. `fm_l2`: eq. (3), weight * ||z - a_c||^2
           with z and a_c normalised (z: section VII-A; a_c: the authors' code), averaged over batch
           and dimensions as in the authors' `matching_l2`; both terms default to the paper's lambda = 50.
           Both need global anchors: the algorithm adds FedFM's anchor phase (hpcfl.algorithms.anchors) to its rounds.

A class no client has sent features of yet has no anchor (the paper samples every client, so every
class has one; under partial participation early rounds may lack some). Ours: it is no competitor in
`fm_cg`'s softmax, and a sample of it adds 0 to either loss (the batch mean still divides by all).
"""
from dataclasses import dataclass

import torch.nn.functional as F

from hpcfl.terms.base import Term


class FeatureMatching(Term):
    """Pulls each sample's features towards its class's global anchor (FedFM); off before `start_round`."""
    batchable = True

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
            self.anchors, self.known = received["anchors"]["anchors"], received["anchors"]["known"] > 0

    def loss(self, model, x, y, features, logits):
        return self.params.weight * self.match(features, y) if self.active else None


class ContrastiveGuiding(FeatureMatching):
    """FedFM's contrastive guiding (section IV-C): cross-entropy of the features' cosine to every anchor."""
    name = "fm_cg"

    def match(self, features, y):
        similarity = F.normalize(features, dim=1) @ F.normalize(self.anchors, dim=1).T
        logits = (similarity / self.params.tau).masked_fill(~self.known, -1e4)     # a mask: vmap-safe
        return (F.cross_entropy(logits, y, reduction="none") * self.known[y]).mean()


class L2Matching(FeatureMatching):
    """Squared distance between normalised feature and anchor, averaged over samples and dimensions
    (section VII-A normalises features before the matching loss, the authors' code the anchors too; their
    `matching_l2` takes the MSE)."""
    name = "fm_l2"

    def match(self, features, y):
        distance = ((F.normalize(features, dim=1) - F.normalize(self.anchors, dim=1)[y]) ** 2).mean(1)
        return (distance * self.known[y]).mean()
