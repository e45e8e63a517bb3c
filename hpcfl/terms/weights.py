"""Terms on the parameters themselves.

- `prox`   FedProx, Li et al., MLSys 2020, eq. (2): mu/2 * ||w - w_ref||^2 over the parameters.
           scope = "classifier" restricts it to the head (FedClassAvg's proximal term: its eq. 5 prints
           rho ||w_C,k - w_C||_2, unsquared; this is the authors' code's rho/2 times the squared distance);
           reduction = "mean" takes each tensor's mean squared difference, as their code does (MSELoss
           per tensor).
- `Linear` (not selectable by name): <v, w> for a per-client vector v, SCAFFOLD's and FedDyn's correction.
"""
from dataclasses import dataclass

from hpcfl.terms.base import Tensors, Term


class Prox(Term):
    """FedProx's proximal term (mu/2) ||w - w_ref||^2 against the model the client started from."""
    batchable = True
    name = "prox"

    @dataclass(frozen=True)
    class Params:
        mu: float = 0.01              # the proximal term's weight (the loss adds mu/2 ||w - w_ref||^2)
        scope: str = "model"          # model | classifier (FedClassAvg eq. 5: the head only)
        reduction: str = "sum"        # sum: ||w - w_ref||^2 (FedProx); mean: per tensor (FedClassAvg's code)

        def __post_init__(self):
            if self.scope not in ("model", "classifier"):
                raise ValueError(f"scope = {self.scope!r}; choose 'model' or 'classifier'")
            if self.reduction not in ("sum", "mean"):
                raise ValueError(f"reduction = {self.reduction!r}; choose 'sum' or 'mean'")

    def start(self, model, client, round, received):
        self.reference = {n: received["model"][n].detach().to(p.device) for n, p in self.parameters(model)}

    def parameters(self, model):
        return model.classifier.named_parameters(prefix="classifier") if self.params.scope == "classifier" \
            else model.named_parameters()

    def loss(self, model, x, y, features, logits):
        squares = (((p - self.reference[n]) ** 2) for n, p in self.parameters(model))
        total = sum(d.mean() if self.params.reduction == "mean" else d.sum() for d in squares)
        return 0.5 * self.params.mu * total


class Linear(Term):
    """<v, w> over the parameters, for a per-client vector v the algorithm sets (SCAFFOLD's c - c_i,
    FedDyn's -grad): its gradient adds v to every step's gradient. Not selectable by name."""
    batchable = True

    name = "linear"
    vector: Tensors               # set by the algorithm before each local training

    def __init__(self):
        super().__init__(None)

    def loss(self, model, x, y, features, logits):
        return sum((self.vector[n] * p).sum() for n, p in model.named_parameters())
