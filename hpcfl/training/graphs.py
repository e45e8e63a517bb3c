"""The steps of clients trained together (hpcfl.training.batched) as CUDA graphs (train.cuda_graphs, on a
GPU): each kind of step (its members and batch length) runs eagerly on a side stream twice (the warm-up
CUDA graphs need), is captured on its third call and replayed from then on with its batch's rows copied
in. Replaying is exact because a step writes every tensor of the group in place and reads the step
number from the device. The graphs share one memory pool (they run one after another, and each writes
its results into the group's tensors). Exercised on a GPU only: bench/gpu.sh compares it with the eager
path; the tests check the protocol with torch.cuda's graph API stood in for.
"""
from collections import defaultdict

import torch


class StepGraphs:
    """A group's step kinds, each warmed up, captured once and replayed (see the module)."""
    WARMUP = 2

    def __init__(self):
        self.calls, self.captured, self.pool, self.side = defaultdict(int), {}, None, torch.cuda.Stream()

    def run(self, kind: tuple, rows: torch.Tensor, update) -> None:
        if kind in self.captured:
            graph, static = self.captured[kind]
            static.copy_(rows)
            graph.replay()
            return
        self.calls[kind] += 1
        if self.calls[kind] <= self.WARMUP:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                update(rows)
            torch.cuda.current_stream().wait_stream(self.side)
            return
        graph, static = torch.cuda.CUDAGraph(), rows.clone()
        with torch.cuda.graph(graph, pool=self.pool):
            update(static)
        self.pool = self.pool or graph.pool()
        self.captured[kind] = graph, static
        graph.replay()
