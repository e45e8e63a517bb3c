"""FedAvg and the baselines that are FedAvg plus one local loss term.

FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, Algorithm 1: each sampled client k starts from the global model w, runs E local
epochs of minibatch SGD, and the server sets w <- sum_k n_k w_k / sum_k n_k over the cohort. Every
state_dict tensor (BatchNorm running statistics included) is averaged the same way; with
`model.batchnorm = "local"` clients keep their own BatchNorm layers (FedBN) while the server's
average serves the global model.

`init = "independent"` (FedAvg and every preset; hpcfl.algorithms.initial) runs the baselines of FedMA
(Wang et al., ICLR 2020, Appendix A: "without the shared initialization"): in round 0 each sampled
client starts from its own initialisation instead of the server's initial model, which is not sent,
and the round-0 aggregate is the sample-weighted mean of independently initialised and trained
models, i.e. one-shot averaging of local models, which is how the authors' FedAvg and FedProx
begin (IBM/FedMA main.py: `averaged_weights` of the local models, then `fedavg_comm` /
`fedprox_comm` from it; their local models train `epochs`, later rounds `retrain_epochs`, ours all
train.local_epochs). A local term's reference model in round 0 (FedProx's w^t, MOON's global
model) is the model the client starts from, its own. From round 1 on every sampled client starts
from the global model, one sampled for the first time included: the independent start only stands
in for a global model that does not exist yet. With every client in every round (the authors'
setting) that is each client's first training. Subclasses with Params of their own (FedAvgM,
SCAFFOLD, FedNova, FedDyn, FedFM-Lite) start from the shared model.

The presets below are FedAvg with their term (hpcfl.terms) and its parameters in
`[algorithm.params]` (plus `init`); naming the same term in `algorithm.terms` instead gives
the same run:
- `fedprox` FedProx, Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, eq. (2).
- `moon`    MOON, Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021, eq. (3)-(4).
- `fedrs`   FedRS, Li & Zhan, "FedRS: Federated Learning with Restricted Softmax for Label
            Distribution Non-IID Data", KDD 2021, section 4 (restricted softmax).
- `fedntd`  FedNTD, Lee et al., "Preservation of the Global Knowledge by Not-True Distillation in
            Federated Learning", NeurIPS 2022, eq. (4)-(5).
- `fedfm`   FedFM, Ye et al., "FedFM: Anchor-based Feature Matching for Data Heterogeneity in
            Federated Learning", IEEE TSP 2023, Algorithm 1 with contrastive guiding (section IV-C):
            each round from T_s on opens with the anchor phase (eq. 8-9, hpcfl.algorithms.anchors), then clients
            train with CE + lambda * CG and the server averages the models (eq. 11). `fm_l2` as a
            term on `fedavg` gives the l2 variant (eq. 3, 10).
- `fedka`   FedKA, Chen, Zhu & Zheng, "Towards Fast and Stable Federated Learning: Confronting
            Heterogeneity via Knowledge Anchor", ACM MM 2023, Algorithm 1: FedAvg whose clients add the
            knowledge-anchor term (eq. 3; `ka` in hpcfl.terms, which documents the choices the
            paper leaves open) against the round's global model, over the shared set S built once.
"""
import copy

import torch

from hpcfl.algorithms.base import ONE, WEIGHT, Algorithm, Phase, Traits, assign, weighted, weighted_mean
from hpcfl.algorithms.initial import InitParams, independent_init, with_init
from hpcfl.errors import ConfigError
from hpcfl.terms import ContrastiveGuiding, KnowledgeAnchor, Moon, NotTrueDistillation, Prox, RestrictedSoftmax


