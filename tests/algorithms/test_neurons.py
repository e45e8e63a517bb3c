"""Neuron layers: permuting and zero-padding a layer and the next layer's inputs keeps the network's
function (conv channels, the first FC after the convs, embeddings and LSTM units), slicing undoes it,
and signatures round-trip."""
import copy

import pytest
import torch
from torch import nn

from hpcfl.algorithms.neurons import (
    chain,
    decode,
    encode,
    pick,
    pick_inputs,
    place,
    place_inputs,
    resize_,
    signature,
    width,
    with_signature,
)
from hpcfl.errors import ConfigError
from hpcfl.models import build_model

MODELS = [("fmnist_cnn", (1, 12, 12), 10), ("lenet", (1, 28, 28), 10), ("char_lstm", (6,), 12)]


def _net(name, shape, classes):
    torch.manual_seed(0)
    net = build_model(name, shape, classes).eval()
    for p in net.parameters():                      # biases too, so a dropped or misplaced one shows
        torch.nn.init.normal_(p, std=0.3)
    return net


def _inputs(shape, classes):
    gen = torch.Generator().manual_seed(1)
    if len(shape) == 1:
        return torch.randint(0, classes, (5, *shape), generator=gen)
    return torch.randn(5, *shape, generator=gen)


@pytest.mark.parametrize("name, shape, classes", MODELS)
def test_placing_neurons_and_next_inputs_into_a_wider_layer_keeps_the_function(name, shape, classes):
    net, x = _net(name, shape, classes), _inputs(shape, classes)
    layers, state = chain(net), dict(net.state_dict())
    expected = net(x)
    for i, layer in enumerate(layers[:-1]):
        own = width(state, layer)
        positions = torch.randperm(own + 3, generator=torch.Generator().manual_seed(i))[:own]   # 3 empty slots
        wide = place_inputs(place(state, layer, positions, own + 3), layers[i + 1], positions, own, own + 3)
        wider = resize_(copy.deepcopy(net), wide)
        assert width(wide, layer) == own + 3
        for module in wider.modules():               # a resized module describes its new shape (repr, readers)
            shape = getattr(module, "weight", torch.empty(0)).shape
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                out, inp = ((module.out_features, module.in_features) if isinstance(module, nn.Linear)
                            else (module.out_channels, module.in_channels))
                assert (out, inp) == tuple(shape[:2])
            elif isinstance(module, nn.Embedding):
                assert (module.num_embeddings, module.embedding_dim) == tuple(shape)
        torch.testing.assert_close(wider(x), expected, rtol=1e-4, atol=1e-4)   # summation order
        back = pick_inputs(pick(wide, layer, positions), layers[i + 1], positions, own + 3)
        for key in state:
            assert torch.equal(back[key], state[key]), key


@pytest.mark.parametrize("name, shape, classes", MODELS)
def test_signature_and_travel_encoding_round_trip_and_mark_biases(name, shape, classes):
    net = _net(name, shape, classes)
    state = dict(net.state_dict())
    for layer in chain(net):
        rows, bias = signature(state, layer)
        assert rows.shape == (width(state, layer), bias.numel())
        rebuilt = with_signature(state, layer, rows)
        travelled = decode(encode(state, layer), state, layer, width(state, layer))
        for p in layer.params:
            assert torch.equal(rebuilt[p.key], state[p.key]), p.key
            assert torch.equal(travelled[p.key], state[p.key]), p.key
        assert int(bias.sum()) == {"conv": 1, "linear": 1, "lstm": 8, "embedding": 0}[_kind(net, layer.name)]


def _kind(net, name):
    module = dict(net.named_modules())[name]
    return {"Conv2d": "conv", "Linear": "linear", "LSTM": "lstm", "Embedding": "embedding"}[type(module).__name__]


def test_a_conv_neuron_is_its_flattened_filter_and_bias():
    net = _net("lenet", (1, 28, 28), 10)
    state = dict(net.state_dict())
    rows, bias = signature(state, chain(net)[1])                  # conv2: 50 filters of 20 x 5 x 5
    assert rows.shape == (50, 20 * 25 + 1) and bias[-1] and not bias[:-1].any()
    assert torch.equal(rows[7, :-1], state["conv2.weight"][7].reshape(-1))
    assert rows[7, -1] == state["conv2.bias"][7]


def test_an_lstm_unit_carries_its_four_gates():
    net = _net("char_lstm", (6,), 12)
    state, lstm = dict(net.state_dict()), chain(net)[1]
    rows, _ = signature(state, lstm)
    hidden = width(state, lstm)
    gates = state["lstm.weight_ih_l0"].reshape(4, hidden, -1)[:, 5]          # unit 5, each gate's input weights
    assert torch.equal(rows[5, :gates.numel()], gates.reshape(-1))


def test_batchnorm_models_are_refused_by_name():
    with pytest.raises(ConfigError, match="BatchNorm2d"):
        chain(build_model("resnet18", (3, 32, 32), 10))
