"""Layout: named tensors <-> one flat buffer, and the linearity law the aggregation relies on."""
import pytest
import torch

from hpcfl.errors import PayloadError
from hpcfl.models import build_model
from hpcfl.payload import Layout

torch.set_num_threads(1)


def tensors(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(4, 3, 2, 2, generator=g, dtype=dtype),
        "conv.bias": torch.randn(4, generator=g, dtype=dtype),
        "scalar": torch.randn((), generator=g, dtype=dtype),        # 0-d
        "fc.weight": torch.randn(5, 7, generator=g, dtype=dtype),
    }


def test_layout_of_records_names_shapes_and_sizes():
    layout = Layout.of(tensors())
    assert layout.names == ("conv.weight", "conv.bias", "scalar", "fc.weight")
    assert layout.shapes == ((4, 3, 2, 2), (4,), (), (5, 7))
    assert layout.sizes == (48, 4, 1, 35)
    assert layout.numel == 88


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pack_unpack_round_trip(dtype):
    ts = tensors()
    layout = Layout.of(ts)
    flat = layout.pack(ts, dtype=dtype)
    assert flat.dtype == dtype and flat.shape == (layout.numel,)
    # layout order: the flat buffer is the concatenation of the raveled tensors
    torch.testing.assert_close(flat, torch.cat([t.reshape(-1) for t in ts.values()]).to(dtype), rtol=0, atol=0)
    back = layout.unpack(flat)
    assert list(back) == list(ts)
    for name, t in ts.items():
        assert back[name].shape == t.shape
        assert back[name].dtype == dtype
        assert torch.equal(back[name], t.to(dtype))      # float32 -> float64 -> exact; float32 -> float32 exact


def test_unpack_returns_views_into_the_buffer():
    ts = tensors()
    layout = Layout.of(ts)
    flat = layout.pack(ts)
    views = layout.unpack(flat)
    flat.zero_()
    assert all(torch.count_nonzero(v) == 0 for v in views.values())


def test_pack_accepts_the_same_names_in_another_order():
    ts = tensors()
    layout = Layout.of(ts)
    shuffled = dict(reversed(list(ts.items())))
    assert torch.equal(layout.pack(shuffled), layout.pack(ts))


def test_pack_scale():
    ts = tensors()
    layout = Layout.of(ts)
    torch.testing.assert_close(layout.pack(ts, scale=-2.5), -2.5 * layout.pack(ts), rtol=0, atol=0)


def test_additivity_law():
    a, b = tensors(1), tensors(2)
    layout = Layout.of(a)
    summed = layout.unpack(layout.pack(a) + layout.pack(b))
    for name in a:
        # the same float64 additions, element by element
        assert torch.equal(summed[name], a[name].double() + b[name].double())


def test_add_into_with_scale_equals_pack_of_scaled():
    a, b = tensors(1), tensors(2)
    layout = Layout.of(a)
    flat = torch.zeros(layout.numel, dtype=torch.float64)
    layout.add_into(flat, a, scale=0.25)
    expected = layout.pack({k: 0.25 * v.double() for k, v in a.items()})
    torch.testing.assert_close(flat, expected, rtol=0, atol=0)
    layout.add_into(flat, b, scale=3.0)                   # accumulates, does not overwrite
    torch.testing.assert_close(flat, expected + layout.pack(b, scale=3.0), rtol=1e-15, atol=0)


def test_add_into_zero_overwrites():
    a = tensors(1)
    layout = Layout.of(a)
    flat = torch.full((layout.numel,), 123.0, dtype=torch.float64)
    layout.add_into(flat, a, scale=2.0, zero=True)
    torch.testing.assert_close(flat, layout.pack(a, scale=2.0), rtol=0, atol=0)


def test_weighted_average_is_linear_on_a_real_model_state_dict():
    torch.manual_seed(0)
    m1 = build_model("fmnist_cnn", (1, 28, 28), 10)
    m2 = build_model("fmnist_cnn", (1, 28, 28), 10)
    s1, s2 = m1.state_dict(), m2.state_dict()
    layout = Layout.of(s1)
    assert layout.numel == sum(t.numel() for t in s1.values())
    assert layout.numel > 1000
    # the identity on a state_dict
    back = layout.unpack(layout.pack(s1))
    for name, t in s1.items():
        assert torch.equal(back[name], t.double())
    # the law: a weighted sum of packed buffers is the packed weighted sum of the tensors
    flat = torch.zeros(layout.numel, dtype=torch.float64)
    layout.add_into(flat, s1, scale=0.3)
    layout.add_into(flat, s2, scale=0.7)
    avg = layout.unpack(flat)
    for name in s1:
        torch.testing.assert_close(avg[name], 0.3 * s1[name].double() + 0.7 * s2[name].double(),
                                   rtol=1e-15, atol=1e-15)
    summed = layout.unpack(layout.pack(s1) + layout.pack(s2))
    for name in s1:
        assert torch.equal(summed[name], s1[name].double() + s2[name].double())


