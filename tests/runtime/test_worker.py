"""The worker's NaN/Inf check of a client's loss and contributions (train.on_nonfinite)."""
import pytest
import torch

from hpcfl.runtime.worker import _finite

BIG = torch.finfo(torch.float32).max


def contribution(value, dtype=torch.float32, weight=1.0):
    tensor = torch.zeros(1000, dtype=dtype)
    tensor[517] = value
    return {"model": ({"w": tensor, "steps": torch.tensor(3, dtype=torch.int64)}, weight)}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_any_nonfinite_element_is_caught(value):
    assert not _finite(contribution(value), {"train_loss": 1.0})
    assert not _finite(contribution(value, torch.float16), {})
    assert not _finite(contribution(0.0, weight=value), {"train_loss": 1.0})
    assert not _finite(contribution(0.0), {"train_loss": value})


def test_finite_extremes_pass_and_opposite_infinities_are_still_caught():
    huge = torch.full((4096,), BIG)                        # a float32 sum of these would overflow; float64 does not
    assert _finite({"model": ({"w": huge, "v": -huge}, 1e30)}, {"train_loss": 1e30})
    assert _finite(contribution(-BIG), {})
    both = torch.tensor([float("inf"), -float("inf")])    # their sum is NaN, not a finite number
    assert not _finite({"model": ({"w": both}, 1.0)}, {})
    assert _finite({}, {})                                 # a phase that contributes nothing
