"""FedMA — Wang, Yurochkin, Sun, Papailiopoulos & Khazaeni, "Federated Learning with Matched
Averaging", ICLR 2020: Algorithm 1 (layer-wise matching, freezing and retraining), section 2.3 (FedMA
with communication), eq. (2)-(3) solved by BBP-MAP (hpcfl.algorithms.bbp_map), eq. (5) for conv channels and
eq. (6) for LSTM hidden units (hpcfl.algorithms.neurons).

A round of an N-layer network has N + 1 phases:
- `train`: each client rebuilds its model at its own size from the global model with its last
  assignment and trains every layer for train.local_epochs. Round 0 starts from the client's own
  random initialisation (`init = "independent"`, hpcfl.algorithms.initial: the paper's realistic
  setting, Appendix A, and the authors' code); `init = "shared"` starts everyone from the run's one
  initial model;
- `match_<layer>` for layers 1..N-1: the clients' neurons of that layer (inputs already in the global
  order of the layer before) are gathered to the server, matched (the global layer may grow), the
  matched layer broadcast and each client's assignment scattered. The client installs the global
  layer, permutes and zero-pads the next layer's inputs, freezes the layers matched so far and retrains
  the rest for `retrain_epochs` (`retrain = false`: PFNM-style one-shot matching, no retraining).
  After layer N-1 only the last layer trains, at train.lr * `last_lr_scale` (0.1) for
  `retrain_epochs` * `last_epochs_scale` (3) epochs: the authors' code (IBM/FedMA main.py,
  `local_retrain` at freezing_index = len(weights) - 2) does this for every CNN and in every
  round, as its `fedma_comm` re-runs BBP_MAP each round; the paper (Appendix A) reports it for VGG-9
  only, and their LSTM script (language_modeling/lstm_fedma_with_comm.py) retrains the decoder like
  the other layers. Set both to 1 to retrain it like the other layers (the Shakespeare job does).
  Their code also drops weight decay in the other retraining phases and uses 1e-4 in this one; we
  keep train.weight_decay throughout;
- `match_<last>`: the last layer is not matched but averaged per class, each client's row of class k
  weighted by its share of the class-k samples (Algorithm 1's p_jk; a class nobody holds: plain mean).
Every client takes part in every round, as in the paper: an assignment refers to the global model it
was made against. The global model's size, growth over the local size (Tables 1-2, 6-7) and the
server's matching time per layer are recorded each round.

gamma = 7 (Appendix D.2) was tuned for J = 16 clients. BBP-MAP's prior gain for a client's k-th new
neuron is 2 log(gamma / (J k)); for joining a global neuron that c of the other clients hold, log(c /
(J - c)). Where the data terms are small against the prior's (weights small against sigma^2 = 1, as
for independently initialised networks), the prior alone sets the widths: every client after the
first opens its k-th new neuron while that beats joining a neuron only one other client holds, so
each opens f = #{k >= 1 : k < (gamma / J) sqrt(J - 1)} and a layer grows by (J - 1) f neurons. At
J = 16, gamma = 7: f = 1 (7/16 * sqrt(15) = 1.69), 15 more per layer (the shapes of the paper's
Table 7); at J = 10: f = 2, 18 more; gamma <= J / sqrt(J - 1) (about sqrt(J)) adds none. The paper's
f = 1 at other J needs J / sqrt(J - 1) < gamma <= 2 J / sqrt(J - 1) (J = 10: 3.3 to 6.7).
"""
import copy
import time
from dataclasses import dataclass, replace

import torch

from hpcfl.algorithms.base import Algorithm, finite
from hpcfl.algorithms.bbp_map import Prior, match_neurons
from hpcfl.algorithms.initial import InitParams, independent_init
from hpcfl.algorithms.neurons import (
    chain,
    decode,
    encode,
    pick,
    pick_inputs,
    place,
    place_inputs,
    recurrent,
    resize_,
    signature,
    width,
    with_signature,
)
from hpcfl.algorithms.phases import MATCHED, Matching, MatchPhase, Phase
from hpcfl.errors import ConfigError, TrainingFault
from hpcfl.payload import Layout
from hpcfl.seeding import numpy_rng


