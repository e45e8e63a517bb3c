"""A network as a chain of neuron layers, for matched averaging (FedMA, section 2.2).

A layer's *neurons* are what permutation invariance permutes: a Linear's output units, a Conv2d's
output channels (eq. 5), an Embedding's dimensions (the columns of its table), an LSTM's hidden units
(the four gates of a unit move together, eq. 6). Each parameter of a layer says on which axis the
layer's own neurons lie, on which axis the previous layer's neurons feed in (a Linear after
convolutions sees each channel as a block of spatial positions, since flatten is channel-major), and,
for the LSTM's hidden-to-hidden weights, on which axis the layer's own neurons feed back in.

On state dicts (name -> tensor) of any widths, that gives FedMA its operations:
- `signature` / `with_signature`: the neurons as rows (incoming weights with conv kernels flattened,
  biases last) which BBP-MAP matches, and back; recurrent weights are not part of the signature
  (the paper matches LSTMs on their input-to-hidden weights). An LSTM's signature holds both its
  biases, bias_ih and bias_hh (ours: the authors' language_fedma.py matches on weight_ih and bias_ih
  only; torch adds the two into each gate's one bias);
- `place` / `pick`: put a layer's neurons at given positions of a wider layer (zeros elsewhere) or
  take them back out; `place_inputs` / `pick_inputs` do the same to the next layer's inputs.
  Placing both preserves the network's function: a zero neuron outputs 0 (ReLU(0), and an LSTM unit
  with zero weights keeps h = 0) and nothing reads it;
- `encode` / `decode`: a layer as one flat buffer (signature rows, then recurrent tensors), as
  FedMA's matching collective moves it;
- `resize_`: make a module instance take a state of other widths.
"""
from dataclasses import dataclass
from math import prod

import torch
from torch import nn

from hpcfl.errors import ConfigError
from hpcfl.models import layout_of

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Param:
    key: str                        # state_dict key
    out: int                        # axis of the layer's own neurons
    inp: int | None = None          # axis fed by the previous layer's neurons
    recurrent: int | None = None    # axis fed back by the layer's own neurons (LSTM weight_hh)
    groups: int = 1                 # the out axis holds `groups` consecutive blocks of neurons (LSTM gates)
    bias: bool = False


@dataclass(frozen=True)
class Layer:
    name: str
    params: tuple[Param, ...]


def chain(model: nn.Module) -> list[Layer]:
    """The model's layers in definition order (which is their forward order in every matched model);
    raises ConfigError for a layer matched averaging does not handle (BatchNorm, grouped convs, ...)."""
    layers = []
    for name, module in model.named_modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        key = (lambda p, name=name: f"{name}.{p}") if name else (lambda p: p)
        if isinstance(module, (nn.Conv2d, nn.Linear)) and getattr(module, "groups", 1) == 1:
            params = [Param(key("weight"), 0, inp=1)] + ([Param(key("bias"), 0, bias=True)] if "bias" in own else [])
        elif isinstance(module, nn.Embedding):
            params = [Param(key("weight"), 1)]
        elif isinstance(module, nn.LSTM) and module.num_layers == 1 and not module.bidirectional \
                and not module.proj_size and module.bias:
            params = [Param(key("weight_ih_l0"), 0, inp=1, groups=4),
                      Param(key("weight_hh_l0"), 0, recurrent=1, groups=4),
                      Param(key("bias_ih_l0"), 0, groups=4, bias=True),
                      Param(key("bias_hh_l0"), 0, groups=4, bias=True)]
        else:
            raise ConfigError(f"layer '{name}' ({type(module).__name__}) cannot be matched neuron by neuron: matched "
                              "averaging takes Conv2d, Linear, Embedding and 1-layer LSTM without BatchNorm "
                              "(models lenet, vgg9, char_lstm, fmnist_cnn, tcnn)")
        layers.append(Layer(name, tuple(params)))
    return layers


def width(state: State, layer: Layer) -> int:
    first = layer.params[0]
    return state[first.key].shape[first.out] // first.groups


