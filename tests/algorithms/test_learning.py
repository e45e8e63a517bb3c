"""Every algorithm, run through the launcher in this process on real data (scikit-learn digits,
Dir(0.5) over 6 clients), learns; and a preset equals FedAvg with its term named as a regularizer."""
import numpy as np
import pytest

from hpcfl.algorithms import ALGORITHMS
from hpcfl.launch import main
from hpcfl.metrics import read_run


def _run(job, root, *overrides):
    name = "run"
    assert main([str(job), "--results-root", str(root), "--set", f"run.name={name!r}", "--set", "data.local_test_ratio=0.3",
                 *(arg for o in overrides for arg in ("--set", o))]) == 0
    return read_run(root / "test" / f"{name}.h5").arrays


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_learns_on_real_data(algorithm, tiny_job, tmp_path):
    everyone = ["train.clients_per_round=6"] if algorithm == "ensemble" else []
    arrays = _run(tiny_job(algorithm, rounds=8), tmp_path, "train.local_epochs=2", *everyone)
    personal = arrays["round/personal_acc_mean"]
    assert personal[-1] > 0.7, personal              # 10 classes: chance is 0.1
    if algorithm == "local_only":
        assert "round/test_acc" not in arrays        # no global model to test
    else:
        assert arrays["round/test_acc"][-1] > 0.75, arrays["round/test_acc"]


@pytest.mark.parametrize("preset, term, params", [("fedprox", "prox", "mu = 0.5"),
                                                  ("moon", "moon", "mu = 2.0"),
                                                  ("fedrs", "fedrs", "alpha = 0.3"),
                                                  ("fedntd", "ntd", "beta = 0.7")])
def test_a_preset_is_fedavg_plus_its_regularizer(preset, term, params, tiny_job, tmp_path):
    named = _run(tiny_job(preset, rounds=2, extra=f"[algorithm.params]\n{params}\n"), tmp_path / "preset")
    composed = _run(tiny_job("fedavg", rounds=2, extra=f"[algorithm.regularizers.{term}]\n{params}\n"),
                    tmp_path / "composed")
    plain = _run(tiny_job("fedavg", rounds=2), tmp_path / "plain")
    np.testing.assert_array_equal(named["round/test_acc"], composed["round/test_acc"])
    np.testing.assert_array_equal(named["client/train_loss"], composed["client/train_loss"])
    assert not np.array_equal(named["client/train_loss"], plain["client/train_loss"])   # the term acts


def test_regularizers_compose(tiny_job, tmp_path):
    both = _run(tiny_job("scaffold", rounds=2, extra='regularizers = ["prox", "moon"]\n'), tmp_path / "both")
    alone = _run(tiny_job("scaffold", rounds=2), tmp_path / "alone")
    assert not np.array_equal(both["client/train_loss"], alone["client/train_loss"])
    assert both["round/test_acc"][-1] > 0.2
