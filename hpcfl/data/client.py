"""A client as its worker holds it: its training data (on the worker's device), its held-out sets
and its persistent state. A data record, below everything that uses it: local training and the loss
terms read its data, the algorithms (hpcfl.algorithms.base, which re-exports it) keep their state in
it, and the runtime (hpcfl.runtime.build) makes one per client.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]
State = dict[str, Tensors]         # owner -> its tensors by name


@dataclass
class Client:
    """One client as its worker sees it: its data (on the worker's device) and persistent state."""

    id: int
    x: torch.Tensor            # its inputs as stored: uint8 pixels when `normalization` is set; read inputs()
    y: torch.Tensor
    class_counts: np.ndarray
    architecture: str = ""                              # its model (model.architectures), on heterogeneous runs
    state: State = field(default_factory=dict)          # the algorithm's, by owner ("bn": model.batchnorm = "local")
    term_state: State = field(default_factory=dict)     # each loss term's own, under its name (Term.state)
    eval_sets: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)   # "val", "local_test"
    test_set: tuple[torch.Tensor, torch.Tensor] | None = None     # the global test set, if the algorithm asks
    shared: tuple[torch.Tensor, torch.Tensor] | None = None       # FedKA's shared set S, one sample per class
    normalization: tuple[torch.Tensor, torch.Tensor] | None = None   # (scale, shift) when x holds uint8 pixels

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def inputs(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """The samples `index` (all when None) as the model takes them. On the CPU the runner gives a
        client an image set's uint8 pixels (a quarter of the memory, and set-up makes no float copy)
        with their `normalization`, and each batch is normalised as it is taken, to the same floats."""
        x = self.x if index is None else self.x.index_select(0, index)
        if self.normalization is None:
            return x
        scale, shift = self.normalization
        return x.to(torch.float32, copy=True).mul_(scale).sub_(shift)    # never x itself, in place

    def kept(self) -> dict[str, State]:
        """Everything the client keeps from round to round: the algorithm's state under "algorithm",
        the loss terms' under "terms", each by owner (empty owners left out). The worker holds it on
        the CPU between rounds."""
        return {part: {owner: tensors for owner, tensors in state.items() if tensors}
                for part, state in (("algorithm", self.state), ("terms", self.term_state))}

    def keep(self, kept: dict[str, State]) -> None:
        """Take back what `kept()` returned (moved, restored from a checkpoint)."""
        self.state = {owner: dict(tensors) for owner, tensors in kept["algorithm"].items()}
        self.term_state = {owner: dict(tensors) for owner, tensors in kept["terms"].items()}
