"""SCAFFOLD — Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, Algorithm 1 with option II.

Each local step follows g(y) - c_i + c (here: the linear term <c - c_i, y> added to the loss, whose
gradient is exactly that correction). After K local steps with learning rate lr the client sets
c_i+ = c_i - c + (x - y_i) / (K lr) (option II, K = the steps it took) and sends y_i and
c_i+ - c_i. The server sets x <- x + server_lr * (mean_i y_i - x) and
c <- c + (1/N) sum_{i in cohort} (c_i+ - c_i), with N the number of *all* clients (eq. 5: the
average over every client's c_i, not only the sampled ones, which NIID-Bench gets wrong).

The mean of y_i is weighted by sample counts, as FedAvg and the compared papers' code bases do; with
equal client sizes it is the paper's uniform mean. Control variates cover the trained parameters;
buffers (BatchNorm statistics) are averaged. c_i starts at zero and is stored from the client's
first participation on, on the CPU of its worker.
"""
from dataclasses import dataclass

import torch

from hpcfl.algorithms.base import ONE, WEIGHT, Phase, weighted
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.regularizers import Linear


class Scaffold(FedAvg):
    name = "scaffold"

    @dataclass(frozen=True)
    class Params:
        server_lr: float = 1.0

    sgd_only = "its option II control variates divide the model change by K * lr, which assumes SGD steps"

    def __init__(self, params, setup):
        super().__init__(params, setup)
        control = setup.parameter_layout
        self.phase = Phase("train", downlink={"model": setup.model_layout, "control": control},
                           uplink={"model": weighted(setup.model_layout), "control": control})
        self.correction = Linear()

    def init_server_state(self, model):
        return self.with_zeros(super().init_server_state(model), "control")

    def downlink(self, phase, round, server_state):
        return {"model": self.global_state(server_state),
                "control": {n: server_state[f"control.{n}"] for n in self.setup.parameter_names}}

    def client_update(self, phase, round, client, downlink, model, trainer):
        start, c = downlink["model"], downlink["control"]
        c_i = {n: client.state.get(f"control.{n}", torch.zeros_like(c[n])) for n in c}
        self.correction.vector = {n: c[n] - c_i[n] for n in c}
        self.start_from(model, client, start)
        metrics = self.train(model, client, round, trainer, downlink, extra=(self.correction,))
        step = 1.0 / (metrics["steps"] * self.setup.job.train.lr)
        trained = dict(model.named_parameters())
        delta = {}
        for n in c:
            new = c_i[n] - c[n] + (start[n] - trained[n].detach()) * step
            delta[n], client.state[f"control.{n}"] = new - c_i[n], new
        return {"model": ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples)),
                "control": (delta, 1.0)}, metrics

    def update_parameters(self, server_state, mean, uplink):
        for name in self.setup.parameter_names:
            weights = server_state[f"model.{name}"]
            weights.add_(self.params.server_lr * (mean[name] - weights))
            server_state[f"control.{name}"].add_(uplink["control"][name] / self.setup.num_clients)
