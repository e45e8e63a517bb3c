"""A model's accuracy, loss and per-class accuracy on a set, batch by batch: what the server reports
of the global model and a worker of each trained local model."""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, batch_size: int) -> dict:
    """Accuracy, mean cross-entropy and per-class accuracy of `model` on (x, y)."""
    model.eval()
    predicted, loss = torch.empty_like(y), torch.zeros((), device=y.device)
    for start in range(0, y.shape[0], batch_size):
        out = model(x[start:start + batch_size])
        loss += F.cross_entropy(out, y[start:start + batch_size], reduction="sum")
        predicted[start:start + batch_size] = out.argmax(1)
    return summarize(predicted, y, loss, num_classes)


@torch.no_grad()
def predict_proba(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Softmax outputs of `model` on x, batch by batch."""
    model.eval()
    return torch.cat([F.softmax(model(x[s:s + batch_size]), dim=1) for s in range(0, x.shape[0], batch_size)])


def summarize(predicted: torch.Tensor, y: torch.Tensor, loss_sum: torch.Tensor, num_classes: int) -> dict:
    """The evaluation record from predicted labels and the summed loss; `correct` is each example's
    correctness (what lets an analysis account for the test set's finite size); a class without test
    examples has no accuracy (NaN). Two host reads."""
    hits, labels = torch.stack([predicted == y, y]).cpu().numpy()        # one read of labels and hits
    hits = hits.astype(bool)
    per_class = np.bincount(labels, minlength=num_classes)
    correct = np.bincount(labels[hits], minlength=num_classes)
    return {"acc": float(correct.sum()) / len(labels), "loss": float(loss_sum) / len(labels),
            "class_acc": np.divide(correct, per_class, out=np.full(num_classes, np.nan), where=per_class > 0),
            "correct": hits}
