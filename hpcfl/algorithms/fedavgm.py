"""FedAvgM — Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", 2019, section 3 (server momentum): with the cohort's sample-weighted mean
w_avg and the pseudo-gradient d = w - w_avg, the server keeps v <- beta * v + d and sets
w <- w - server_lr * v. Momentum acts on the trained parameters; buffers (BatchNorm running
statistics) take the weighted mean, as in FedAvg.

A steady pseudo-gradient d moves w by server_lr / (1 - beta) * d per round: the effective server step,
Hsu et al.'s effective learning rate eta_eff = eta / (1 - beta). FedAvg is beta = 0, eta = 1. Our
default eta = 1 - beta (server_lr = 0 stands for it) keeps FedAvg's effective step 1 at any beta, so a
paired comparison with FedAvg measures the momentum (d averaged over ~1/(1 - beta) rounds), not a
server step 1/(1 - beta) = 10 times FedAvg's at beta = 0.9; it is also the form of MOON's code
(v <- beta v + (1 - beta) d, w <- w - v). The price: from v = 0 the step grows as 1 - beta^t, so the
first ~1/(1 - beta) rounds move less than FedAvg's (Hsu et al. train for thousands of rounds). Their
rule with eta = 1, as in FedNTD's code (beta = 0.7): server_lr = 1.
"""
from dataclasses import dataclass

from hpcfl.algorithms.base import Traits
from hpcfl.algorithms.fedavg import FedAvg


class FedAvgM(FedAvg):
    """FedAvgM (Hsu et al., 2019): server momentum on the pseudo-gradient, by default at FedAvg's step."""
    name = "fedavgm"
    traits = Traits(batched=True, stateless=True,
                    shared_batchnorm="its server step takes the change from the global model as a pseudo-gradient")

    @dataclass(frozen=True)
    class Params:
        server_lr: float = 0.0           # eta; 0: 1 - server_momentum (effective step eta / (1 - beta) = 1)
        server_momentum: float = 0.9     # beta

        def __post_init__(self):
            if not 0 <= self.server_momentum < 1:
                raise ValueError(f"server_momentum = {self.server_momentum} must be in [0, 1), e.g. 0.9")
            if self.server_lr < 0:
                raise ValueError(f"server_lr = {self.server_lr} must be >= 0 (0: 1 - server_momentum)")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.server_lr = params.server_lr or 1.0 - params.server_momentum

    def init_server_state(self, model):
        return self.with_zeros(super().init_server_state(model), "momentum")

    def update_parameters(self, server_state, mean, uplink):
        for name in self.setup.parameter_names:
            weights, velocity = server_state["model"][name], server_state["momentum"][name]
            velocity.mul_(self.params.server_momentum).add_(weights - mean[name])
            weights.sub_(self.server_lr * velocity)
