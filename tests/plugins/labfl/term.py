"""A loss term: weight x the squared mean of the batch's features (keeps them centred)."""
from dataclasses import dataclass

from hpcfl import Term


class Centring(Term):
    name = "centring"

    @dataclass(frozen=True)
    class Params:
        weight: float = 0.01

    def loss(self, model, x, y, features, logits):
        return self.params.weight * features.mean(0).pow(2).sum()
