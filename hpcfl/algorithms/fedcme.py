"""FedCME — Nie, Xiao, Yang & Wu, "FedCME: Client Matching and Classifier Exchanging to Handle Data
Heterogeneity in Federated Learning", section IV, Algorithms 1-2, eq. (4)-(10). No released code: the
paper is the specification, and the choices it leaves open are marked "ours" below.

A round is three phases. `first`: the server matches the cohort (MakeMatching, Algorithm 1: vectors
sorted by cosine similarity to their mean, ascending; each in turn pairs with the remaining client
of least similarity; an odd client out trains without exchange) and sends the model, the global
features and the pairing; clients train floor(E/2) epochs. `swap`: partners exchange classifiers,
w(theta_k, phi_j) and w(theta_j, phi_k), through the transport's exchange (in memory on one
worker, point to point across ranks). `second`: clients finish the E epochs and send their model
(FedAvg by |D_k|, eq. 3; ours: normalised over the cohort, where eq. 3 divides by all K clients' data,
which sums to less than one when a cohort is sampled), their local features and their evaluation vector.

- Feature alignment (eq. 9-10): per batch, mu * sum over the batch's classes of ||class-mean feature
  - global feature||^2; classes without a global feature yet are not aligned (ours: at round 0 no
  class has one). Local features (eq. 5) are accumulated over all E epochs of training (Algorithm 2
  lines 11-12, 18); the global features average them over the cohort, a client's missing classes
  filled with the current global feature (the memory mechanism, eq. 6), through the anchor
  collective (hpcfl.algorithms.anchors.uniform_contribution). Ours: a class without a global feature
  yet is averaged over the clients that hold it, where eq. 6's memory would count a zero vector for
  every other client. They take the place of FedFM's anchors, so `check`
  refuses any feature-matching term (built-in or plug-in: whatever `needs_anchors`).
- Evaluation vector (eq. 4): per-class accuracy of the trained local model on a random 20 % of its
  data (drawn per seed, round and client; classes absent there count 0). A client never evaluated
  yet has the all-ones vector (ours: "no information"), and ties in the matching go to the earlier
  client of the sorted order.
- A half-trained model that is not finite (NaN/Inf) neither gives nor takes at the swap (ours): its
  partner keeps its own classifier, and the faulty client's second half flags it.
- The optimizer is rebuilt at the swap (ours): exact for the paper's plain SGD; with momentum or Adam
  their state starts again at the swap, halfway through the local epochs.
- Ablations (section V-B): `exchange = "none"` with mu > 0 is FedCME-OL, mu = 0 is FedCME-OE;
  `matching = "many_to_one"` lets each client take the classifier of its least similar client even
  if another took it too (FedCME-MTO); `exchange = "model"` / `"features"` swap the whole model or the
  feature extractor instead (FedCME-WM, FedCME-FE).
"""
from dataclasses import dataclass

import numpy as np
import torch

from hpcfl.algorithms.anchors import anchor_layouts, initial_anchors, uniform_contribution, update_anchors
from hpcfl.algorithms.base import ONE, WEIGHT, Phase, Traits, assign, finite, weighted
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.algorithms.phases import SwapPhase, Swapping
from hpcfl.errors import ConfigError
from hpcfl.models import load_state
from hpcfl.params import params_from
from hpcfl.payload import Layout
from hpcfl.seeding import cohort_schedule, numpy_rng
from hpcfl.terms import Term, matching_terms