class FedMA(Matching, Algorithm):
    """FedMA (Wang et al., ICLR 2020, Alg. 1): layer-wise matching with BBP-MAP, then retraining."""
    name = "fedma"

    @dataclass(frozen=True)
    class Params(InitParams, Prior):
        retrain: bool = True            # False: one-shot matching without retraining (PFNM, Figure 1)
        retrain_epochs: int = 1         # local epochs of retraining after each matched layer
        last_lr_scale: float = 0.1      # the last layer's retraining (alone) at lr * this...
        last_epochs_scale: int = 3      # ...for retrain_epochs * this (the authors' code: lr/10, 3x)
        init: str = "independent"       # "shared": every client starts from the run's initial model

        def __post_init__(self):
            super().__post_init__()
            if self.retrain_epochs < 1:
                raise ValueError(f"retrain_epochs = {self.retrain_epochs} must be >= 1")
            if self.last_lr_scale <= 0 or self.last_epochs_scale < 1:
                raise ValueError(f"last_lr_scale = {self.last_lr_scale} must be > 0 and last_epochs_scale = "
                                 f"{self.last_epochs_scale} >= 1 (the authors: 0.1 and 3; 1 and 1: as other layers)")

    @classmethod
    def check(cls, job):
        super().check(job)
        if job.train.clients_per_round != job.data.num_clients:
            raise ConfigError(f"fedma matches every client every round (an assignment refers to the last global "
                              f"model): set train.clients_per_round = data.num_clients = {job.data.num_clients}")
        if job.algorithm.terms:
            raise ConfigError("fedma clients train on cross-entropy alone: drop algorithm.terms")
        if job.train.on_nonfinite == "drop":
            raise ConfigError("fedma matches every client's neurons within the round, so a client cannot be left "
                              "out of it: set train.on_nonfinite = 'stop'")
        if job.eval.forgetting:
            raise ConfigError("eval.forgetting measures how far a client's training moves it from the global model "
                              "it started from, and a fedma client starts from its own-width slice of the global "
                              "model (its first round: its own model): set eval.forgetting = false")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.layers = chain(setup.template)
        self.last = len(self.layers) - 1
        self.template = {k: v.detach().cpu().clone() for k, v in setup.template.state_dict().items()}
        self.own_width = [width(self.template, layer) for layer in self.layers]
        self.widths = list(self.own_width)          # global widths, as every rank learns them
        self.phase_layer = {f"match_{layer.name}": i for i, layer in enumerate(self.layers)}
        self.match_s: dict[str, float] = {}

    def plan(self, round):
        model = {"model": Layout.of(self._shapes(self.last))} if round else {}
        return [Phase("train", downlink=model), *(MatchPhase(name) for name in self.phase_layer)]

    def _shapes(self, upto: int) -> dict[str, torch.Tensor]:
        """The template's tensors (values meaningless) with layers < upto at their global widths: the
        shapes a client's model has when layer `upto` is gathered (upto = N - 1: the global model's)."""
        state = self.template
        for i in range(upto):
            own = torch.arange(self.own_width[i])
            state = place_inputs(place(state, self.layers[i], own, self.widths[i]), self.layers[i + 1], own,
                                 self.own_width[i], self.widths[i])
        return state

    # -- server ------------------------------------------------------------------------------------
    def downlink(self, phase, round, server_state):
        return {"model": self.global_state(server_state)}

    def match(self, phase, round, server_state, gathered):
        start, i = time.perf_counter(), self.phase_layer[phase.name]
        layer, clients, shapes = self.layers[i], sorted(gathered), self._shapes(i)
        states = [decode(gathered[c], shapes, layer, self.own_width[i]) for c in clients]
        if i == self.last:
            merged = with_signature(shapes, layer, self._class_average(states, clients))
            shared, replies = torch.zeros(0), {c: torch.zeros(0) for c in clients}
        else:
            _, bias = signature(shapes, layer)
            means, assignment = match_neurons([signature(s, layer)[0].numpy() for s in states], bias.numpy(),
                                              self.params, numpy_rng(self.setup.job.run.seed, "bbp_map", round, i))
            self.widths[i] = count = means.shape[0]
            merged = with_signature(shapes, layer, torch.from_numpy(means))
            for p in recurrent(layer):          # LSTM hidden-to-hidden: mean over the clients holding each entry
                placed = [place(s, layer, a, count)[p.key] for s, a in zip(states, assignment, strict=True)]
                held = [place({**s, p.key: torch.ones_like(s[p.key])}, layer, a, count)[p.key]
                        for s, a in zip(states, assignment, strict=True)]
                merged[p.key] = sum(placed) / sum(held).clamp(min=1)
            shared = torch.cat([torch.tensor([float(count)], dtype=torch.float64), encode(merged, layer)])
            replies = {c: torch.from_numpy(a) for c, a in zip(clients, assignment, strict=True)}
        model = server_state["model"]
        for p in layer.params:                  # a new shape, on the server's device
            model[p.key] = merged[p.key].to(model[p.key].device, self.template[p.key].dtype)
        self.match_s[layer.name] = time.perf_counter() - start
        return shared, replies

    def _class_average(self, states, clients) -> torch.Tensor:
        counts = torch.as_tensor(self.setup.class_counts[clients], dtype=torch.float64)       # J x C
        total = counts.sum(0)
        share = torch.where(total > 0, counts / total.clamp(min=1), 1.0 / len(clients))
        rows = torch.stack([signature(s, self.layers[-1])[0] for s in states])               # J x C x D
        return (share[:, :, None] * rows).sum(0)

    def global_module(self, server_state, model):
        return resize_(copy.deepcopy(model), self.global_state(server_state))

    def server_metrics(self, server_state):
        size = sum(v.numel() for v in server_state["model"].values())
        return {"global_params": size, "growth_rate": size / sum(v.numel() for v in self.template.values()),
                # strict=False: the last layer's width (the classes) is left out
                **{f"width/{layer.name}": w for layer, w in zip(self.layers[:-1], self.widths, strict=False)},
                **{f"match_s/{k}": v for k, v in self.match_s.items()}}

    def carried_state(self):
        return {"widths": torch.tensor(self.widths)}

    def load_carried_state(self, state):
        self.widths = state["widths"].tolist()

    # -- client ------------------------------------------------------------------------------------
    def init_client_state(self, client, initial_model):
        seed = self.setup.job.run.seed
        state = (independent_init(initial_model, seed, client.id) if self.params.init == "independent"
                 else initial_model.state_dict())
        return {"model": {k: v.detach().cpu().clone() for k, v in state.items()}}

    def client_model(self, client, model):
        return copy.deepcopy(model)

    def receive(self, phase, round, downlink):
        i = self.phase_layer.get(phase.name)
        if i is not None and i != self.last:
            self.widths[i] = int(downlink[MATCHED]["global"][0])

    def gather_out(self, phase, round, client):
        return encode(client.state["model"], self.layers[self.phase_layer[phase.name]])

    def client_update(self, phase, round, client, downlink, model, trainer):
        if phase.name == "train":
            resize_(model, client.state["model"] if round == 0 else self._own_size(client, downlink["model"]))
            metrics = self.train(model, client, round, trainer, {})
        else:
            i = self.phase_layer[phase.name]
            if i == self.last:                      # the last layer's class average is the server's
                return {}, {}
            assignment = downlink[MATCHED]["reply"].long()
            client.state.setdefault("assignment", {})[self.layers[i].name] = assignment
            resize_(model, self._install(client.state["model"], i, downlink[MATCHED]["global"], assignment))
            metrics = self._retrain(model, client, round, trainer, i) if self.params.retrain else {}
        if not finite(model.state_dict().values()):
            raise TrainingFault(f"round {round + 1}, phase '{phase.name}': client {client.id}'s model is not finite "
                                "(NaN/Inf) after training, and fedma cannot match its neurons, so the run stops "
                                "(its earlier rounds are recorded). Fix: lower train.lr")
        client.state["model"] = {k: v.detach() for k, v in model.state_dict().items()}
        return {}, metrics

    def _retrain(self, model, client, round, trainer, i):
        """Train the layers after layer i, the matched ones frozen, on fresh batch draws; the last layer
        alone (i = N - 2) at lr * last_lr_scale for retrain_epochs * last_epochs_scale."""
        frozen = {layer.name for layer in self.layers[:i + 1]}
        for name, module in model.named_modules():
            if name in frozen:
                module.requires_grad_(False)
        epochs = self.params.retrain_epochs
        if i == self.last - 1:
            epochs *= self.params.last_epochs_scale
            trainer = copy.copy(trainer)
            trainer.cfg = replace(trainer.cfg, lr=trainer.cfg.lr * self.params.last_lr_scale)
        start = self.setup.job.train.local_epochs + i * self.params.retrain_epochs
        return self.train(model, client, round, trainer, {}, epochs=range(start, start + epochs))

    def _own_size(self, client, global_model) -> dict[str, torch.Tensor]:
        """The global model sliced back to the client's size with its last assignments (section 2.3)."""
        state = dict(global_model)
        for i, layer in enumerate(self.layers[:-1]):
            mine = client.state["assignment"][layer.name]
            state = pick_inputs(pick(state, layer, mine), self.layers[i + 1], mine, self.widths[i])
        return state

    def _install(self, state, i, shared, assignment):
        """The matched global layer i in place of the client's, the next layer's inputs permuted and
        zero-padded to match (Algorithm 1: W_{j,n+1} <- Pi_j W_{j,n+1})."""
        layer, count = self.layers[i], int(shared[0])
        dtype = state[layer.params[0].key].dtype
        installed = decode(shared[1:].to(dtype), state, layer, count)
        return place_inputs(installed, self.layers[i + 1], assignment, self.own_width[i], count)

