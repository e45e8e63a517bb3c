"""FedAvgM — Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", 2019, section 3 (server momentum): with the cohort's sample-weighted mean
w_avg and the pseudo-gradient d = w - w_avg, the server keeps v <- beta * v + d and sets
w <- w - server_lr * v. Momentum acts on the trained parameters; buffers (BatchNorm running
statistics) take the weighted mean, as in FedAvg. server_momentum = 0 and server_lr = 1 is FedAvg.
"""
from dataclasses import dataclass

from hpcfl.algorithms.fedavg import FedAvg


class FedAvgM(FedAvg):
    name = "fedavgm"
    batched = stateless = True

    @dataclass(frozen=True)
    class Params:
        server_lr: float = 1.0
        server_momentum: float = 0.9

    def init_server_state(self, model):
        return self.with_zeros(super().init_server_state(model), "momentum")

    def update_parameters(self, server_state, mean, uplink):
        for name in self.setup.parameter_names:
            weights, velocity = server_state[f"model.{name}"], server_state[f"momentum.{name}"]
            velocity.mul_(self.params.server_momentum).add_(weights - mean[name])
            weights.sub_(self.params.server_lr * velocity)
