"""FedClassAvg — Jang et al., "FedClassAvg: Local Representation Learning for Personalized Federated
Learning on Heterogeneous Neural Networks", ICPP 2022, Algorithm 1.

Clients keep their whole models, which may differ in architecture (hpcfl.algorithms.personal); only
the classifier Linear(512 -> C) is shared. Each round the sampled clients replace their classifier
with the global one, train one local epoch on eq. (4) = supervised contrastive loss on two augmented
views (`supcon`) + cross-entropy on the first view + rho * proximal term on the classifier (eq. 5;
per-tensor mean squared difference times rho / 2, as the authors' code computes it), and the server
averages the classifiers weighted by |D_k| (eq. 3). The classifier is a parameter-selected payload:
one sum-reduction of (512 + 1) * C + 1 floats per round.

`share = "all"` is the homogeneous scenario of Table 3 ("+weight"): the whole model is averaged,
the proximal term still on the classifier only. Defaults follow Table 1 for CIFAR-10 with the
standard SupCon temperature; the authors' code uses temperature 100 on unnormalised features
(`temperature = 100, normalize = false`). As in the paper (section 4.2), clients start without the
local warm-up epoch the authors' script runs. Adam with betas (0.5, 0.999) as in their code is
`train.betas`.
"""
from dataclasses import dataclass

from hpcfl.algorithms.base import ONE, WEIGHT, Phase, assign, weighted, weighted_mean
from hpcfl.algorithms.personal import Personal
from hpcfl.errors import ConfigError
from hpcfl.regularizers import Prox, SupCon

SHARED = "shared"


class FedClassAvg(Personal):
    name = "fedclassavg"

    @dataclass(frozen=True)
    class Params:
        rho: float = 0.1
        temperature: float = 0.07
        base_temperature: float = 0.07
        normalize: bool = True
        share: str = "classifier"         # classifier | all (Table 3, "+weight": homogeneous models only)

        def __post_init__(self):
            if self.share not in ("classifier", "all"):
                raise ValueError(f"share = {self.share!r}; choose 'classifier' or 'all'")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.regularizers[:0] = [SupCon(SupCon.Params(1.0, params.temperature, params.base_temperature, params.normalize)),
                                 Prox(Prox.Params(params.rho, scope="classifier", reduction="mean"))]
        self.shared = setup.model_layout.select(lambda n: params.share == "all" or n.startswith("classifier."))
        self.phase = Phase("train", downlink={SHARED: self.shared},
                           uplink={SHARED: weighted(self.shared)})

    @classmethod
    def check(cls, job):
        super().check(job)
        if dict(job.algorithm.params).get("share") == "all" and len(job.architectures) > 1:
            raise ConfigError("algorithm.params.share = 'all' averages whole models, so every client needs the "
                              f"same architecture; model.architectures = {list(job.architectures)}")
        if job.algorithm.regularizers.keys() & {"supcon", "prox"}:
            raise ConfigError("fedclassavg already has its supcon and classifier prox terms: set them in "
                              "[algorithm.params] (rho, temperature, ...) and drop them from algorithm.regularizers")

    def plan(self, round):
        return [self.phase]

    def init_server_state(self, model):
        state = model.state_dict()
        return {f"model.{n}": state[n].detach().clone() for n in self.shared.names}

    def downlink(self, phase, round, server_state):
        return {SHARED: {n: server_state[f"model.{n}"] for n in self.shared.names}}

    def client_update(self, phase, round, client, downlink, model, trainer):
        start = self.start_own(model, client, downlink[SHARED])
        metrics = self.train(model, client, round, trainer, {"model": start})
        if self.params.share == "classifier":           # with "all" the next round overwrites everything
            self.keep_model(client, model)
        state = model.state_dict()
        return {SHARED: ({**{n: state[n] for n in self.shared.names}, WEIGHT: ONE}, float(client.num_samples))}, metrics

    def aggregate(self, phase, round, server_state, uplink):
        mean = weighted_mean(uplink[SHARED])
        if mean is not None:
            assign(server_state, "model.", mean)
