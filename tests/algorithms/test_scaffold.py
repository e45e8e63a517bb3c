"""SCAFFOLD's client with the real LocalTrainer (SGD, momentum 0.9, weight decay) on a 2-class
softmax regression, whose full-batch trajectory the test recomputes by hand in float64: option II's
control variate divided by the momentum-aware step count a_i over two rounds from non-zero c, c_i."""
import numpy as np
import pytest
import torch
from algorithms.helpers import make
from torch import nn

from hpcfl.algorithms.base import Client
from hpcfl.errors import ConfigError
from hpcfl.testing import StepTrainer
from hpcfl.training import LocalTrainer

LR, DECAY, STEPS = 0.1, 0.01, 3          # STEPS local epochs of one full batch each
X = np.array([[1.0, 2.0], [-1.0, 0.5], [0.5, -1.5], [2.0, 1.0]])
Y = np.array([0, 1, 1, 0])


class Softmax2(nn.Module):
    """logits = W x: the cross-entropy gradient (softmax(W x) - onehot(y)) x^T / n is read off."""

    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(2, 2, bias=False)

    def features(self, x):
        return x

    def forward(self, x):
        return self.classifier(x)


def _sgd(x, correction, momentum, mu):
    """torch.optim.SGD's steps from x by hand: d = grad CE + (c - c_i) + mu (w - x) + decay w;
    buf = momentum buf + d; w -= lr buf."""
    w, buf = x, None
    for _ in range(STEPS):
        logits = X @ w.T
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d = (p - np.eye(2)[Y]).T @ X / len(Y) + correction + mu * (w - x) + DECAY * w
        buf = d if buf is None else momentum * buf + d
        w = w - LR * buf
    return w


def _round(algo, me, trainer, model, round, x, c):
    """One client_update from the downlinked (x, c); returns (contributions, trained weight)."""
    downlink = {"model": {"classifier.weight": torch.tensor(x, dtype=torch.float32)},
                "control": {"classifier.weight": torch.tensor(c, dtype=torch.float32)}}
    contributions, metrics = algo.client_update(algo.plan(round)[0], round, me, downlink, model, trainer)
    assert metrics["steps"] == STEPS
    return contributions, model.classifier.weight.detach().double().numpy()


@pytest.mark.parametrize("momentum, mu, a", [
    (0.9, 0.0, 1 + 1.9 + 2.71),           # counters 1, 1 + 0.9, 1 + 0.9 * 1.9
    (0.0, 0.0, STEPS),                    # option II as the paper: a = K
    (0.0, 0.5, 1 + 0.95 + 0.95 ** 2),     # prox: a <- (1 - lr mu) a + 1
    (0.9, 0.5, 1 + 1.85 + 2.5225),        # both: buffers 1, 0.9 + 1 - 0.05 x 1, 0.9 x 1.85 + 1 - 0.05 x 2.85
], ids=["momentum", "sgd", "prox", "momentum-prox"])
def test_control_variate_divides_the_model_change_by_the_momentum_aware_step_count(momentum, mu, a):
    train = {"lr": LR, "momentum": momentum, "weight_decay": DECAY, "batch_size": 8, "local_epochs": STEPS,
             "clients_per_round": 1}
    algo = make("scaffold", Softmax2(), train=train,
                algorithm={"name": "scaffold", "terms": {"prox": {"mu": mu}} if mu else {}})
    trainer = LocalTrainer(algo.setup.job.train, seed=0)
    me = Client(0, torch.tensor(X, dtype=torch.float32), torch.tensor(Y), np.array([2, 2]))
    c_i = np.array([[0.2, -0.1], [0.05, 0.3]])
    me.state["control"] = {"classifier.weight": torch.tensor(c_i, dtype=torch.float32)}
    model = Softmax2()
    with torch.no_grad():
        model.classifier.weight.fill_(5.0)       # what the worker's model holds: training must start from x
    for round, (x, c) in enumerate([(np.array([[0.3, -0.2], [-0.4, 0.1]]), np.array([[-0.1, 0.2], [0.4, 0.0]])),
                                    (np.array([[0.1, 0.5], [0.2, -0.3]]), np.array([[0.3, 0.1], [-0.2, 0.25]]))]):
        contributions, y = _round(algo, me, trainer, model, round, x, c)
        np.testing.assert_allclose(y, _sgd(x, c - c_i, momentum, mu), rtol=1e-5, atol=1e-6)
        expected = c_i - c + (x - y) / (a * LR)             # option II with a_i; weight decay not in a_i
        np.testing.assert_allclose(me.state["control"]["classifier.weight"].double().numpy(), expected, rtol=1e-5,
                                   atol=1e-6)
        delta, weight = contributions["control"]
        np.testing.assert_allclose(delta["classifier.weight"].double().numpy(), expected - c_i, rtol=1e-5,
                                   atol=1e-6)
        assert weight == 1.0
        model_sent, samples = contributions["model"]
        np.testing.assert_array_equal(model_sent["classifier.weight"].numpy(), y.astype(np.float32))
        assert samples == 4.0
        c_i = expected                    # round 1 corrects by c - c_i+ and sends c_i++ - c_i+


