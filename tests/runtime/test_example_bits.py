"""Each evaluated model's correctness per test example is recorded, one bit an example a round: the
global model's on the test set, and each trained local model's on its client's own test examples.
The bits must give back the accuracies recorded beside them, round by round."""
import numpy as np
from helpers import launch

from hpcfl.metrics import read_run


def _run(tiny_job, tmp_path, algorithm, *settings):
    job = tiny_job(algorithm, rounds=3)
    done = launch(job, "--results-root", tmp_path / "results", *(a for s in settings for a in ("--set", s)))
    assert done.returncode == 0, done.stderr
    (path,) = (tmp_path / "results").rglob("*.h5")
    return read_run(path).arrays


def test_the_global_models_bits_give_back_its_test_accuracy_every_round(tiny_job, tmp_path):
    arrays = _run(tiny_job, tmp_path, "fedavg", "eval.every=2")
    size = int(arrays["example/test_size"])
    bits = np.unpackbits(arrays["example/test_correct"], axis=1, count=size)
    assert arrays["example/test_correct"].dtype == np.uint8 and bits.shape == (3, size)
    acc = arrays["round/test_acc"]
    assert np.isnan(acc[0]) and not bits[0].any()               # round 1 not evaluated: no bits
    assert 0 < acc[2] < 1
    np.testing.assert_array_equal(bits[1:].mean(1), acc[1:])    # rounds 2 and 3 (the last)


def test_each_local_models_bits_give_back_its_clients_personalised_accuracy(tiny_job, tmp_path):
    arrays = _run(tiny_job, tmp_path, "local_only", "data.local_test_ratio=0.3")
    sizes = arrays["example/local_test_sizes"]
    assert len(sizes) == 6 and sizes.min() > 0
    bits = np.unpackbits(arrays["example/local_test_correct"], axis=1, count=sizes.sum())
    per_client = np.split(bits, np.cumsum(sizes)[:-1], axis=1)
    acc = arrays["client/local_test_acc"]                      # NaN for a client not sampled that round
    for c, client_bits in enumerate(per_client):
        sampled = ~np.isnan(acc[:, c])
        assert sampled.any() and not client_bits[~sampled].any()
        np.testing.assert_allclose(client_bits[sampled].mean(1), acc[sampled, c], rtol=1e-12)
