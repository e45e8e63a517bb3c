"""The worker's NaN/Inf check of a client's loss and contributions (train.on_nonfinite), and its host reads."""
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


HOST_READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy", "nonzero"}


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts the tensor operations that make a GPU run wait for the device (a value read on the host)."""
    count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in HOST_READS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold", "moon"])
def test_local_training_never_reads_the_device_per_batch(algorithm, tiny_job, tmp_path):
    """Host reads (each drains a GPU's queue) come per client (FedAvg: its loss and the NaN/Inf check;
    state moved to the CPU: one per tensor) and per round, never per batch: 1 and 4 epochs read alike."""
    from hpcfl.jobs import load_job, resolve
    from hpcfl.runtime.build import setup
    from hpcfl.runtime.loop import run
    from hpcfl.transport import LocalTransport

    reads = {}
    for epochs in (1, 4):
        config = load_job(tiny_job(algorithm, rounds=1), [f"train.local_epochs={epochs}", "eval.every=2",
                                                          f"run.results_root='{tmp_path}'", f"run.name='e{epochs}'"])
        job = setup(resolve(config), LocalTransport({}), None)
        with _HostReads() as counter:
            run(job)
        job.recorder.close()
        reads[epochs] = counter.count
    assert reads[1] == reads[4]                       # none per batch: per client, per state tensor, per round
    if algorithm == "fedavg":                         # 4 clients a round, and the round's bookkeeping
        assert reads[1] <= 2 * 4 + 10