FEATURES, PARTNERS, EVALUATION = "features", "partners", "evaluation"
SWAPPED = {"classifier": lambda n: n.startswith("classifier."), "features": lambda n: not n.startswith("classifier."),
           "model": lambda n: True}


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarities of rows of a with rows of b; a zero vector is 0-similar to everything."""
    unit = lambda m: m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)   # noqa: E731
    return unit(a) @ unit(b).T


def make_matching(vectors: np.ndarray, cohort: list[int]) -> dict[int, int]:
    """Algorithm 1, MakeMatching: receiver -> source for both members of every pair."""
    v = vectors[cohort]
    order = list(np.argsort(_cosine(v, v.mean(0, keepdims=True))[:, 0], kind="stable"))
    sources = {}
    while len(order) >= 2:
        k = order.pop(0)
        j = order.pop(int(np.argmin(_cosine(v[k:k + 1], v[order])[0])))
        sources[cohort[k]], sources[cohort[j]] = cohort[j], cohort[k]
    return sources


def many_to_one(vectors: np.ndarray, cohort: list[int]) -> dict[int, int]:
    """Section V-B's many-to-one matching: every client takes its least similar client's classifier."""
    v = vectors[cohort]
    similarity = _cosine(v, v)
    np.fill_diagonal(similarity, np.inf)
    return {cohort[k]: cohort[int(np.argmin(similarity[k]))] for k in range(len(cohort))} if len(cohort) > 1 else {}


class FeatureAlignment(Term):
    """mu * sum_c ||mean of the batch's class-c features - global feature c||^2 (eq. 9), and the running
    per-class feature sums of training (eq. 5), kept in the client's state across the swap."""
    name, keeps_state, batchable = "fa", True, True

    def start(self, model, client, round, received):
        self.target, self.known = received[FEATURES]["anchors"], received[FEATURES]["known"] > 0
        shape, kept = self.target.shape, self.state(client)
        self.sums = kept.get("sums", torch.zeros(shape, dtype=torch.float64, device=self.target.device))
        self.counts = kept.get("counts", torch.zeros(shape[0], dtype=torch.float64, device=self.target.device))

    def loss(self, model, x, y, features, logits):
        onehot = (y[:, None] == torch.arange(self.target.shape[0], device=y.device)).to(features.dtype)
        class_sums, n = onehot.T @ features, onehot.sum(0)
        self.sums += class_sums.detach().double()
        self.counts += n.double()
        if self.params.mu == 0:
            return None
        aligned = (n > 0) & self.known                 # a mask, not a selection: vmap-safe (batched clients)
        means = class_sums / n.clamp(min=1)[:, None]
        return self.params.mu * (((means - self.target) ** 2).sum(1) * aligned).sum()

    def finish(self, model, client):
        self.state(client).update(sums=self.sums, counts=self.counts)