class FedAvg(Algorithm):
    """FedAvg (McMahan et al., AISTATS 2017, Alg. 1): the sample-weighted mean of the cohort's trained models."""
    name = "fedavg"
    traits = Traits(batched=True, stateless=True)
    Params = InitParams

    def __init__(self, params, setup):
        super().__init__(params, setup)
        if self.term:
            self.terms.insert(0, self.term(params))
            self.terms[0].seed = setup.job.run.seed       # as build_terms seeds a named term
        self.phase = Phase("train", downlink={"model": setup.model_layout},
                           uplink={"model": weighted(setup.model_layout)})
        independent = isinstance(params, InitParams) and params.init == "independent"
        self.first = Phase("train", uplink=self.phase.uplink) if independent else None     # round 0: no model sent
        self.pristine = copy.deepcopy(setup.template).cpu() if independent else None   # what own inits are drawn on

    @classmethod
    def check(cls, job):
        super().check(job)
        if cls.term and cls.term.name in job.algorithm.terms:
            raise ConfigError(f"algorithm '{cls.name}' already includes the '{cls.term.name}' term: set its "
                              f"parameters in [algorithm.params] and drop it from algorithm.terms")

    def plan(self, round):
        return [self.phase if round or self.first is None else self.first]

    def downlink(self, phase, round, server_state):
        return {"model": self.global_state(server_state)}

    def client_update(self, phase, round, client, downlink, model, trainer):
        if round == 0 and self.pristine is not None:        # its own init, also its terms' reference model
            own = independent_init(self.pristine, self.setup.job.run.seed, client.id)
            downlink = {**downlink, "model": {k: v.to(client.y.device) for k, v in own.items()}}
        self.start_from(model, client, downlink["model"])
        metrics = self.train(model, client, round, trainer, downlink)
        return {"model": ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples))}, metrics

    def aggregate(self, phase, round, server_state, uplink):
        mean = weighted_mean(uplink["model"])
        if mean is None:                  # nobody trained: keep the model
            return
        params = set(self.setup.parameter_names)
        assign(server_state["model"], {n: mean[n] for n in self.setup.model_layout.names if n not in params})
        self.update_parameters(server_state, mean, uplink)

    def update_parameters(self, server_state, mean, uplink) -> None:
        """The trained parameters from the cohort's mean `mean` (buffers such as BatchNorm statistics
        have taken the mean already): FedAvg takes it as is; subclasses apply their server rule."""
        assign(server_state["model"], {n: mean[n] for n in self.setup.parameter_names})

    def with_zeros(self, state, owner: str):
        """`state` plus `owner`'s zero tensor per trained parameter (a server-side variable)."""
        return {**state, owner: {n: torch.zeros_like(state["model"][n]) for n in self.setup.parameter_names}}


class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020, eq. 2): FedAvg whose clients add the proximal term `prox`."""
    name, term, Params = "fedprox", Prox, with_init(Prox.Params)
    traits = Traits(batched=True, stateless=True)


class MOON(FedAvg):            # not stateless: each client keeps its previous local model
    """MOON (Li, He & Song, CVPR 2021): FedAvg with the model-contrastive term `moon` and its projection head."""
    name, term, Params = "moon", Moon, with_init(Moon.Params)
    traits = Traits(batched=True)


class FedRS(FedAvg):
    """FedRS (Li & Zhan, KDD 2021): FedAvg with the restricted softmax `fedrs`."""
    name, term, Params = "fedrs", RestrictedSoftmax, with_init(RestrictedSoftmax.Params)
    traits = Traits(batched=True, stateless=True)


class FedNTD(FedAvg):
    """FedNTD (Lee et al., NeurIPS 2022): FedAvg with not-true distillation `ntd`."""
    name, term, Params = "fedntd", NotTrueDistillation, with_init(NotTrueDistillation.Params)
    traits = Traits(batched=True, stateless=True)


class FedFM(FedAvg):
    """FedFM (Ye et al., IEEE TSP 2023, Alg. 1): anchor phase from T_s, then FedAvg with contrastive guiding `fm_cg`."""
    name, term, Params = "fedfm", ContrastiveGuiding, with_init(ContrastiveGuiding.Params)
    traits = Traits(batched=True, stateless=True)


class FedKA(FedAvg):
    """FedKA (Chen et al., ACM MM 2023, Alg. 1): FedAvg with the knowledge-anchor term `ka` over a shared set."""
    name, term, Params = "fedka", KnowledgeAnchor, with_init(KnowledgeAnchor.Params)
    traits = Traits(batched=True, stateless=True)
