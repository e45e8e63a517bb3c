"""FedClassAvg — Jang et al., "FedClassAvg: Local Representation Learning for Personalized Federated
Learning on Heterogeneous Neural Networks", ICPP 2022, Algorithm 1.

Clients keep their whole models, which may differ in architecture (hpcfl.algorithms.personal); only
the classifier Linear(512 -> C) is shared. Each round the sampled clients replace their classifier
with the global one, train one local epoch on eq. (4) = supervised contrastive loss on two augmented
views (`supcon`) + cross-entropy on the first view + rho * proximal term on the classifier (eq. 5;
per-tensor mean squared difference times rho / 2, as the authors' code computes it), and the server
averages the classifiers weighted by |D_k| (eq. 3). The classifier is a parameter-selected payload:
one sum-reduction of (512 + 1) * C + 1 floats per round.

`supcon_weight` scales the contrastive loss; 0 is Table 4's ablation CA + PR (the paper's), with
the two augmented views kept, so that it differs from the full method in the contrastive loss alone
and its cross-entropy sees the same augmented view (ours; the paper does not say).

`share = "all"` is the homogeneous scenario of Table 3 ("+weight"): the whole model is averaged,
the proximal term still on the classifier only. Defaults: Table 1's CIFAR-10 rho and no warm-up (the
paper's); every client its own initialisation (`init = "independent"`: Algorithm 1 initialises
each w_k^0, and the authors' `define_model` builds each client's model anew; "shared" starts every
client of an architecture from one model); the standard SupCon, on normalised features at
temperature 0.07 (ours: the paper gives neither).

The authors' code (hukla/FedClassAvg, `heteropfl_utils.train_cl`, `supcon_utils.define_model`)
differs, and jobs/fedclassavg follow it: SupCon at temperature 100 with base temperature 0.07 (the
loss times 100 / 0.07) on unnormalised features (`temperature = 100, normalize = false`), read from a
Linear layer with no activation, the ReLU starting the classifier (`[model] params preactivation =
true`; ResNet-18's extractor ends with an extra Linear(512, 512): `feature_layer = 512`); and one
local warm-up epoch before round 1 (`warmup_epochs = 1`, their `pretrain`): every client trains its
own initial model on the same loss, the proximal term pulling towards its own initial classifier,
uploads nothing, and then takes the global classifier like any round. We run a client's warm-up at
its first participation, which gives the same model as running it before round 1 (it depends on the
client alone) without training clients never sampled; its batches and augmentations come from the
run's seed through hpcfl.seeding ("fedclassavg.warmup", client), never from the rank. Their local
training stops after one epoch whatever --local_epochs says (the return sits inside the epoch loop).
Learning rates: Table 1 gives Fashion-MNIST 6e-4, their configs/fashion-mnist.json 1e-4 (a copy of
cifar10.json; supcon_utils.py has 6e-4); CIFAR-10 1e-4 and EMNIST 5e-4 agree. Adam with betas
(0.5, 0.999) as in their code is `train.betas`.
"""
import copy
from dataclasses import dataclass

import torch

from hpcfl.algorithms.base import ONE, WEIGHT, Phase, assign, weighted, weighted_mean
from hpcfl.algorithms.initial import InitParams
from hpcfl.algorithms.personal import Personal
from hpcfl.errors import ConfigError
from hpcfl.seeding import torch_seed
from hpcfl.terms import Prox, SupCon
from hpcfl.terms.contrastive import check_temperatures

SHARED = "shared"
WARMED = "warmup"        # the owner of a client's flag that it has warmed up (its own model may come first)


class FedClassAvg(Personal):
    """FedClassAvg (Jang et al., ICPP 2022, Alg. 1): personal models; only the classifier is averaged."""
    name = "fedclassavg"
    traits = Personal.traits

    @dataclass(frozen=True)
    class Params(InitParams):
        init: str = "independent"         # each client's own w_k^0 (Alg. 1; the authors build each model anew)
        rho: float = 0.1                  # the classifier-only proximal term's weight (eq. 5)
        temperature: float = 0.07         # SupCon's tau (the authors' code: 100)
        base_temperature: float = 0.07    # SupCon is scaled by temperature / base_temperature
        normalize: bool = True            # SupCon on L2-normalised features (the authors' code: false)
        share: str = "classifier"         # classifier | all (Table 3, "+weight": homogeneous models only)
        warmup_epochs: int = 0            # local epochs before a client's first round (the authors' code: 1)
        supcon_weight: float = 1.0        # 0: Table 4's CA + PR, no contrastive loss (still two augmented views)

        def __post_init__(self):
            super().__post_init__()
            check_temperatures(self.temperature, self.base_temperature)
            if self.share not in ("classifier", "all"):
                raise ValueError(f"share = {self.share!r}; choose 'classifier' or 'all'")
            if not self.supcon_weight >= 0:
                raise ValueError(f"supcon_weight = {self.supcon_weight} must be >= 0 (0: no contrastive loss)")
            if self.warmup_epochs < 0:
                raise ValueError(f"warmup_epochs = {self.warmup_epochs} must be >= 0 (the authors' code: 1)")
            if self.warmup_epochs and self.share == "all":
                raise ValueError("warmup_epochs with share = 'all' is lost: the first round's global model replaces "
                                 "the whole warmed-up model; set warmup_epochs = 0")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.terms[:0] = [SupCon(SupCon.Params(params.supcon_weight, params.temperature, params.base_temperature,
                                               params.normalize)),
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
        if job.algorithm.terms.keys() & {"supcon", "prox"}:
            raise ConfigError("fedclassavg already has its supcon and classifier prox terms: set them in "
                              "[algorithm.params] (rho, temperature, ...) and drop them from algorithm.terms")

    def plan(self, round):
        return [self.phase]

    def init_server_state(self, model):
        state = model.state_dict()
        return {"model": {n: state[n].detach().clone() for n in self.shared.names}}

    def downlink(self, phase, round, server_state):
        return {SHARED: server_state["model"]}

    def client_update(self, phase, round, client, downlink, model, trainer):
        if self.params.warmup_epochs and WARMED not in client.state:
            self.warm_up(model, client, trainer)
        start = self.start_own(model, client, downlink[SHARED])
        metrics = self.train(model, client, round, trainer, {"model": start})
        if self.params.share == "classifier":           # with "all" the next round overwrites everything
            self.keep_model(client, model)
        state = model.state_dict()
        return {SHARED: ({**{n: state[n] for n in self.shared.names}, WEIGHT: ONE}, float(client.num_samples))}, metrics

    def warm_up(self, model, client, trainer):
        """The authors' warm-up: the round's loss on the client's own initial model, kept, not sent.
        The trainer's draws are keyed by a seed derived for the warm-up, apart from every round's."""
        start = self.start_own(model, client)
        warm = copy.copy(trainer)
        warm.seed = torch_seed(trainer.seed, "fedclassavg.warmup")
        self.train(model, client, 0, warm, {"model": start}, epochs=range(self.params.warmup_epochs))
        self.keep_model(client, model)
        client.state[WARMED] = {"done": torch.ones(())}     # an owner of its own, checkpointed with the model

    def aggregate(self, phase, round, server_state, uplink):
        mean = weighted_mean(uplink[SHARED])
        if mean is not None:
            assign(server_state["model"], mean)
