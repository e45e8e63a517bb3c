"""Local loss terms: small pieces added to a client's task loss, composable by configuration.

A job names them in `[algorithm] terms = ["prox", "moon"]` (parameters in
`[algorithm.terms.<name>]`), and any algorithm trains with them, so FedProx is FedAvg plus
`prox` and FedFM's feature matching can be added to MOON or FedNova by configuration.

A term sees what the client received this round (`start`: the reference model under "model", and
payloads such as FedFM's global anchors under "anchors"), may add layers to the model when it is
built (`adapt`, on every rank: MOON's projection head), may rescale the logits
before the task loss (`logits`), adds to the loss each batch (`loss`), and may keep per-client state
that lives with the client on its worker, off the GPU between rounds (`finish`, keys `<name>.*`).

The terms, by family: hpcfl.terms.weights (`prox`), .contrastive (`moon`, `supcon`),
.logits (`fedrs`, `ntd`, `ka`), .matching (`fm_cg`, `fm_l2`); each module cites its papers.
"""
import dataclasses
from collections.abc import Mapping

from torch import nn

from hpcfl.params import params_from
from hpcfl.plugins import Registry, subclass_of
from hpcfl.terms.base import Frozen, Tensors, Term
from hpcfl.terms.contrastive import Moon, ProjectedClassifier, SupCon
from hpcfl.terms.logits import KnowledgeAnchor, NotTrueDistillation, RestrictedSoftmax
from hpcfl.terms.matching import ContrastiveGuiding, FeatureMatching, L2Matching
from hpcfl.terms.weights import Linear, Prox

__all__ = ["Frozen", "Term", "Tensors", "Moon", "ProjectedClassifier", "SupCon", "KnowledgeAnchor",
           "NotTrueDistillation", "RestrictedSoftmax", "ContrastiveGuiding", "FeatureMatching",
           "L2Matching", "Linear", "Prox", "TERMS", "term_params", "build_terms", "adapt_model", "matching_terms"]


def check_term(found) -> str | None:
    """What is wrong with `found` as a loss term: not a Term subclass with a name, or a term that asks for
    the anchor phase without the settings that phase reads from it."""
    problem = subclass_of(Term, "a loss term")(found)
    if problem is None and found.needs_anchors:
        lacking = sorted({"start_round", "anchor_weighting"} - {f.name for f in dataclasses.fields(found.Params)})
        if lacking:
            return (f"{found.__qualname__} sets needs_anchors but its Params has no {' or '.join(lacking)}, which "
                    "the anchor phase reads: subclass hpcfl.terms.FeatureMatching (its Params has both)")
    return problem


# the names in algorithm.terms: these, or a plug-in's "package.module:Class" (hpcfl.plugins)
TERMS = Registry("algorithm.terms", check_term, {
    cls.name: cls for cls in (Prox, Moon, RestrictedSoftmax, NotTrueDistillation, ContrastiveGuiding, L2Matching,
                              SupCon, KnowledgeAnchor)})


def matching_terms(names) -> list[str]:
    """The feature-matching terms (those that need FedFM's anchors, `needs_anchors`) among `names`, a job's
    algorithm.terms: Algorithm.check allows one at most, and algorithms without the anchor phase none."""
    return [name for name in names if TERMS[name].needs_anchors]


def term_params(name: str, raw: Mapping) -> Term.Params:
    """The named term's Params from its config table, naming bad keys."""
    return params_from(TERMS.resolve(name, "algorithm.terms").Params, raw,
                       f"algorithm.terms.{name}")


def build_terms(params: Mapping[str, Term.Params], seed: int) -> list[Term]:
    """The job's terms from their resolved Params ({name: Params}: hpcfl.jobs.resolve's `terms`), each
    seeded with the run's seed (for the terms that draw per round and client)."""
    terms = [TERMS[name](p) for name, p in params.items()]
    for term in terms:
        term.seed = seed
    return terms


def adapt_model(model: nn.Module, terms: Mapping[str, Term.Params], seed: int) -> nn.Module:
    """`model` with what the named terms ({name: its Params}, hpcfl.jobs.resolve's `adapting`) add to
    it at build time (MOON's projection head), the same on every rank."""
    for name, params in terms.items():
        TERMS[name].adapt(model, params, seed)
    return model
