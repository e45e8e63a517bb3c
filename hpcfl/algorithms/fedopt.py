"""FedAdagrad, FedAdam and FedYogi — Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan,
"Adaptive Federated Optimization", ICLR 2021, Algorithm 2. Clients train as in FedAvg; the server
takes the cohort's sample-weighted mean model x_avg, treats Delta_t = x_avg - x_t as a pseudo-gradient
and applies an adaptive optimiser to it, coordinate by coordinate:

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                            (FedAdagrad)
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                          (FedAdam)
    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)      (FedYogi)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

The rule acts on the trained parameters (`Setup.parameter_names`); buffers (BatchNorm running
statistics) take the cohort's weighted mean, as in FedAvg and FedAvgM. m and v are server state
(owners `moment1`, `moment2`), checkpointed with the model, so a resumed run continues bit for bit.

Where the paper's text is silent or leaves a choice, and what we chose:
- x_avg is the sample-weighted mean (as in FedAvg and Flower), where Algorithm 2 writes the plain
  mean 1/|S| sum_i; with clients of equal sizes they agree.
- Initial moments: m_{-1} = 0 and v_{-1} = tau^2, the least Algorithm 2 allows (it asks v_{-1} >= tau^2).
  Flower's strategies start from v = 0 instead.
- Bias correction: none. Algorithm 2 has none; Flower's FedAdam scales eta by Adam's
  sqrt(1 - beta2^t) / (1 - beta1^t) (Kingma & Ba), its FedYogi and FedAdagrad do not.
- Defaults. beta1 = 0.9 and beta2 = 0.99 for FedAdam and FedYogi: the paper's experimental setting
  (section 5) and Flower's defaults. FedAdagrad has no beta2; beta1 = 0 there, as Flower's FedAdagrad and Adagrad itself
  (Algorithm 2 writes the momentum for all three, so beta1 > 0 may be set). tau = 1e-3: Flower's FedYogi
  and current FedAdam. eta = 1e-2 for all three: Flower's FedYogi. Flower's FedAdagrad has eta = 0.1;
  with v_{-1} = tau^2 the first step moves every coordinate by about eta. On the digits job of
  tests/algorithms/test_learning.py (6 clients, Dir(0.5), 2 local epochs, run.seed 0, one run each)
  FedAdagrad's round-8 test accuracy was 0.10 (chance) at eta = 0.1, 0.86 at 1e-2 and 0.92 at 3e-2.
  The paper tunes eta and tau per task over grids, so a study should sweep them.
- A round where nobody trained leaves the model and the moments as they are (as FedAvg keeps its model).
"""
from dataclasses import dataclass

import torch

from hpcfl.algorithms.base import Traits
from hpcfl.algorithms.fedavg import FedAvg


class FedOpt(FedAvg):
    """Algorithm 2 of Reddi et al. (ICLR 2021): an adaptive server step on the cohort's mean model change.
    Subclasses name the second-moment rule (`second_moment`)."""
    traits = Traits(batched=True, stateless=True,
                    shared_batchnorm="its server step takes the change from the global model as a pseudo-gradient")

    @dataclass(frozen=True)
    class Params:
        eta: float = 1e-2                # server learning rate
        beta1: float = 0.9               # first-moment (momentum) decay; 0: no momentum
        tau: float = 1e-3                # adaptivity: added to sqrt(v); also v's start, tau^2

        def __post_init__(self):
            if self.eta <= 0:
                raise ValueError(f"eta = {self.eta} must be > 0, e.g. 0.01")
            if not 0 <= self.beta1 < 1:
                raise ValueError(f"beta1 = {self.beta1} must be in [0, 1), e.g. 0.9")
            if self.tau <= 0:
                raise ValueError(f"tau = {self.tau} must be > 0, e.g. 0.001")

    def init_server_state(self, model):
        state = self.with_zeros(super().init_server_state(model), "moment1")
        return {**state, "moment2": {n: torch.full_like(state["model"][n], self.params.tau ** 2)
                                     for n in self.setup.parameter_names}}

    def update_parameters(self, server_state, mean, uplink):
        p = self.params
        for name in self.setup.parameter_names:
            x, m, v = (server_state[owner][name] for owner in ("model", "moment1", "moment2"))
            delta = mean[name] - x                      # float64, as the reduced mean
            m.mul_(p.beta1).add_((1 - p.beta1) * delta)
            v.copy_(self.second_moment(v, delta.square()))
            x.add_(p.eta * m / (v.sqrt() + p.tau))

    def second_moment(self, v: torch.Tensor, delta2: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t-1} and Delta_t^2."""
        raise NotImplementedError


class FedAdagrad(FedOpt):
    """FedAdagrad (Reddi et al., ICLR 2021, Alg. 2): v grows by Delta^2 every round."""
    name = "fedadagrad"
    traits = FedOpt.traits

    @dataclass(frozen=True)
    class Params(FedOpt.Params):
        beta1: float = 0.0               # first-moment (momentum) decay; 0: no momentum, as Adagrad

    def second_moment(self, v, delta2):
        return v + delta2


class FedAdam(FedOpt):
    """FedAdam (Reddi et al., ICLR 2021, Alg. 2): v an exponential average of Delta^2."""
    name = "fedadam"
    traits = FedOpt.traits

    @dataclass(frozen=True)
    class Params(FedOpt.Params):
        beta2: float = 0.99              # second-moment decay

        def __post_init__(self):
            super().__post_init__()
            if not 0 <= self.beta2 < 1:
                raise ValueError(f"beta2 = {self.beta2} must be in [0, 1), e.g. 0.99")

    def second_moment(self, v, delta2):
        return self.params.beta2 * v + (1 - self.params.beta2) * delta2


class FedYogi(FedAdam):
    """FedYogi (Reddi et al., ICLR 2021, Alg. 2): v moves towards Delta^2 by an additive step."""
    name = "fedyogi"
    traits = FedAdam.traits

    def second_moment(self, v, delta2):
        return v - (1 - self.params.beta2) * delta2 * torch.sign(v - delta2)
