"""FedFM-Lite — Ye et al., "FedFM: Anchor-based Feature Matching for Data Heterogeneity in Federated
Learning", IEEE TSP 2023, section VI and Fig. 7 (section VII-C-3). The authors released no code for it; this follows
the paper.

One handshake per round: clients train with CE + lambda * contrastive guiding against the global
anchors they received, then compute their local anchors with the model they just trained (eq. 8)
and send them with their model. Anchors travel every round (from round T_s - 1 on, so that round
T_s has them); models every `model_every` = a rounds: the server broadcasts the model at rounds
0, a, 2a, ... and clients upload theirs at rounds a-1, 2a-1, ... and the last. In between, a
client continues from its own local model; one that has not trained since the latest global
model starts from that model (every worker keeps the latest broadcast, and checkpoints keep it, so
that a run resumed between model rounds has it too). The byte counters show
the saving: roughly a times fewer model bytes. Anchors travel inside its own phase, so the runtime
does not wrap it in FedFM's separate anchor phase (`traits.anchor_phase` False, hpcfl.algorithms.anchored).

The paper has every client train every round. With a > 1 we require that (our choice, refused at
config time otherwise): under partial participation a client sampled between model rounds but not
in the upload round would train for nothing, its local model never reaching the server.
"""
from dataclasses import dataclass

import torch

from hpcfl.algorithms.anchors import ANCHORS, anchor_layouts, local_anchors, update_anchors, with_anchors
from hpcfl.algorithms.base import ONE, WEIGHT, Phase, Traits, weighted
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.errors import ConfigError
from hpcfl.params import params_from
from hpcfl.terms import ContrastiveGuiding


class FedFMLite(FedAvg):
    """FedFM-Lite (Ye et al., section VI): one handshake a round; anchors every round, models every a rounds."""
    name, term = "fedfm_lite", ContrastiveGuiding
    traits = Traits(anchor_phase=False, batched=True)

    @dataclass(frozen=True)
    class Params(ContrastiveGuiding.Params):
        model_every: int = 1          # a in section VII-C: models every a rounds, anchors every round

        def __post_init__(self):
            super().__post_init__()
            if self.model_every < 1:
                raise ValueError(f"model_every = {self.model_every} must be >= 1")

    @classmethod
    def check(cls, job):
        super().check(job)
        every = params_from(cls.Params, job.algorithm.params, "algorithm.params").model_every
        if every > 1 and job.train.clients_per_round < job.data.num_clients:
            raise ConfigError(f"fedfm_lite with algorithm.params.model_every = {every} needs every client every round "
                              "(a client sampled between model rounds but not in the upload round would train for "
                              f"nothing): set train.clients_per_round = data.num_clients = {job.data.num_clients}, "
                              "or algorithm.params.model_every = 1")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.anchor_down, self.anchor_up = anchor_layouts(setup.num_classes, setup.feature_dim)
        self.latest = None       # the latest global model: received (workers), sent (the server)

    def init_server_state(self, model):
        return with_anchors(super().init_server_state(model), self.setup.num_classes, self.setup.feature_dim)

    def plan(self, round):
        every, last = self.params.model_every, self.setup.job.run.rounds - 1
        anchors = round >= self.params.start_round - 1          # sent up from the round before the term starts
        needed = round >= self.params.start_round or (anchors and self.params.anchor_weighting == "uniform")
        down = {**({"model": self.setup.model_layout} if round % every == 0 else {}),
                **({ANCHORS: self.anchor_down} if needed else {})}
        up = {**({"model": weighted(self.setup.model_layout)} if (round + 1) % every == 0 or round == last else {}),
              **({ANCHORS: self.anchor_up} if anchors else {})}
        return [Phase("train", downlink=down, uplink=up)]

    def downlink(self, phase, round, server_state):
        payloads = super().downlink(phase, round, server_state) if "model" in phase.downlink else {}
        if "model" in payloads:        # rank 0 keeps it too, for the checkpoint (`carried_state`)
            self.latest = {k: v.detach().clone() for k, v in payloads["model"].items()}
        if ANCHORS in phase.downlink:
            payloads[ANCHORS] = server_state[ANCHORS]
        return payloads

    def receive(self, phase, round, downlink):
        if "model" in downlink:
            self.latest = downlink["model"]

    def carried_state(self):
        return {k: v.cpu() for k, v in (self.latest or {}).items()}

    def load_carried_state(self, state):
        self.latest = state or None

    def client_update(self, phase, round, client, downlink, model, trainer):
        own = client.state.get("model")               # its own model between uploads, and the round it grew from
        base = round - round % self.params.model_every         # the latest model round: a resumed run knows it too
        fresh = not own or int(client.state["base"]["round"]) != base
        start = self.latest if fresh else own
        self.start_from(model, client, start)
        metrics = self.train(model, client, round, trainer, {**downlink, "model": start})
        contributions = {}
        if ANCHORS in phase.uplink:
            contributions[ANCHORS] = (local_anchors(model, client.inputs(), client.y, self.setup.job.eval.batch_size,
                                                    (self.setup.num_classes, self.setup.feature_dim),
                                                    self.params.anchor_weighting,
                                                    downlink.get(ANCHORS)), 1.0)
        client.state.pop("model", None)
        client.state.pop("base", None)
        if "model" in phase.uplink:
            contributions["model"] = ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples))
        else:                          # keep training this model until the next global one
            client.state["model"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            client.state["base"] = {"round": torch.tensor(base)}
        return contributions, metrics

    def aggregate(self, phase, round, server_state, uplink):
        if ANCHORS in uplink:
            update_anchors(server_state[ANCHORS], uplink[ANCHORS])
        if "model" in uplink:
            super().aggregate(phase, round, server_state, uplink)
