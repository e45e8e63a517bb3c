"""FedFM's global anchors: class means of features, aggregated by one sum-reduction.

Ye et al., "FedFM: Anchor-based Feature Matching for Data Heterogeneity in Federated Learning",
section IV-B. A client's local anchor of class c is the mean of features(x) over its samples of c
under the model it holds (eq. 8). The server's anchor is
- `samples` (eq. 9): the count-weighted mean of local anchors, i.e. the sum of every sampled
  client's per-class feature sums over the sum of their per-class counts; or
- `uniform` (Table VI): the plain mean of local anchors, a client's missing classes filled with the
  current global anchor (when there is one yet).
Either way a client sends per-class `sums` and `counts`, so the aggregation is one reduce of one
flat buffer whatever the number of clients. A class whose count sums to 0 (no sampled client holds
it) keeps its previous anchor: never 0/0.
"""
import torch
from torch import nn

from hpcfl.payload import Layout

ANCHORS = "anchors"


def anchor_layouts(num_classes: int, dim: int) -> tuple[Layout, Layout]:
    """(downlink: the global anchors and which are known, uplink: per-class feature sums and counts)."""
    return (Layout(("anchors", "known"), ((num_classes, dim), (num_classes,))),
            Layout(("sums", "counts"), ((num_classes, dim), (num_classes,))))


def initial_anchors(num_classes: int, dim: int) -> dict[str, torch.Tensor]:
    return {"anchors": torch.zeros(num_classes, dim), "known": torch.zeros(num_classes)}


@torch.no_grad()
def local_anchors(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, shape: tuple[int, int],
                  weighting: str, current: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """This client's contribution, of `shape` (classes, feature width): per-class feature sums and counts
    (`samples`), or per-class means with count 1 (`uniform`, the `current` global anchor standing in for
    a class the client lacks: only this weighting needs the anchors before it sends)."""
    model.eval()
    sums = torch.zeros(shape, dtype=torch.float64, device=x.device)
    for start in range(0, y.shape[0], batch_size):
        sums.index_add_(0, y[start:start + batch_size], model.features(x[start:start + batch_size]).double())
    counts = torch.bincount(y, minlength=shape[0]).double()
    return {"sums": sums, "counts": counts} if weighting == "samples" else uniform_contribution(sums, counts, current)


def uniform_contribution(sums: torch.Tensor, counts: torch.Tensor, current: dict[str, torch.Tensor]) -> dict:
    """A client's per-class means with count 1, the current global anchor standing in for a class it
    lacks (once there is one): summed over clients and divided, the plain mean of local anchors."""
    held = counts > 0
    means = torch.where(held[:, None], sums / counts.clamp(min=1)[:, None], current["anchors"].to(sums.dtype))
    used = held | (current["known"] > 0)
    return {"sums": means * used[:, None], "counts": used.to(sums.dtype)}


def update_anchors(current: dict[str, torch.Tensor], reduced: dict[str, torch.Tensor]) -> None:
    """Global anchors from the reduced sums and counts; classes nobody sent keep theirs."""
    counts = reduced["counts"]
    seen = counts > 0
    current["anchors"][seen] = (reduced["sums"][seen] / counts[seen, None]).to(current["anchors"].dtype)
    current["known"][seen] = 1.0


def with_anchors(server_state: dict[str, dict], num_classes: int, dim: int) -> dict[str, dict]:
    """`server_state` plus fresh global anchors (none known yet), owned by ANCHORS."""
    return {**server_state, ANCHORS: initial_anchors(num_classes, dim)}
