"""Every algorithm, run through the launcher in this process on real data (scikit-learn digits,
Dir(0.5) over 6 clients), learns; and a preset equals FedAvg with its term named as a term."""
import numpy as np
import pytest

from hpcfl.algorithms import ALGORITHMS
from hpcfl.launch import main
from hpcfl.metrics import read_run


def _run(job, root, *overrides):
    name = "run"
    assert main([str(job), "--results-root", str(root), "--set", f"run.name={name!r}",
                 "--set", "data.local_test_ratio=0.3", *(arg for o in overrides for arg in ("--set", o))]) == 0
    return read_run(root / "test" / f"{name}.h5").arrays


# short runs: feature matching from round 3 (not 20), with a weight that suits lr 0.1
FEATURE_MATCHING = ["algorithm.params.start_round=3", "algorithm.params.weight=1.0"]
EVERYONE = ["train.clients_per_round=6"]
OVERRIDES = {"ensemble": EVERYONE, "fedma": EVERYONE, "fedfm": FEATURE_MATCHING,
             # eta = 1 - beta warms up over ~1/(1 - beta) rounds
             "fedavgm": ["algorithm.params.server_momentum=0.7"],
             "fedfm_lite": [*FEATURE_MATCHING, "algorithm.params.model_every=2", *EVERYONE]}
ADAM = ['train.optimizer="adam"', "train.lr=0.003"]
# MOON's global model swings from round to round on this job: its last round reads 0.77 with contiguous
# convolution weights and 0.75 with channels_last (rounding-level differences, grown), seed 1 0.15 in both
TEST_BAR = {"moon": 0.7}
MOMENTUM = ["train.momentum=0.9", "train.lr=0.02", "train.weight_decay=0.0005"]     # steps of about lr / (1 - 0.9)


def _learns(algorithm, arrays, personal_bar, test_bar):
    personal = arrays["round/personal_acc_mean"]
    assert personal[-1] > personal_bar, personal      # 10 classes: chance is 0.1
    if algorithm in ("local_only", "fedclassavg", "fedproto"):
        assert "round/test_acc" not in arrays        # no global model to test
    else:
        assert arrays["round/test_acc"][-1] > test_bar, arrays["round/test_acc"]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_learns_on_real_data(algorithm, tiny_job, tmp_path):
    optimizer = ADAM if algorithm == "fedclassavg" else []      # Adam, as the paper (Table 1)
    arrays = _run(tiny_job(algorithm, rounds=8), tmp_path, "train.local_epochs=2", *OVERRIDES.get(algorithm, []),
                  *optimizer)
    _learns(algorithm, arrays, 0.7, TEST_BAR.get(algorithm, 0.75))


@pytest.mark.parametrize("algorithm, optimizer", [*((a, MOMENTUM) for a in sorted(ALGORITHMS)), ("feddyn", ADAM)],
                         ids=[*(f"{a}-momentum" for a in sorted(ALGORITHMS)), "feddyn-adam"])
def test_learns_with_momentum_and_weight_decay_or_adam(algorithm, optimizer, tiny_job, tmp_path):
    """Issue 27: the realistic local optimisers. SCAFFOLD with option II's K * lr went to NaN here."""
    arrays = _run(tiny_job(algorithm, rounds=6), tmp_path, "train.local_epochs=2", *OVERRIDES.get(algorithm, []),
                  *optimizer)
    _learns(algorithm, arrays, 0.6, 0.4)


def test_scaffold_with_momentum_and_long_local_training_learns(tiny_job, tmp_path):
    """Issue 21's case: 5 local epochs with momentum 0.9 were at chance by round 4 and NaN by round 5
    before the control variates counted momentum's steps (a_i); now it learns."""
    arrays = _run(tiny_job("scaffold", rounds=4), tmp_path, "train.local_epochs=5", "train.momentum=0.9",
                  "train.lr=0.005", "train.weight_decay=0.0005")
    assert np.isfinite(arrays["round/train_loss"]).all() and not np.nansum(arrays["client/nonfinite"])
    assert arrays["round/test_acc"][-1] > 0.85, arrays["round/test_acc"]