def test_without_momentum_the_control_variate_is_the_papers_number_for_number():
    """rho = 0: a_i = K, so c_i+ is option II's c_i - c + (x - y) / (K lr) to the last bit."""
    train = {"lr": LR, "weight_decay": DECAY, "batch_size": 8, "local_epochs": STEPS, "clients_per_round": 1}
    algo = make("scaffold", Softmax2(), train=train)
    me = Client(0, torch.tensor(X, dtype=torch.float32), torch.tensor(Y), np.array([2, 2]))
    c_i = torch.tensor([[0.2, -0.1], [0.05, 0.3]])
    me.state["control"] = {"classifier.weight": c_i.clone()}
    x, c = torch.tensor([[0.3, -0.2], [-0.4, 0.1]]), torch.tensor([[-0.1, 0.2], [0.4, 0.0]])
    model = Softmax2()
    algo.client_update(algo.plan(0)[0], 0, me, {"model": {"classifier.weight": x}, "control": {"classifier.weight": c}},
                       model, LocalTrainer(algo.setup.job.train, seed=0))
    y = model.classifier.weight.detach()
    assert torch.equal(me.state["control"]["classifier.weight"], c_i - c + (x - y) * (1.0 / (float(STEPS) * LR)))



def test_a_client_with_no_step_keeps_its_control_variate_and_the_model():
    """One sample on a BatchNorm model: the trainer drops the batch, so there is no model change to
    divide by the step count (it was a ZeroDivisionError)."""
    algo = make("scaffold", Softmax2(), train={"lr": LR, "clients_per_round": 1})
    me = Client(0, torch.tensor(X[:1], dtype=torch.float32), torch.tensor(Y[:1]), np.array([1, 0]))
    c_i = torch.tensor([[0.2, -0.1], [0.05, 0.3]])
    me.state["control"] = {"classifier.weight": c_i.clone()}
    x, c = torch.tensor([[0.3, -0.2], [-0.4, 0.1]]), torch.tensor([[-0.1, 0.2], [0.4, 0.0]])
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, me, {"model": {"classifier.weight": x},
                                                                  "control": {"classifier.weight": c}},
                                          Softmax2(), StepTrainer(shift=0.0, steps=0))
    assert torch.equal(me.state["control"]["classifier.weight"], c_i)
    assert torch.equal(contributions["control"][0]["classifier.weight"], torch.zeros(2, 2))
    assert torch.equal(contributions["model"][0]["classifier.weight"], x)


def test_scaffold_params_default_to_the_papers_server_step_and_are_frozen():
    import dataclasses

    from hpcfl.algorithms import algorithm_params

    params = algorithm_params("scaffold", {})
    assert params.server_lr == 1.0                  # eta_g = 1: x <- mean of the y_i (Algorithm 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.server_lr = 0.5
    for bad in (0.0, -1.0):
        with pytest.raises(ConfigError, match=rf"server_lr = {bad} must be > 0"):
            algorithm_params("scaffold", {"server_lr": bad})
    assert algorithm_params("scaffold", {"server_lr": 0.5}).server_lr == 0.5
