"""run.memory_format: 2-d convolution weights channels_last on the CPU under 'auto', kept so when a
model is received and through FedMA's resizing, travelling in the logical (NCHW) order, and training
to the same numbers as contiguous weights up to float rounding."""
import copy

import pytest
import torch

import hpcfl
from hpcfl.algorithms.neurons import chain, place, place_inputs, resize_, width
from hpcfl.jobs import job_from_dict
from hpcfl.metrics import read_run
from hpcfl.models import build_model, lay_out, load_state
from hpcfl.payload import Layout
from hpcfl.runtime.build import build_models
from hpcfl.runtime.placement import memory_format

CL, NCHW = torch.channels_last, torch.contiguous_format


def _channels_last(t: torch.Tensor) -> bool:
    """Strided as channels_last: the channels adjacent (a weight with one input channel is contiguous
    either way, and only these strides make the convolution choose channels_last)."""
    return t.is_contiguous(memory_format=CL) and t.stride(1) == 1


def test_auto_is_channels_last_on_the_cpu_only():
    assert memory_format("auto", torch.device("cpu")) == CL
    assert memory_format("auto", "cpu") == CL
    assert memory_format("auto", torch.device("cuda", 0)) == NCHW
    assert memory_format("contiguous", "cpu") == NCHW
    assert memory_format("channels_last", torch.device("cuda", 1)) == CL


@pytest.mark.parametrize(("setting", "expected"), [("auto", True), ("channels_last", True), ("contiguous", False)])
def test_the_runner_lays_out_convolutions(setting, expected):
    config = job_from_dict({"run": {"memory_format": setting}, "model": {"name": "fmnist_cnn_bn"}})
    model = build_models(config, (1, 28, 28), 10, torch.device("cpu"))["fmnist_cnn_bn"]
    assert _channels_last(model.conv[4].weight) is expected                  # 16 -> 32 channels
    assert _channels_last(model.conv[0].weight) is expected                  # 1 -> 16: it sets the activations' layout
    assert all(p.is_contiguous() for p in model.parameters() if p.dim() != 4)   # the rest as built
    plain = build_model("fmnist_cnn_bn", (1, 28, 28), 10)
    plain.load_state_dict(model.state_dict())
    assert torch.equal(Layout.of(model.state_dict()).pack(model.state_dict()),     # payloads in NCHW order
                       Layout.of(plain.state_dict()).pack(plain.state_dict()))


def test_only_2d_convolution_weights_change_layout():
    """A plug-in's Conv3d (5-d weight) and a 4-d non-convolution parameter stay as built."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv3d(2, 4, 3))
    net.register_parameter("table", torch.nn.Parameter(torch.randn(2, 3, 4, 5)))
    lay_out(net, CL)
    assert _channels_last(net[0].weight)
    assert net[1].weight.is_contiguous() and net.table.is_contiguous()
    lay_out(net, NCHW)
    assert net[0].weight.is_contiguous() and not _channels_last(net[0].weight)


def test_a_received_model_keeps_the_layout():
    """The global model arrives as contiguous tensors and is copied in, not swapped in."""
    torch.manual_seed(0)
    model = lay_out(build_model("fmnist_cnn", (1, 28, 28), 10), CL)
    received = {k: torch.randn_like(v, memory_format=torch.contiguous_format) for k, v in model.state_dict().items()}
    load_state(model, received)
    assert _channels_last(model.conv[3].weight)
    assert all(torch.equal(v, received[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("layout", [CL, NCHW])
def test_fedma_resizing_keeps_the_layout(layout):
    torch.manual_seed(0)
    net = lay_out(build_model("lenet", (1, 28, 28), 10), layout)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    first, second = chain(net)[:2]
    own = width(state, first)
    positions = torch.arange(own)
    wide = place_inputs(place(state, first, positions, own + 2), second, positions, own, own + 2)   # 2 new neurons
    wider = resize_(copy.deepcopy(net), wide)
    conv1, conv2 = (dict(wider.named_modules())[layer.name].weight for layer in (first, second))
    assert conv2.shape[1] == own + 2 and conv1.shape[0] == own + 2
    assert _channels_last(conv1) is _channels_last(conv2) is (layout == CL)   # one input channel: by its strides
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(wider(x), net(x), rtol=1e-4, atol=1e-5)   # the new neurons are zero: same function


def test_training_gives_the_same_numbers_to_float_rounding(tmp_path):
    """FedAvg with momentum and weight decay, 2 rounds on digits, both layouts. (Longer runs drift apart as
    any two summation orders do: a max-pooling or ReLU decision flipped by a rounding is amplified.)"""
    def run(setting):
        job = {"run": {"study": "mf", "name": setting, "rounds": 2, "results_root": str(tmp_path),
                       "memory_format": setting},
               "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
                        "partition_params": {"beta": 0.5}},
               "model": {"name": "fmnist_cnn"},
               "train": {"clients_per_round": 4, "batch_size": 16, "lr": 0.05, "momentum": 0.9,
                         "weight_decay": 1e-4}}
        return read_run(hpcfl.run(job, quiet=True)).arrays

    last, plain = run("channels_last"), run("contiguous")
    for key in ("round/test_loss", "round/train_loss"):
        torch.testing.assert_close(torch.from_numpy(last[key]), torch.from_numpy(plain[key]), rtol=1e-4, atol=1e-5)
    assert last["round/test_acc"][-1] > 0.5                                # it learnt