@pytest.mark.parametrize("preset, term, params", [("fedprox", "prox", "mu = 0.5"),
                                                  ("fedfm", "fm_cg", "start_round = 1"),
                                                  ("moon", "moon", "mu = 2.0"),
                                                  ("fedrs", "fedrs", "alpha = 0.3"),
                                                  ("fedntd", "ntd", "beta = 0.7")])
def test_a_preset_is_fedavg_plus_its_term(preset, term, params, tiny_job, tmp_path):
    named = _run(tiny_job(preset, rounds=2, extra=f"[algorithm.params]\n{params}\n"), tmp_path / "preset")
    composed = _run(tiny_job("fedavg", rounds=2, extra=f"[algorithm.terms.{term}]\n{params}\n"),
                    tmp_path / "composed")
    plain = _run(tiny_job("fedavg", rounds=2), tmp_path / "plain")
    np.testing.assert_array_equal(named["round/test_acc"], composed["round/test_acc"])
    np.testing.assert_array_equal(named["client/train_loss"], composed["client/train_loss"])
    assert not np.array_equal(named["client/train_loss"], plain["client/train_loss"])   # the term acts


def test_feature_matching_composes_and_records_the_feature_space(tiny_job, tmp_path):
    arrays = _run(tiny_job("fednova", rounds=3, extra='terms = { fm_l2 = { start_round = 1 }, moon = {} }\n'
                                                         '[eval]\nfeature_quality = true\n'),
                  tmp_path)
    assert np.isnan(arrays["round/bytes_up/anchors"][0]) and arrays["round/bytes_up/anchors"][1] > 0
    assert 0.0 <= float(arrays["final/feature_nmi"]) <= 1.0
    assert -1.0 <= float(arrays["final/feature_silhouette"]) <= 1.0


def test_fedfm_lite_saves_model_bytes(tiny_job, tmp_path):
    every = {a: _run(tiny_job("fedfm_lite", rounds=4), tmp_path / str(a), "algorithm.params.start_round=1",
                     f"algorithm.params.model_every={a}", "algorithm.params.weight=1.0", *EVERYONE)
             for a in (1, 2)}
    sent = {a: np.nansum(r["round/bytes_down/model"]) + np.nansum(r["round/bytes_up/model"]) for a, r in every.items()}
    assert sent[2] == sent[1] / 2
    np.testing.assert_array_equal(every[1]["round/bytes_up/anchors"], every[2]["round/bytes_up/anchors"])


def test_terms_compose(tiny_job, tmp_path):
    # MOON's head (3 more default-initialised layers) starts slower than 2 rounds
    both = _run(tiny_job("scaffold", rounds=2, extra='terms = { prox = {}, moon = { projection = 0 } }\n'),
                tmp_path / "both")
    alone = _run(tiny_job("scaffold", rounds=2), tmp_path / "alone")
    assert not np.array_equal(both["client/train_loss"], alone["client/train_loss"])
    assert both["round/test_acc"][-1] > 0.2


def test_feature_quality_of_a_diverged_model_is_nan_not_a_crash():
    import torch

    from hpcfl.metrics.feature_space import feature_quality
    from hpcfl.models import build_model

    model = build_model("fmnist_cnn", (1, 8, 8), 10)
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))
        model.fc[0].weight.fill_(float("nan"))
    quality = feature_quality(model, torch.zeros(20, 1, 8, 8), torch.arange(20) % 10, 10, seed=0)
    assert np.isnan(quality["feature_nmi"]) and np.isnan(quality["feature_silhouette"])


def test_feature_quality_of_a_test_sample_smaller_than_the_class_count_clusters_the_classes_present():
    import torch

    from hpcfl.metrics.feature_space import feature_quality
    from hpcfl.models import build_model

    torch.manual_seed(0)
    x = torch.randn(6, 1, 8, 8)
    quality = feature_quality(build_model("fmnist_cnn", (1, 8, 8), 80), x, torch.tensor([0, 0, 1, 1, 2, 2]), 80, seed=0)
    assert 0.0 <= quality["feature_nmi"] <= 1.0
