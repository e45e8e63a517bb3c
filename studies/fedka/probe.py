"""Where FedKA goes unstable: one point of sweep.toml re-run with every local step of the knowledge-anchor
term measured from a given round on (a diagnostic, not part of the sweep).

Per client and step it records the task loss (cross-entropy) and the KA term, the norms of their
gradients with respect to the parameters, the largest logit on the anchor T and on the batch, and
lr x the KA term's curvature in the classifier's weights: the term is beta / (|T| |K|) * sum over T
and the kept classes K of (w_k . h + b_k - target)^2, whose Hessian in (w_k, b_k) is
2 beta / (|T| |K|) * [h 1]^T [h 1], so its largest eigenvalue is 2 beta / (|T| |K|) * sigma_max([h 1])^2.
It prints a line per (round, client) and writes every step to /tmp/fedka-probe-ARM-SEED.json.

    python studies/fedka/probe.py KA-5 2 --from-round 5 --rounds 10 [--set run.memory_format='contiguous']
"""
import argparse
import collections
import json
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import hpcfl
from hpcfl.config import read_job_file
from hpcfl.errors import TrainingFault
from hpcfl.jobs import load_job
from hpcfl.sweep import points
from hpcfl.terms.logits import KnowledgeAnchor

SWEEP = "studies/fedka/sweep.toml"


def norm(grads) -> float:
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))


def instrument(rows: list, from_round: int, lr: float) -> None:
    """Wrap KnowledgeAnchor.start and .loss so that every step from `from_round` on appends a row."""
    start, loss, where = KnowledgeAnchor.start, KnowledgeAnchor.loss, {}

    def measured_start(self, model, client, round, received):
        where.update(round=round, client=client.id, step=0)
        return start(self, model, client, round, received)

    def measured_loss(self, model, x, y, features, logits):
        term = loss(self, model, x, y, features, logits)
        if term is not None and where["round"] >= from_round:
            params = [p for p in model.parameters() if p.requires_grad]
            task = F.cross_entropy(logits, y)
            g_task = torch.autograd.grad(task, params, retain_graph=True)
            g_term = torch.autograd.grad(term, params, retain_graph=True)
            with torch.no_grad():
                model.eval()
                h = model.features(self.x)
                local = model.classifier(h)[:, self.kept]
                model.train()
                h1 = torch.cat([h, torch.ones(len(h), 1, device=h.device)], 1).double()
                curvature = (2 * self.params.weight / (len(self.x) * int(self.kept.sum()))
                             * float(torch.linalg.matrix_norm(h1, 2) ** 2))
            rows.append({"round": where["round"], "client": where["client"], "step": where["step"],
                         "task": float(task), "term": float(term), "grad_task": norm(g_task),
                         "grad_term": norm(g_term), "lr_curvature": lr * curvature,
                         "target_max": float(self.target.abs().max()), "anchor_logit_max": float(local.abs().max()),
                         "batch_logit_max": float(logits.detach().abs().max()), "anchor_size": len(self.x)})
        where["step"] += 1
        return term

    KnowledgeAnchor.start, KnowledgeAnchor.loss = measured_start, measured_loss


def summary(rows: list) -> None:
    by = collections.defaultdict(list)
    for row in rows:
        by[(row["round"], row["client"])].append(row)
    for (round, client), steps in sorted(by.items()):
        finite = [r["lr_curvature"] for r in steps if np.isfinite(r["lr_curvature"])]
        print(f"round {round + 1:3d} client {client}: steps {len(steps):3d}  |T| {steps[0]['anchor_size']}  "
              f"term max {max(r['term'] for r in steps):9.3g}  "
              f"grad term/task (median) {np.median([r['grad_term'] / r['grad_task'] for r in steps]):6.2f}  "
              f"lr*curvature first {finite[0]:5.2f} max {max(finite):9.3g}  "
              f"target logit max {steps[0]['target_max']:5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arm")
    parser.add_argument("seed", type=int)
    parser.add_argument("--from-round", type=int, default=1, help="first round measured (1-based)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    point = next(p for p in points(read_job_file(SWEEP))
                 if f"run.seed={args.seed}" in p and f'run.arm="{args.arm}"' in p)
    overrides = [o for o in point if not o.startswith(("run.rounds=", "run.name="))] + [
        f"run.rounds={args.rounds}", f"run.results_root='{tempfile.mkdtemp()}'", "run.name='probe'",
        "train.on_nonfinite='stop'", *args.set]
    config = load_job(SWEEP, overrides, allow_sweep=True)
    rows = []
    instrument(rows, args.from_round - 1, config.train.lr)
    try:
        hpcfl.run(config)
    except TrainingFault as err:                # a diverged client stops the run: the rows are what we want
        print(f"the run stopped: {err}")
    finally:
        with open(f"/tmp/fedka-probe-{args.arm}-{args.seed}.json", "w") as out:
            json.dump(rows, out)
        summary(rows)


if __name__ == "__main__":
    main()
