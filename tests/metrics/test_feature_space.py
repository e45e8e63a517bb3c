"""Feature-space quality (FedFM Table IV) on features placed by hand: two tight classes give NMI 1
and the silhouette computed from the distances by hand; a diverged model gives NaN, not a crash."""
import math

import pytest
import torch

from hpcfl.metrics.feature_space import feature_quality


class _Given(torch.nn.Module):
    """Its features are its inputs (through a dropout that evaluation mode turns off)."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.9)

    def features(self, x):
        return self.drop(x)


X = torch.tensor([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]])
Y = torch.tensor([0, 0, 1, 1])


def test_two_separated_classes_score_nmi_one_and_their_silhouette_by_hand():
    model = _Given().train()
    b = (10 + math.sqrt(101)) / 2                       # mean distance to the other class; 1 to its own
    for batch_size in (1, 1000):
        quality = feature_quality(model, X, Y, num_classes=3, seed=0, batch_size=batch_size)
        assert quality == pytest.approx({"feature_nmi": 1.0, "feature_silhouette": (b - 1) / b})
    assert not model.training


def test_a_sample_of_the_test_set_is_scored_and_one_class_has_no_silhouette():
    quality = feature_quality(_Given(), X, torch.tensor([0, 0, 0, 0]), num_classes=2, seed=0, samples=3)
    assert quality["feature_nmi"] == 1.0 and math.isnan(quality["feature_silhouette"])


def test_a_diverged_model_scores_nan():
    broken = X.clone()
    broken[2, 0] = float("nan")
    quality = feature_quality(_Given(), broken, Y, num_classes=2, seed=0)
    assert all(math.isnan(v) for v in quality.values()) and set(quality) == {"feature_nmi", "feature_silhouette"}


class _Counting(_Given):
    def __init__(self):
        super().__init__()
        self.rows = []

    def features(self, x):
        self.rows.append(len(x))
        return super().features(x)


def test_a_large_test_set_is_scored_on_2000_examples_in_batches_of_1000():
    x = torch.cat([X + torch.tensor([0.0, k / 1000]) for k in range(625)])          # 2500 examples
    model = _Counting()
    feature_quality(model, x, Y.repeat(625), num_classes=2, seed=0)
    assert model.rows == [1000, 1000]