def _blocks(t: torch.Tensor, axis: int, groups: int, count: int) -> torch.Tensor:
    """`t` with `axis` split into (groups, count, block)."""
    shape = t.shape
    return t.reshape(*shape[:axis], groups, count, shape[axis] // (groups * count), *shape[axis + 1:])


def _take(t, axis, groups, count, idx):
    picked = _blocks(t, axis, groups, count).index_select(axis + 1, idx)
    return picked.reshape(*t.shape[:axis], -1, *t.shape[axis + 1:])


def _put(t, axis, groups, count, idx, new):
    parts = _blocks(t, axis, groups, count)
    shape = list(parts.shape)
    shape[axis + 1] = new
    out = parts.new_zeros(shape).index_copy_(axis + 1, idx, parts)
    return out.reshape(*t.shape[:axis], -1, *t.shape[axis + 1:])


def _reindex(state: State, layer: Layer, idx, count: int, new: int | None, inputs: bool) -> State:
    out = dict(state)
    idx = torch.as_tensor(idx, dtype=torch.long, device=state[layer.params[0].key].device)
    for p in layer.params:
        t = state[p.key]
        for axis, groups in ([(p.inp, 1)] if inputs else [(p.out, p.groups), (p.recurrent, 1)]):
            if axis is not None:
                t = _take(t, axis, groups, count, idx) if new is None else _put(t, axis, groups, count, idx, new)
        out[p.key] = t
    return out


def pick(state: State, layer: Layer, idx) -> State:
    """The layer keeps only its neurons `idx`, in that order (a client's slice of the global model)."""
    return _reindex(state, layer, idx, width(state, layer), None, inputs=False)


def place(state: State, layer: Layer, idx, new_width: int) -> State:
    """The layer's neuron l moves to position idx[l] of `new_width`, zero neurons elsewhere."""
    return _reindex(state, layer, idx, width(state, layer), new_width, inputs=False)


def pick_inputs(state: State, layer: Layer, idx, previous_width: int) -> State:
    """The layer keeps only the inputs from the previous layer's neurons `idx`."""
    return _reindex(state, layer, idx, previous_width, None, inputs=True)


def place_inputs(state: State, layer: Layer, idx, previous_width: int, new_width: int) -> State:
    """The input from the previous layer's neuron l moves to position idx[l] of `new_width` (zeros elsewhere)."""
    return _reindex(state, layer, idx, previous_width, new_width, inputs=True)


def signature(state: State, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """(neurons x D rows, D booleans marking bias columns): each neuron's incoming weights and biases."""
    count, rows, bias = width(state, layer), [], []
    for p in layer.params:
        if p.recurrent is None:
            t = state[p.key].movedim(p.out, 0).reshape(p.groups, count, -1).transpose(0, 1).reshape(count, -1)
            rows.append(t)
            bias.append(torch.full((t.shape[1],), p.bias))
    return torch.cat(rows, dim=1), torch.cat(bias)


def with_signature(state: State, layer: Layer, rows: torch.Tensor) -> State:
    """The layer's non-recurrent parameters rebuilt from `rows` (any number of neurons); recurrent ones unchanged."""
    out, offset, count = dict(state), 0, rows.shape[0]
    for p in layer.params:
        if p.recurrent is None:
            rest = state[p.key].movedim(p.out, 0).shape[1:]
            size = p.groups * prod(rest)
            block = rows[:, offset:offset + size].reshape(count, p.groups, *rest).transpose(0, 1)
            out[p.key] = block.reshape(p.groups * count, *rest).movedim(0, p.out).contiguous()
            offset += size
    return out


def recurrent(layer: Layer) -> tuple[Param, ...]:
    return tuple(p for p in layer.params if p.recurrent is not None)


def encode(state: State, layer: Layer) -> torch.Tensor:
    """A layer as it travels: its neurons' signature rows, then its recurrent tensors."""
    return torch.cat([signature(state, layer)[0].reshape(-1), *(state[p.key].reshape(-1) for p in recurrent(layer))])


def decode(flat: torch.Tensor, like: State, layer: Layer, count: int) -> State:
    """`encode`'s inverse for a layer of `count` neurons: `like` (a state holding the layer at any
    width) gives every other dimension."""
    depth = signature(like, layer)[0].shape[1]
    state, offset = with_signature(like, layer, flat[:count * depth].view(count, depth)), count * depth
    for p in recurrent(layer):
        shape = list(like[p.key].shape)
        shape[p.out], shape[p.recurrent] = p.groups * count, count
        state[p.key] = flat[offset:offset + prod(shape)].view(shape)
        offset += prod(shape)
    return state


def resize_(model: nn.Module, state: State) -> nn.Module:
    """Give every matched layer of `model` the tensors (and so the widths) of `state`, in place."""
    modules = dict(model.named_modules())
    for layer in chain(model):
        module = modules[layer.name]
        device = next(module.parameters()).device
        for p in layer.params:
            attribute = p.key.rsplit(".", 1)[-1]
            layout = layout_of(getattr(module, attribute))            # it stays (run.memory_format)
            setattr(module, attribute, nn.Parameter(state[p.key].detach().to(device).clone(memory_format=layout)))
        shape = getattr(module, layer.params[0].key.rsplit(".", 1)[-1]).shape
        if isinstance(module, nn.Conv2d):
            module.out_channels, module.in_channels = shape[0], shape[1]
        elif isinstance(module, nn.Linear):
            module.out_features, module.in_features = shape
        elif isinstance(module, nn.Embedding):
            module.num_embeddings, module.embedding_dim = shape
        else:
            module.hidden_size, module.input_size = shape[0] // 4, shape[1]
            module._init_flat_weights()
    return model
