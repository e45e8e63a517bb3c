"""Helpers for testing a plug-in the way hpcfl tests its built-ins (docs/how-to/write-your-own-algorithm.md).

- Hand-computed values: give `client_update` a `StepTrainer`, whose local training moves every
  parameter by a known amount, and an algorithm built on `Setup.of(job, model, class_counts)`.
- Against a reference: run two jobs with `hpcfl.run` and compare `run_metrics` of their result files
  with `assert_same_metrics(..., exact=True)`.
- One process against N ranks: the same, to float tolerance (`exact=False`).

They live in the package, not in hpcfl's tests, so that an installed hpcfl offers them.
"""
import numpy as np
import torch

# Arrays that differ from run to run of the same job (timings, and where clients trained): what
# neither the topology nor an interruption may change is everything else.
TIMINGS = ("rank/", "round/time_s", "round/phase_s/", "round/eval_s", "round/match_s/", "round/imbalance_s")


def run_metrics(path) -> dict[str, np.ndarray]:
    """A result file's arrays but its timings and where clients trained (`client/rank`)."""
    from hpcfl.metrics import read_run

    return {k: v for k, v in read_run(path).arrays.items() if not k.startswith(TIMINGS) and k != "client/rank"}


def assert_same_metrics(one: dict, other: dict, exact: bool = False) -> None:
    """Same keys and values: bit for bit (`exact`: a resumed run, an algorithm against the one it reduces
    to) or to float tolerance (other ranks, which sum the clients' contributions in another order)."""
    assert sorted(one) == sorted(other), f"different arrays: {sorted(set(one) ^ set(other))}"
    for key in one:
        if exact:
            np.testing.assert_array_equal(one[key], other[key], err_msg=key)
        else:
            np.testing.assert_allclose(one[key], other[key], rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=key)


class StepTrainer:
    """Stands in for the local trainer an algorithm's `train` calls: sets every parameter to `target`
    (or adds `shift`) and reports `steps` local steps, so the client's update is known exactly; keeps
    the loss terms it was given (`terms`)."""

    def __init__(self, target: float | None = None, shift: float = 0.0, steps: int = 2):
        self.target, self.shift, self.steps, self.terms = target, shift, steps, None

    def train(self, model, client, round, terms=(), epochs=None) -> dict[str, float]:
        self.terms = list(terms)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.full_like(p, self.target)) if self.target is not None else p.add_(self.shift)
        return {"train_loss": 0.5, "steps": float(self.steps)}
