"""Baselines without a global model: every client trains only its own model.

- `local_only`: no communication at all. Each client continues from its own model every time it is
  sampled (its architecture's initial model at its first round, hpcfl.algorithms.personal);
  accuracy is personalised, measured on the client's own held-out data (FedClassAvg Table 2,
  "Baseline (local training)"), so the job must set data.local_test_ratio or data.validation_fraction.
- `ensemble`: the same local models, and the prediction of the ensemble of all of them on the
  global test set, averaging their softmax outputs (FedMA, Wang et al., ICLR 2020, Tables 1-2,
  "Ensemble"). The averaged probabilities are a sum over clients, so they travel as one sum-reduced
  payload on evaluation rounds. Every client must train every round (clients_per_round = num_clients)
  so that every local model votes; each client also reports its own model's test accuracy.

Both take `init` (hpcfl.algorithms.initial): "independent" (the default: clients that never
communicate share no initial model), each client's model starts as its own initialisation, held as
the client's state from the start of the run (so a client first sampled in a later round starts from
it too), as the local models of FedMA's authors' ensemble (IBM/FedMA main.py: one network per client,
`init_models`) and of FedClassAvg's local baseline, whose default it also is; "shared", as the run's
one initial model of its architecture.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcfl.algorithms.base import ONE, WEIGHT, Phase, weighted, weighted_mean
from hpcfl.algorithms.initial import InitParams
from hpcfl.algorithms.personal import Personal
from hpcfl.errors import ConfigError
from hpcfl.models.evaluation import predict_proba, summarize
from hpcfl.payload import Layout

PROBS = "probs"


class LocalOnly(Personal):
    """Local training only: no communication; each client continues from its own model (personalised accuracy)."""
    name = "local_only"
    traits = Personal.traits

    @dataclass(frozen=True)
    class Params(InitParams):
        init: str = "independent"       # each client its own initial model; "shared": its architecture's one

    def plan(self, round):
        return [Phase("train")]

    def downlink(self, phase, round, server_state):
        return {}

    def aggregate(self, phase, round, server_state, uplink):
        pass

    def client_update(self, phase, round, client, downlink, model, trainer):
        start = self.start_own(model, client)
        metrics = self.train(model, client, round, trainer, {"model": start})
        self.keep_model(client, model)
        return {}, metrics


class Ensemble(LocalOnly):
    """FedMA's "Ensemble" baseline: the local-only models predict together by their averaged softmax."""
    name = "ensemble"
    traits = LocalOnly.traits.but(client_test=True)     # still no global model: no single model's features

    @classmethod
    def check(cls, job):
        super().check(job)
        if job.train.clients_per_round != job.data.num_clients:
            raise ConfigError(f"algorithm 'ensemble' combines every client's local model: set "
                              f"train.clients_per_round = data.num_clients ({job.data.num_clients})")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        probs = weighted(Layout((PROBS,), ((setup.test_size, setup.num_classes),)))
        self.plans = [Phase("train")], [Phase("train", uplink={PROBS: probs})]

    def plan(self, round):
        return self.plans[self.setup.job.evaluates(round)]

    def init_server_state(self, model):
        return {"ensemble": {PROBS: torch.full((self.setup.test_size, self.setup.num_classes),
                                               1.0 / self.setup.num_classes)}}

    def aggregate(self, phase, round, server_state, uplink):
        mean = weighted_mean(uplink[PROBS]) if PROBS in uplink else None
        if mean is not None:
            server_state["ensemble"][PROBS].copy_(mean[PROBS])

    def evaluate(self, server_state, model, x, y, batch_size):
        probs = server_state["ensemble"][PROBS].to(y.device)
        loss = F.nll_loss(probs.clamp(min=1e-12).log(), y, reduction="sum")
        return summarize(probs.argmax(1), y, loss, self.setup.num_classes)

    def client_update(self, phase, round, client, downlink, model, trainer):
        contributions, metrics = super().client_update(phase, round, client, downlink, model, trainer)
        if PROBS in phase.uplink:         # evaluation rounds: this model's vote, and its own accuracy
            x, y = client.test_set
            probs = predict_proba(model, x, self.setup.job.eval.batch_size)
            metrics["test_acc"] = float((probs.argmax(1) == y).float().mean())
            contributions[PROBS] = ({PROBS: probs, WEIGHT: ONE}, 1.0)
        return contributions, metrics
