"""FedProto — Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients",
AAAI 2022, Algorithm 1, eq. (6)-(8); the comparison in FedClassAvg's Table 2.

Clients keep their whole models (which may differ in architecture, as long as the feature width
agrees: hpcfl.algorithms.personal) and share only class prototypes, the mean features of each class.
Each round a sampled client trains on CE + lambda * mean squared distance between each sample's
features and its class's global prototype (eq. 8; classes without a global prototype yet add
nothing, as in the authors' code), then sends the per-class feature sums and counts of its trained
model. The server's prototype of class j is the count-weighted mean over the clients holding j
(eq. 6), which is the anchor-aggregation collective of FedFM (hpcfl.algorithms.anchors): one sum-reduction,
and a class nobody sent keeps its prototype. Accuracy is the client's own model (feature extractor +
classifier) on its local test set; the authors also report nearest-prototype inference, not done here.
Each client starts from its own initialisation (`init = "independent"`, hpcfl.algorithms.personal).

Ours, where the authors' code (yuetan031/FedProto) differs: their `proto_aggregation` takes the
plain mean of the clients' prototypes of a class, not the count-weighted one; they collect a client's
prototypes during its last local epoch, in training mode, where we take them from the trained model
in eval mode over all its training data; and their MSELoss divides by the batch's size times d with
zero rows for classes without a prototype, where we divide by the samples that have one (so their
lambda is weaker while some classes have none).
"""
from dataclasses import dataclass

from hpcfl.algorithms.anchors import ANCHORS, anchor_layouts, initial_anchors, local_anchors, update_anchors
from hpcfl.algorithms.base import Phase
from hpcfl.algorithms.initial import InitParams
from hpcfl.algorithms.personal import Personal
from hpcfl.terms import Term


class PrototypeDistance(Term):
    """lambda * MSE(features, global prototype of the label), over samples whose class has one."""
    name, batchable = "proto", True

    @dataclass(frozen=True)
    class Params:
        weight: float = 1.0           # lambda (the authors' `ld`)

    def start(self, model, client, round, received):
        self.prototypes = received[ANCHORS]["anchors"]
        self.known = received[ANCHORS]["known"] > 0

    def loss(self, model, x, y, features, logits):
        has = self.known[y]                      # a mask, not a selection: vmap-safe (train.batched_clients)
        squares = ((features - self.prototypes[y]) ** 2).sum(1) * has
        return self.params.weight * squares.sum() / (has.sum() * features.shape[1]).clamp(min=1)


class FedProto(Personal):
    """FedProto (Tan et al., AAAI 2022): personal models; class prototypes are averaged and pulled towards."""
    name = "fedproto"
    traits = Personal.traits

    @dataclass(frozen=True)
    class Params(InitParams, PrototypeDistance.Params):
        init: str = "independent"         # the authors' code builds each client's model anew (their CIFAR
                                          # ResNet-18s from ImageNet weights but for conv1, bn1 and fc)

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.terms.insert(0, PrototypeDistance(params))
        down, up = anchor_layouts(setup.num_classes, setup.feature_dim)
        self.phase = Phase("train", downlink={ANCHORS: down}, uplink={ANCHORS: up})

    def plan(self, round):
        return [self.phase]

    def init_server_state(self, model):
        return {ANCHORS: initial_anchors(self.setup.num_classes, self.setup.feature_dim)}

    def downlink(self, phase, round, server_state):
        return {ANCHORS: server_state[ANCHORS]}

    def client_update(self, phase, round, client, downlink, model, trainer):
        start = self.start_own(model, client)
        metrics = self.train(model, client, round, trainer, {**downlink, "model": start})
        self.keep_model(client, model)
        sums = local_anchors(model, client.inputs(), client.y, self.setup.job.eval.batch_size,
                             (self.setup.num_classes, self.setup.feature_dim),
                             "samples")
        return {ANCHORS: (sums, 1.0)}, metrics

    def aggregate(self, phase, round, server_state, uplink):
        update_anchors(server_state[ANCHORS], uplink[ANCHORS])