def test_layout_concatenation():
    a = {"x": torch.ones(2, 3), "y": torch.ones(())}
    b = {"z": torch.zeros(4)}
    both = Layout.of(a) + Layout.of(b)
    assert both.names == ("x", "y", "z")
    assert both.shapes == ((2, 3), (), (4,))
    assert both.numel == 11
    flat = both.pack({**a, **b})
    torch.testing.assert_close(flat, torch.tensor([1.0] * 7 + [0.0] * 4, dtype=torch.float64))


def test_layout_concatenation_name_clash():
    a = Layout.of({"x": torch.ones(2), "shared": torch.ones(1)})
    b = Layout.of({"shared": torch.ones(1), "z": torch.ones(3)})
    with pytest.raises(PayloadError, match="shared"):
        a + b


def test_missing_name_is_a_payload_error():
    ts = tensors()
    layout = Layout.of(ts)
    del ts["conv.bias"]
    with pytest.raises(PayloadError, match="conv.bias"):
        layout.pack(ts)


def test_extra_name_is_a_payload_error():
    ts = tensors()
    layout = Layout.of(ts)
    ts["intruder"] = torch.ones(1)
    with pytest.raises(PayloadError, match="intruder"):
        layout.pack(ts)
    flat = torch.zeros(layout.numel, dtype=torch.float64)
    with pytest.raises(PayloadError, match="intruder"):
        layout.add_into(flat, ts)


def test_wrong_shape_is_a_payload_error_naming_the_tensor():
    ts = tensors()
    layout = Layout.of(ts)
    ts["fc.weight"] = torch.zeros(7, 5)                   # same numel, wrong shape
    with pytest.raises(PayloadError, match=r"'fc\.weight'"):
        layout.pack(ts)
    flat = torch.zeros(layout.numel, dtype=torch.float64)
    with pytest.raises(PayloadError, match=r"'fc\.weight'"):
        layout.add_into(flat, ts)
    ts = tensors()
    ts["scalar"] = torch.zeros(1)                         # 0-d vs 1-element is a shape error too
    with pytest.raises(PayloadError, match="'scalar'"):
        layout.pack(ts)


def test_wrong_flat_size_is_a_payload_error():
    layout = Layout.of(tensors())
    with pytest.raises(PayloadError, match=str(layout.numel)):
        layout.unpack(torch.zeros(layout.numel + 1, dtype=torch.float64))
    with pytest.raises(PayloadError, match=str(layout.numel)):
        layout.unpack(torch.zeros(layout.numel - 1, dtype=torch.float64))
    with pytest.raises(PayloadError):
        layout.unpack(torch.zeros(2, layout.numel // 2, dtype=torch.float64))   # right numel, not flat


def test_select_keeps_the_named_entries_in_order():
    layout = Layout(("body.w", "classifier.weight", "classifier.bias"), ((3, 2), (4, 2), (4,)))
    head = layout.select(lambda name: name.startswith("classifier."))
    assert head.names == ("classifier.weight", "classifier.bias") and head.shapes == ((4, 2), (4,))
    assert head.numel == 12


@pytest.mark.parametrize("zero", [True, False])
def test_tensors_longer_than_a_chunk_are_packed_piece_by_piece_at_their_offsets(monkeypatch, zero):
    """add_into works in chunks of CHUNK elements (2**22 in use); a chunk of 3 makes the offsets past
    the first chunk, and across tensors, reachable on small tensors."""
    import hpcfl.payload

    monkeypatch.setattr(hpcfl.payload, "CHUNK", 3)
    values = {"a": torch.arange(7.0).reshape(7), "b": -torch.arange(10.0).reshape(2, 5)}
    layout = Layout.of(values)
    start = torch.full((17,), 0.5, dtype=torch.float64)
    layout.add_into(start, values, scale=2.0, zero=zero)
    expected = 2.0 * torch.cat([values["a"], values["b"].reshape(-1)]).double() + (0.0 if zero else 0.5)
    torch.testing.assert_close(start, expected)


def test_a_single_tensor_payload_packs_on_its_tensors_device_and_adds_with_scale_one_by_default():
    value = {"w": torch.tensor([1.0, -2.0, 3.0])}
    layout = Layout.of(value)
    flat = layout.pack(value, dtype=torch.float32)
    assert flat.device == value["w"].device and flat.dtype == torch.float32
    torch.testing.assert_close(flat, value["w"])
    layout.add_into(flat, value)                          # the default scale is 1: flat = 2 w
    torch.testing.assert_close(flat, 2 * value["w"])
    assert Layout.of({}).pack({}).numel() == 0


def test_a_layout_is_immutable_and_hashable():
    import dataclasses

    layout = Layout.of(tensors())
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.names = ()
    assert {layout: 1}[Layout.of(tensors(seed=1))] == 1       # equal names and shapes: the same key