class FedCME(Swapping, FedAvg):
    """FedCME (Nie, Xiao, Yang & Wu): paired clients swap classifiers mid-round; features aligned to the global
    class features."""
    name = "fedcme"
    traits = Traits(batched=True)

    @dataclass(frozen=True)
    class Params:
        mu: float = 0.01                  # the paper's 0.1 or 0.01; 0.01 trained fastest (Table III)
        exchange: str = "classifier"      # classifier | none (FedCME-OL / -OE) | model (WM) | features (FE)
        matching: str = "pairs"           # pairs | many_to_one (FedCME-MTO)
        eval_fraction: float = 0.2        # the share of a client's data its evaluation vector is measured on

        def __post_init__(self):
            if self.exchange not in (*SWAPPED, "none"):
                raise ValueError(f"exchange = {self.exchange!r}; choose one of {[*SWAPPED, 'none']}")
            if self.matching not in ("pairs", "many_to_one"):
                raise ValueError(f"matching = {self.matching!r}; choose 'pairs' or 'many_to_one'")
            if not 0 < self.eval_fraction <= 1:
                raise ValueError(f"eval_fraction = {self.eval_fraction} must be in (0, 1]")

    @classmethod
    def check(cls, job):
        super().check(job)
        matching = matching_terms(job.algorithm.terms)
        if matching:
            raise ConfigError(f"fedcme sends its own global features, not FedFM's anchors: drop {matching} from "
                              "algorithm.terms")
        exchange = params_from(cls.Params, job.algorithm.params, "algorithm.params").exchange
        if "moon" in job.algorithm.terms and exchange != "none":
            raise ConfigError("moon contrasts with the client's model of its previous round, and fedcme trains each "
                              "client in two halves a round (the second would contrast with the first): drop moon "
                              "from algorithm.terms, or set algorithm.params.exchange = 'none'")

    def __init__(self, params, setup):
        super().__init__(params, setup)
        job, k, c = setup.job, setup.num_clients, setup.num_classes
        self.cohorts = cohort_schedule(job.run.seed, job.run.rounds, k, job.train.clients_per_round)
        self.alignment = FeatureAlignment(params)
        self.half = job.train.local_epochs // 2
        down, up = anchor_layouts(c, setup.feature_dim)
        evaluation = Layout(("vectors", "evaluated"), ((k, c), (k,)))
        uplink = {"model": weighted(setup.model_layout), FEATURES: up, EVALUATION: evaluation}
        sent = {EVALUATION: c}                 # a client sends its own row, and is told only its partner
        if params.exchange == "none":
            self.rounds = [Phase("train", downlink={"model": setup.model_layout, FEATURES: down}, uplink=uplink,
                                 per_client=sent)]
        else:
            self.rounds = [Phase("first", downlink={"model": setup.model_layout, FEATURES: down,
                                                    PARTNERS: Layout(("source",), ((k,),))}, per_client={PARTNERS: 1}),
                           SwapPhase("swap", exchange=setup.model_layout.select(SWAPPED[params.exchange])),
                           Phase("second", uplink=uplink, per_client=sent)]

    def plan(self, round):
        return self.rounds

    # -- server ------------------------------------------------------------------------------------
    def init_server_state(self, model):
        k, c = self.setup.num_clients, self.setup.num_classes
        return {**super().init_server_state(model), FEATURES: initial_anchors(c, self.setup.feature_dim),
                EVALUATION: {"vectors": torch.ones(k, c)}}            # never evaluated: no information

    def downlink(self, phase, round, server_state):
        payloads = {"model": self.global_state(server_state), FEATURES: server_state[FEATURES]}
        if PARTNERS in phase.downlink:
            cohort = [int(c) for c in self.cohorts[round]]
            vectors = server_state[EVALUATION]["vectors"].cpu().numpy()
            match = make_matching if self.params.matching == "pairs" else many_to_one
            source = torch.full((self.setup.num_clients,), -1.0)
            for receiver, sender in match(vectors, cohort).items():
                source[receiver] = sender
            payloads[PARTNERS] = {"source": source}
        return payloads

    def aggregate(self, phase, round, server_state, uplink):
        super().aggregate(phase, round, server_state, uplink)
        update_anchors(server_state[FEATURES], uplink[FEATURES])
        evaluated = uplink[EVALUATION]["evaluated"] > 0
        server_state[EVALUATION]["vectors"][evaluated] = uplink[EVALUATION]["vectors"][evaluated].float()

    # -- clients -------------------------------------------------------------------------------------
    def exchange_sources(self, round, received):
        return {r: int(s) for r, s in enumerate(received[PARTNERS]["source"].tolist()) if s >= 0}

    def exchange_out(self, phase, client):
        return {n: client.state["half"][n] for n in phase.exchange.names}

    def exchange_in(self, phase, client, received):
        """Take the partner's half unless either half is not finite (ours): a NaN classifier would poison
        the partner, who keeps its own; the faulty client trains on from its own, and the second half
        flags it (whatever `exchange` swaps)."""
        if finite(received.values()) and finite(client.state["half"].values()):
            assign(client.state["half"], received)

    def client_update(self, phase, round, client, downlink, model, trainer):
        E = self.setup.job.train.local_epochs
        if phase.name == "second":
            load_state(model, client.state["half"])
            epochs = range(self.half, E)
        else:                                   # "half" is set afresh below, or never (exchange = "none")
            client.state.pop("half_loss", None)
            client.term_state.pop(self.alignment.name, None)
            self.start_from(model, client, downlink["model"])
            epochs = range(0, self.half) if phase.name == "first" else range(E)
        metrics = self.train(model, client, round, trainer, downlink, extra=(self.alignment,), epochs=epochs)
        if phase.name == "first":              # hold the half-trained model for the swap
            client.state["half"] = {n: t.detach().clone() for n, t in model.state_dict().items()}
            client.state["half_loss"] = {"sum": torch.tensor([metrics["train_loss"] * metrics["steps"],
                                                              metrics["steps"]])}
            return {}, {}
        if "half_loss" in client.state:         # the round's loss over both halves
            loss_steps, steps = client.state.pop("half_loss")["sum"].tolist()
            total = steps + metrics["steps"]
            metrics = {"train_loss": (loss_steps + metrics["train_loss"] * metrics["steps"]) / max(total, 1),
                       "steps": total}
        sums = client.term_state.pop(self.alignment.name)
        features = uniform_contribution(sums["sums"], sums["counts"], downlink[FEATURES])
        client.state.pop("half", None)
        return {"model": ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples)),
                FEATURES: (features, 1.0), EVALUATION: (self.evaluation(model, client, round), 1.0)}, metrics

    @torch.no_grad()
    def evaluation(self, model, client, round) -> dict:
        """Eq. (4) on a random `eval_fraction` of the client's data, as this client's row."""
        k, c = self.setup.num_clients, self.setup.num_classes
        n = client.num_samples
        size = max(1, int(n * self.params.eval_fraction + 0.5))
        pick = numpy_rng(self.setup.job.run.seed, "cme-eval", round, client.id).permutation(n)[:size]
        idx = torch.from_numpy(np.sort(pick)).to(client.y.device)
        model.eval()
        x, y = client.inputs(idx), client.y[idx]
        batch = self.setup.job.eval.batch_size
        predicted = torch.cat([model(x[s:s + batch]).argmax(1) for s in range(0, len(y), batch)])
        right = torch.bincount(y[predicted == y], minlength=c).double()
        total = torch.bincount(y, minlength=c).double()
        vectors = torch.zeros(k, c, dtype=torch.float64, device=y.device)
        vectors[client.id] = right / total.clamp(min=1)
        evaluated = torch.zeros(k, dtype=torch.float64, device=y.device)
        evaluated[client.id] = 1.0
        return {"vectors": vectors, "evaluated": evaluated}

