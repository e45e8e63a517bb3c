"""FedFM's anchor phase around any algorithm: Ye et al., FedFM, section IV-B and Algorithm 1.

With a feature-matching term in the job (`fm_cg`, `fm_l2`; `fedfm` is FedAvg with `fm_cg`), every
round from the term's start round opens with the anchor phase: the server sends the global model
(with the global anchors under `uniform` weighting, whose local anchors need them), each sampled
client sends its per-class feature sums under that model (hpcfl.algorithms.anchors), and the server
updates the anchors. The algorithm's own phases then carry the anchors instead of the model, which
the clients already hold. `WithAnchors` does all of it around the algorithm it wraps, the way a
strategy wraps a strategy (flower's dp_fixed_clipping): the wrapped algorithm never sees the anchor
phase, and FedAvg, FedProx, FedNova, MOON, ... all get it by configuration. An algorithm that
carries anchors in its own phases (FedFM-Lite: one handshake) or cannot use them (no global model)
is not wrapped: `wrap` asks its `traits.anchor_phase`.
"""
import dataclasses

from hpcfl.algorithms.anchors import ANCHORS, anchor_layouts, local_anchors, update_anchors, with_anchors
from hpcfl.algorithms.base import Algorithm, Phase


def matching_term(algorithm: Algorithm):
    """The job's feature-matching term, if any (Algorithm.check allows one at most)."""
    return next((t for t in algorithm.terms if t.needs_anchors), None)


def wrap(algorithm: Algorithm) -> Algorithm:
    """The algorithm the runtime drives: wrapped when its job matches features and it takes the phase."""
    return WithAnchors(algorithm) if algorithm.traits.anchor_phase and matching_term(algorithm) else algorithm


class WithAnchors:
    """Everything but the anchor phase is the wrapped algorithm's (attributes are looked up there)."""

    def __init__(self, inner: Algorithm):
        self.inner, self.term = inner, matching_term(inner)
        setup = inner.setup
        self.down, self.up = anchor_layouts(setup.num_classes, setup.feature_dim)
        uniform = self.term.params.anchor_weighting == "uniform"     # only these local anchors need the global ones
        down = {"model": setup.model_layout, **({ANCHORS: self.down} if uniform else {})}
        self.opening = Phase(ANCHORS, downlink=down, uplink={ANCHORS: self.up})

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def plan(self, round: int) -> list[Phase]:
        own = self.inner.plan(round)
        if round < self.term.params.start_round:
            return own
        return [self.opening,
                *(dataclasses.replace(p, downlink={**{k: v for k, v in p.downlink.items() if k != "model"},
                                                   ANCHORS: self.down}) if isinstance(p, Phase) else p
                  for p in own)]

    def init_server_state(self, model):
        setup = self.inner.setup
        return with_anchors(self.inner.init_server_state(model), setup.num_classes, setup.feature_dim)

    def downlink(self, phase, round, server_state):
        if phase.name == ANCHORS:
            payloads = {"model": self.inner.global_state(server_state)}
        else:
            payloads = self.inner.downlink(phase, round, server_state) if phase.downlink.keys() - {ANCHORS} else {}
        if ANCHORS in phase.downlink:
            payloads[ANCHORS] = server_state[ANCHORS]
        return payloads

    def aggregate(self, phase, round, server_state, uplink):
        if phase.name == ANCHORS:
            update_anchors(server_state[ANCHORS], uplink[ANCHORS])
        else:
            self.inner.aggregate(phase, round, server_state, uplink)

    def receive(self, phase, round, downlink):
        if phase.name != ANCHORS:
            self.inner.receive(phase, round, downlink)

    def client_update(self, phase, round, client, downlink, model, trainer):
        if phase.name != ANCHORS:          # `downlink` holds the anchor phase's model too (the round's broadcasts)
            return self.inner.client_update(phase, round, client, downlink, model, trainer)
        self.inner.start_from(model, client, downlink["model"])
        setup = self.inner.setup
        sums = local_anchors(model, client.inputs(), client.y, setup.job.eval.batch_size,
                             (setup.num_classes, setup.feature_dim),
                             self.term.params.anchor_weighting, downlink.get(ANCHORS))
        return {ANCHORS: (sums, 1.0)}, {}
