"""CPU clients hold an image set's uint8 pixels and normalise each batch as they take it
(`Client.inputs`): every algorithm and term that reads a client's inputs must train exactly as on
float32 rows. Each algorithm runs two rounds (state carried across them) both ways, and the result
files must agree to the bit."""
import dataclasses

import numpy as np
import pytest
import torch

import hpcfl.data.splits as splits
import hpcfl.runtime.build as build
from hpcfl.data.datasets import load_dataset
from hpcfl.jobs import job_from_dict, resolve
from hpcfl.metrics import read_run
from hpcfl.runtime.loop import run
from hpcfl.transport import LocalTransport

CASES = {                          # every reader of client inputs: trainer, anchors, FedCME, FedKA, two views
    "fedavg": {}, "batched": {"train": {"batched_clients": 2}}, "fedproto": {"data": {"local_test_ratio": 0.3}},
    "fedfm": {"algorithm": {"params": {"start_round": 1}}},
    "fedfm_lite": {"algorithm": {"params": {"start_round": 1}}},
    "fedcme": {}, "fedka": {}, "fedclassavg": {"data": {"local_test_ratio": 0.3}},
}


def _run(tmp_path, case: str, pixels: bool, monkeypatch):
    raw = {"run": {"study": "px", "name": f"{case}-{pixels}", "rounds": 2, "results_root": str(tmp_path)},
           "data": {"dataset": "fashion_mnist", "num_clients": 4, "train_samples": 320},
           "train": {"clients_per_round": 4, "batch_size": 32, "lr": 0.05, "momentum": 0.9},
           "algorithm": {"name": "fedavg" if case == "batched" else case}}
    for key, table in CASES[case].items():
        raw[key] = {**raw.get(key, {}), **table}
    loaded = []

    def load(*args, **kwargs):
        data = load_dataset(*args, **kwargs)
        loaded.append(data if pixels else dataclasses.replace(data, train_pixels=None))   # float32 rows
        return loaded[-1]

    monkeypatch.setattr(splits, "load_dataset", load)
    config = job_from_dict(raw)
    job = build.setup(resolve(config), LocalTransport({}), None)
    clients = list(job.worker.clients.values())
    assert all((c.x.dtype == torch.uint8) == pixels for c in clients)
    run(job)
    job.recorder.close()
    return read_run(config.result_path).arrays


@pytest.mark.parametrize("case", CASES)
def test_pixel_clients_train_exactly_as_float_clients(case, tmp_path, monkeypatch):
    pixel, floats = (_run(tmp_path, case, p, monkeypatch) for p in (True, False))
    assert np.isfinite(pixel["round/train_loss"]).all()
    learned = [k for k in pixel if k.split("/")[-1] in ("train_loss", "test_acc", "local_test_acc", "test_loss")]
    assert "client/train_loss" in learned and len(learned) >= 3
    for key in learned:
        np.testing.assert_array_equal(pixel[key], floats[key], err_msg=key)
