"""SCAFFOLD — Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, Algorithm 1 with option II.

Each local step follows g(y) - c_i + c (here: the linear term <c - c_i, y> added to the loss, whose
gradient is exactly that correction). After its local steps the client sets
c_i+ = c_i - c + (x - y_i) / (a_i lr) and sends y_i and c_i+ - c_i. The server sets
x <- x + server_lr * (mean_i y_i - x) and c <- c + (1/N) sum_{i in cohort} (c_i+ - c_i), with N the
number of *all* clients (eq. 5: the average over every client's c_i, not only the sampled ones,
which NIID-Bench divided by the sampled ones until August 2022, commit 66095cc).

a_i is our extension of option II, which the paper states for plain SGD with a_i = K, the steps
taken: (x - y_i) / (K lr) is then the mean corrected gradient. With local momentum rho the model
moves about 1/(1 - rho) times further (10x at 0.9) and option II's c_i+ blows up (NaN within a few
rounds on digits). So a_i is FedNova's normalising step count of the local solver
(hpcfl.algorithms.fednova.normalising_steps, K when rho = 0 and no prox): the sum of the weights the
steps' gradients get in x - y_i, which makes (x - y_i) / (a_i lr) again their weighted mean. As
there, weight decay is part of the gradient (c_i estimates the gradient of the loss plus the decay,
the same function on every client), and a `prox` term's pull toward x (zero at x) counts in a_i, so
that c_i estimates the client's gradient without it. Adam is refused: its steps have no such count.

The mean of y_i is weighted by sample counts, as FedAvg and the compared papers' code bases do; with
equal client sizes it is the paper's uniform mean. With unequal sizes the weighting changes only the
path: c is the uniform mean of the c_i, every client drifts along -c near convergence, so the fixed
point is the paper's, where the *unweighted* mean of the clients' gradients is 0 (two clients with
f_i = (x - b_i)^2 / 2, b = 0 and 10, sizes 9:1: SCAFFOLD's x goes to 5, FedAvg's objective's optimum
is 1). On unequal client sizes SCAFFOLD and FedAvg minimise different objectives.

Control variates cover the trained parameters; buffers (BatchNorm statistics) are averaged, and
model.batchnorm = "local" is refused (a client would start from its own BatchNorm layers, not x).
c_i starts at zero and is stored from the client's first participation on, on the CPU of its worker;
a client that took no step (a one-sample batch on a BatchNorm model is skipped) keeps its c_i.
"""
from dataclasses import dataclass

import torch

from hpcfl.algorithms.base import ONE, WEIGHT, Phase, Traits, weighted
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.algorithms.fednova import check_prox, normalising_steps, prox_lr_mu
from hpcfl.terms import Linear


class Scaffold(FedAvg):
    """SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1 option II): control variates; local momentum allowed."""
    name = "scaffold"

    @dataclass(frozen=True)
    class Params:
        server_lr: float = 1.0            # eta_g, the server's step on the averaged model change

        def __post_init__(self):
            if self.server_lr <= 0:           # 0 would freeze the model while the control variates move
                raise ValueError(f"server_lr = {self.server_lr} must be > 0 (the paper's eta_g; 1 is plain averaging)")

    traits = Traits(batched=True,
                    sgd_only="its option II control variates divide the model change by lr times the SGD step count",
                    shared_batchnorm="its control variates measure the model change from the received model")

    @classmethod
    def check(cls, job):
        super().check(job)
        check_prox(cls.name, job)

    def __init__(self, params, setup):
        super().__init__(params, setup)
        control = setup.parameter_layout
        self.phase = Phase("train", downlink={"model": setup.model_layout, "control": control},
                           uplink={"model": weighted(setup.model_layout), "control": control})
        self.correction = Linear()
        self.lr_mu = prox_lr_mu(setup.job.train.lr, self.terms)

    def init_server_state(self, model):
        return self.with_zeros(super().init_server_state(model), "control")

    def downlink(self, phase, round, server_state):
        return {"model": self.global_state(server_state), "control": server_state["control"]}

    def client_update(self, phase, round, client, downlink, model, trainer):
        start, c = downlink["model"], downlink["control"]
        kept = client.state.get("control", {})
        c_i = {n: kept.get(n, torch.zeros_like(c[n])) for n in c}
        self.correction.vector = {n: c[n] - c_i[n] for n in c}
        self.start_from(model, client, start)
        metrics = self.train(model, client, round, trainer, downlink, extra=(self.correction,))
        train, steps = self.setup.job.train, int(metrics["steps"])
        new = c_i                       # no step this round (one sample on a BatchNorm model): no new estimate
        if steps:
            step = 1.0 / (normalising_steps(steps, train.momentum, self.lr_mu) * train.lr)
            trained = dict(model.named_parameters())
            new = {n: c_i[n] - c[n] + (start[n] - trained[n].detach()) * step for n in c}
        client.state["control"] = new
        delta = {n: new[n] - c_i[n] for n in c}
        return {"model": ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples)),
                "control": (delta, 1.0)}, metrics

    def update_parameters(self, server_state, mean, uplink):
        for name in self.setup.parameter_names:
            weights = server_state["model"][name]
            weights.add_(self.params.server_lr * (mean[name] - weights))
            server_state["control"][name].add_(uplink["control"][name] / self.setup.num_clients)
