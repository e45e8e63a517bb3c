"""hpcfl.testing, the helpers a plug-in's tests use: a metrics comparison that ignores only timings and
placement, and fails naming the array that differs."""
import numpy as np
import pytest
import torch

from hpcfl.testing import StepTrainer, assert_same_metrics, run_metrics


def test_run_metrics_leave_out_timings_and_placement_only(tiny_job, tmp_path):
    import hpcfl

    metrics = run_metrics(hpcfl.run(tiny_job(rounds=1), [f"run.results_root='{tmp_path}'"], quiet=True))
    assert "round/test_acc" in metrics and "client/train_loss" in metrics
    assert not [k for k in metrics if k.startswith(("rank/", "round/time_s", "round/phase_s/")) or k == "client/rank"]


def test_same_metrics_fail_naming_the_array_or_the_missing_key():
    one = {"round/test_acc": np.array([0.5, 0.6])}
    assert_same_metrics(one, {"round/test_acc": np.array([0.5, 0.6 + 1e-9])})
    with pytest.raises(AssertionError, match="round/test_acc"):
        assert_same_metrics(one, {"round/test_acc": np.array([0.5, 0.6 + 1e-9])}, exact=True)
    with pytest.raises(AssertionError, match="round/val_acc"):
        assert_same_metrics(one, {**one, "round/val_acc": np.array([0.1, 0.2])})


def test_the_step_trainer_moves_every_parameter_by_a_known_amount():
    model = torch.nn.Linear(2, 1)
    before = model.bias.item()
    trainer = StepTrainer(shift=1.0, steps=3)
    assert trainer.train(model, None, 0, terms=["t"]) == {"train_loss": 0.5, "steps": 3.0}
    assert model.bias.item() == pytest.approx(before + 1.0) and trainer.terms == ["t"]
    StepTrainer(target=2.0).train(model, None, 0)
    assert all((p == 2.0).all() for p in model.parameters())
