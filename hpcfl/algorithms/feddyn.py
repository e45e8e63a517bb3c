"""FedDyn — Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1.

Client k minimises L_k(w) - <g_k, w> + alpha/2 ||w - w^{t-1}||^2 (the linear term and the proximal
term are local terms like any other), then updates its state g_k <- g_k - alpha (w_k - w^{t-1})
(g_k, the gradient of its loss at its last local optimum, starts at zero). The server keeps
h <- h - (alpha / m) sum_{k in cohort} (w_k - w^{t-1}) with m the number of all clients, and sets
w^t = (1/|cohort|) sum_k w_k - h / alpha. Averaging is uniform over the cohort, as in the paper;
buffers (BatchNorm statistics) take the plain cohort mean. The authors' code instead scales alpha per
client by its size (alpha_k = alpha / (n_k / mean n)) with the same uniform mean: with clients of
unequal sizes the two differ, and this is the paper's.

The accuracy recorded (round/test_acc) is w^t's, the model the clients receive. The authors' code
builds that model but tests two others, the plain mean of the cohort's trained models and of every
client's latest one (utils_methods.py, train_FedDyn: the curves of their example script), which
differ from w^t by h / alpha, largest early in training: set FedDyn figures from hpcfl beside the
paper's curves with that in mind. Their local steps also clip the gradient's norm at 10, which
hpcfl's do not (no other algorithm's do either).
"""
from dataclasses import dataclass

import torch

from hpcfl.algorithms.base import ONE, WEIGHT, Traits
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.terms import Linear, Prox


class FedDyn(FedAvg):
    """FedDyn (Acar et al., ICLR 2021, Alg. 1): linear and proximal local terms, per-client gradient state."""
    name = "feddyn"
    traits = Traits(batched=True, shared_batchnorm="its gradient state measures the change from the received model")

    @dataclass(frozen=True)
    class Params:
        alpha: float = 0.01               # the dynamic regulariser's weight

        def __post_init__(self):
            if self.alpha <= 0:
                raise ValueError(f"alpha = {self.alpha} must be > 0 (it divides the server's correction)")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.linear, self.prox = Linear(), Prox(Prox.Params(mu=params.alpha))

    def init_server_state(self, model):
        return self.with_zeros(super().init_server_state(model), "h")

    def client_update(self, phase, round, client, downlink, model, trainer):
        start = downlink["model"]
        kept = client.state.get("grad", {})
        grad = {n: kept.get(n, torch.zeros_like(start[n])) for n in self.setup.parameter_names}
        self.linear.vector = {n: -g for n, g in grad.items()}
        self.start_from(model, client, start)
        metrics = self.train(model, client, round, trainer, downlink, extra=(self.linear, self.prox))
        client.state["grad"] = {n: grad[n] - self.params.alpha * (w.detach() - start[n])
                                for n, w in model.named_parameters()}
        return {"model": ({**model.state_dict(), WEIGHT: ONE}, 1.0)}, metrics

    def update_parameters(self, server_state, mean, uplink):
        cohort, alpha = float(uplink["model"][WEIGHT]), self.params.alpha     # uniform weights: the cohort size
        for name in self.setup.parameter_names:
            weights, h = server_state["model"][name], server_state["h"][name]
            h.sub_(alpha / self.setup.num_clients * cohort * (mean[name] - weights))
            weights.copy_(mean[name] - h / alpha)
