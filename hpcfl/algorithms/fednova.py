"""FedNova — Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020, eq. (6)-(7) (normalised averaging).

Client i with sample share p_i (its share of the round's cohort: our choice, since the authors' code
trains every client every round; the paper's p_i is over all clients) takes tau_i local steps; its normalised update is
d_i = (x - y_i) / a_i with a_i = ||a_i||_1 the sum of its step weights, and the server sets
x <- x - tau_eff * sum_i p_i d_i with tau_eff = sum_i p_i a_i. For plain SGD a_i = tau_i; with
momentum rho and a proximal term mu, a_i is the local solver's own count (`normalising_steps`): how
far, in units of lr, tau_i steps of a constant unit gradient move the model, the prox pull going
through the momentum buffer as the gradient does (per step buf <- rho buf + 1 - lr mu a, a <- a +
buf). That is the paper's sum over the steps' weights, and with momentum alone or mu alone the
authors' optimiser's (JYWa/FedNova) closed forms; with both, their code adds the momentum counter and
then the prox recurrence's 1, counting each step once more (a_i 15-50 % too large at rho 0.5-0.9 and
lr mu K small, several times too large once lr mu K reaches 1; a factor common to all clients cancels
in tau_eff * sum p d, differences between clients' step counts remain): we take the exact count. As
there, weight decay is part of the gradient (it does not enter a_i), and mu is the proximal pull:
here the `prox` term's, which must pull every parameter by the same mu (scope "model", reduction
"sum"). SCAFFOLD normalises its control variates by the same a_i (`normalising_steps`, `prox_lr_mu`).
tau_eff follows the paper (sum_i p_i a_i) also with a prox term, where the authors' code
(`FedNova.average`) takes sum_i p_i tau_i, the raw step counts: with a prox term a_i < tau_i, so
their server step is larger by sum p tau / sum p a (about 1.005 at lr mu = 1e-4 and tau = 100, 5x
at lr mu = 0.05). A client that took no step (a_i = 0) sends d_i = 0.
Buffers (BatchNorm statistics) take the sample-weighted mean.
"""
from dataclasses import dataclass

from hpcfl.algorithms.base import ONE, WEIGHT, Phase, Traits, weighted
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.errors import ConfigError
from hpcfl.params import params_from
from hpcfl.payload import Layout
from hpcfl.terms import Prox

STEPS = "#steps"          # a_i, summed with weight p_i: tau_eff


def normalising_steps(steps: int, momentum: float, lr_mu: float) -> float:
    """a_i = ||a_i||_1 of the client's local solver after `steps` steps (module docstring)."""
    total = buf = 0.0
    for _ in range(steps):
        buf = momentum * buf + 1.0 - lr_mu * total
        total += buf
    return total


def prox_lr_mu(lr: float, terms) -> float:
    """lr * mu of the `prox` terms among the client's local terms: the pull a_i counts."""
    return lr * sum(term.params.mu for term in terms if isinstance(term, Prox))


def check_prox(name: str, job) -> None:
    """a_i counts one mu for every parameter: refuse a `prox` that pulls only some, or per tensor."""
    if "prox" in job.algorithm.terms:
        prox = params_from(Prox.Params, job.algorithm.terms["prox"], "algorithm.terms.prox")
        if (prox.scope, prox.reduction) != ("model", "sum"):
            raise ConfigError(f"algorithm '{name}' counts the prox pull in its step count a_i, which needs the "
                              "same mu on every parameter: set algorithm.terms.prox scope = \"model\" "
                              "and reduction = \"sum\"")


class FedNova(FedAvg):
    """FedNova (Wang et al., NeurIPS 2020, eq. 6-7): updates normalised by each client's step count a_i."""
    name = "fednova"
    traits = Traits(batched=True, stateless=True,
                    sgd_only="its normalisation counts SGD steps (with momentum and prox)",
                    shared_batchnorm="it normalises the change from the received model")

    @dataclass(frozen=True)
    class Params:
        """None of its own: every client starts from the shared model (FedAvg's `init` is not FedNova's)."""

    @classmethod
    def check(cls, job):
        super().check(job)
        check_prox(cls.name, job)

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.phase = Phase("train", downlink={"model": setup.model_layout},
                           uplink={"model": weighted(setup.model_layout) + Layout((STEPS,), ((),))})
        self.lr_mu = prox_lr_mu(setup.job.train.lr, self.terms)

    def client_update(self, phase, round, client, downlink, model, trainer):
        start = downlink["model"]
        self.start_from(model, client, start)
        metrics = self.train(model, client, round, trainer, downlink)
        a = normalising_steps(int(metrics["steps"]), self.setup.job.train.momentum, self.lr_mu)
        params = set(self.setup.parameter_names)       # a = 0: no step this round (one sample, BatchNorm): d_i = 0
        update = {n: (start[n] - v) / (a or 1.0) if n in params else v for n, v in model.state_dict().items()}
        return {"model": ({**update, STEPS: ONE * a, WEIGHT: ONE}, float(client.num_samples))}, metrics

    def update_parameters(self, server_state, mean, uplink):
        for name in self.setup.parameter_names:            # mean[STEPS] = tau_eff
            server_state["model"][name].sub_(mean[STEPS] * mean[name])
