"""A model's evaluation record, hand-computed: accuracy, mean cross-entropy, per-class accuracy and
each example's correctness, batch by batch (a last batch shorter than the others); softmax outputs."""
import math

import numpy as np
import torch

from hpcfl.models import build_model
from hpcfl.models.evaluation import evaluate, predict_proba


def _model():
    """Logits (x0, x1, 0) for 2 features and 3 classes, with a dropout that only evaluation mode turns off."""
    linear = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    return torch.nn.Sequential(torch.nn.Dropout(0.9), linear).train()


X = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0], [-1.0, -1.0], [0.0, 2.0]])
def test_the_evaluation_record_by_hand():
    """Five examples in batches of two (the last one short); of 4 classes, class 0 has two examples, one
    right; class 2 has one, right; class 3 has no example (no accuracy: NaN, not a division by zero)."""
    y = torch.tensor([0, 1, 0, 2, 1])      # predicted 0, 1, 1, 2, 1
    result = evaluate(_model(), X, y, num_classes=4, batch_size=2)
    logits = [(2, 0, 0), (0, 1, 0), (1, 3, 0), (-1, -1, 0), (0, 2, 0)]
    loss = np.mean([math.log(sum(math.exp(v) for v in row)) - row[label]
                    for row, label in zip(logits, y.tolist(), strict=True)])
    assert result["acc"] == 4 / 5 and math.isclose(result["loss"], loss, rel_tol=1e-6)
    np.testing.assert_array_equal(result["class_acc"], [0.5, 1.0, 1.0, np.nan])
    np.testing.assert_array_equal(result["correct"], [True, True, False, True, True])
    assert result["correct"].dtype == bool
    for batch in (1, 3, 5, 64):                                       # any batching, the same record
        again = evaluate(_model(), X, y, num_classes=4, batch_size=batch)
        assert again["acc"] == result["acc"] and math.isclose(again["loss"], loss, rel_tol=1e-6)


def test_softmax_outputs_come_batch_by_batch_in_evaluation_mode():
    model = _model()
    probabilities = predict_proba(model, X, batch_size=2)
    assert not model.training
    torch.testing.assert_close(probabilities, torch.softmax(model(X), dim=1))
    assert probabilities.shape == (5, 3)


def test_the_narrow_and_wide_cnns_are_half_and_twice_the_default_width():
    widths = {name: build_model(name, (1, 28, 28), 10).conv[0].out_channels
              for name in ("fmnist_cnn_narrow", "fmnist_cnn", "fmnist_cnn_wide")}
    assert widths == {"fmnist_cnn_narrow": 8, "fmnist_cnn": 16, "fmnist_cnn_wide": 32}
