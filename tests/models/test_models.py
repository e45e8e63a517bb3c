"""Model registry: every model builds, splits into features/classifier, is seed-deterministic, and the
FedMA models have the papers' exact parameter shapes."""
import pytest
import torch
from torch import nn

from hpcfl.errors import ConfigError
from hpcfl.models import MODELS, build_model, count_parameters, model_state

torch.set_num_threads(1)

IMAGE_MODELS = ["fmnist_cnn", "fmnist_cnn_narrow", "fmnist_cnn_wide", "tcnn", "lenet", "vgg9", "resnet18", "resnet50",
                "shufflenetv2", "googlenet", "alexnet_cifar"]
SEQ_LEN, VOCAB = 20, 80

FEATURE_WIDTH = {
    "fmnist_cnn": 128, "fmnist_cnn_narrow": 128, "fmnist_cnn_wide": 128, "tcnn": 512, "lenet": 500, "vgg9": 512, "char_lstm": 256,
    "resnet18": 512, "resnet50": 2048, "shufflenetv2": 512, "googlenet": 512, "alexnet_cifar": 512,
}

CASES = [(name, shape, 10) for name in IMAGE_MODELS for shape in [(3, 32, 32), (1, 28, 28)]]
CASES.append(("char_lstm", (SEQ_LEN,), VOCAB))


def make_input(name, in_shape, num_classes, batch=2):
    if name == "char_lstm":
        return torch.randint(0, num_classes, (batch, *in_shape))
    return torch.randn(batch, *in_shape)


def case_id(case):
    return f"{case[0]}-{'x'.join(map(str, case[1]))}"


def test_registry_covers_every_model():
    assert set(MODELS) == set(FEATURE_WIDTH)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_features_and_classifier(case):
    name, in_shape, num_classes = case
    torch.manual_seed(0)
    model = build_model(name, in_shape, num_classes)
    x = make_input(name, in_shape, num_classes)

    model.train()
    logits = model(x)
    assert logits.shape == (2, num_classes)
    logits.logsumexp(1).sum().backward()      # every parameter is used and gets a gradient
    assert all(p.grad is not None for p in model.parameters())

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert model.classifier is linears[-1]
    assert (model.classifier.in_features, model.classifier.out_features) == (FEATURE_WIDTH[name], num_classes)

    model.eval()
    with torch.no_grad():
        feats = model.features(x)
        assert feats.shape == (2, FEATURE_WIDTH[name])
        torch.testing.assert_close(model(x), model.classifier(feats))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_seed_same_weights(name):
    in_shape, num_classes = ((SEQ_LEN,), VOCAB) if name == "char_lstm" else ((3, 32, 32), 10)
    states = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        states.append(model_state(build_model(name, in_shape, num_classes)))
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0])


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_same_seed_leaves_the_generator_in_the_same_state(name):
    """Two builds from the same seed leave torch's generator in the same state, so whatever a run
    draws after building the model (shuffling, dropout) is reproducible too."""
    after = []
    for _ in range(2):
        torch.manual_seed(3)
        build_model(name, (1, 28, 28), 10)
        after.append(torch.rand(1).item())
    assert after[0] == after[1]


def test_building_prints_and_warns_nothing(capsys, recwarn):
    for name in MODELS:
        in_shape, num_classes = ((SEQ_LEN,), VOCAB) if name == "char_lstm" else ((3, 32, 32), 10)
        build_model(name, in_shape, num_classes)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert len(recwarn) == 0, [str(w.message) for w in recwarn]


# FedMA Table 4 (VGG-9), as printed: conv weights (C_in, C_out, c, c), fc weights (in, out).
VGG9_TABLE4 = {
    "layer1.conv1.weight": (3, 32, 3, 3), "layer1.conv1.bias": (32,),
    "layer2.conv2.weight": (32, 64, 3, 3), "layer2.conv2.bias": (64,),
    "layer3.conv3.weight": (64, 128, 3, 3), "layer3.conv3.bias": (128,),
    "layer4.conv4.weight": (128, 128, 3, 3), "layer4.conv4.bias": (128,),
    "layer5.conv5.weight": (128, 256, 3, 3), "layer5.conv5.bias": (256,),
    "layer6.conv6.weight": (256, 256, 3, 3), "layer6.conv6.bias": (256,),
    "layer7.fc7.weight": (4096, 512), "layer7.fc7.bias": (512,),
    "layer8.fc8.weight": (512, 512), "layer8.fc8.bias": (512,),
    "layer9.fc9.weight": (512, 10), "layer9.fc9.bias": (10,),
}
# LeNet: not tabulated in FedMA (Table 3 gives only "431k" parameters); the classic 4-layer LeNet,
# written in the same (C_in, C_out, c, c) / (in, out) convention.
LENET_SHAPES = {
    "conv1.weight": (1, 20, 5, 5), "conv1.bias": (20,),
    "conv2.weight": (20, 50, 5, 5), "conv2.bias": (50,),
    "fc1.weight": (800, 500), "fc1.bias": (500,),
    "fc2.weight": (500, 10), "fc2.bias": (10,),
}
# FedMA Table 5 (1-layer LSTM); already in PyTorch layout.
LSTM_TABLE5 = {
    "encoder.weight": (80, 8),
    "lstm.weight_ih_l0": (1024, 8), "lstm.weight_hh_l0": (1024, 256),
    "lstm.bias_ih_l0": (1024,), "lstm.bias_hh_l0": (1024,),
    "decoder.weight": (80, 256), "decoder.bias": (80,),
}


def to_torch_layout(shape):
    """Table convention -> PyTorch: (C_in, C_out, c, c) -> (C_out, C_in, c, c); (in, out) -> (out, in)."""
    return (shape[1], shape[0], *shape[2:]) if len(shape) >= 2 else shape


def our_name(table_name):
    """'layer7.fc7.weight' -> 'fc7.weight'; the last layer is hpcfl's 'classifier'."""
    layer, kind = table_name.rsplit(".", 1)
    layer = layer.rsplit(".", 1)[-1]
    return f"{'classifier' if layer in ('fc9', 'fc2', 'decoder') else layer}.{kind}"


def param_shapes(model):
    return {k: tuple(v.shape) for k, v in model.named_parameters()}


def has_norm_layer(model):
    return any(isinstance(m, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm))
               for m in model.modules())


def test_vgg9_matches_fedma_table4_exactly():
    model = build_model("vgg9", (3, 32, 32), 10)
    expected = {our_name(k): to_torch_layout(v) for k, v in VGG9_TABLE4.items()}
    assert param_shapes(model) == expected
    assert count_parameters(model) == 3_491_530          # FedMA Table 7, "original" parameter count
    assert not has_norm_layer(model)
    assert not any(k.endswith(("running_mean", "running_var")) for k in model_state(model))
    dropouts = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts == [0.05, 0.10, 0.10]


def test_lenet_shapes_and_431k_parameters():
    model = build_model("lenet", (1, 28, 28), 10)
    expected = {our_name(k): to_torch_layout(v) for k, v in LENET_SHAPES.items()}
    assert param_shapes(model) == expected
    assert count_parameters(model) == 431_080            # FedMA Table 3: "431k"
    assert not has_norm_layer(model)


def test_char_lstm_matches_fedma_table5_exactly():
    model = build_model("char_lstm", (SEQ_LEN,), VOCAB)
    assert param_shapes(model) == {our_name(k): v for k, v in LSTM_TABLE5.items()}
    assert count_parameters(model) == 293_584            # FedMA Table 6, "original" parameter count
    h = model.features(torch.randint(0, VOCAB, (2, SEQ_LEN)))
    assert h.shape == (2, 256)


def test_input_adaptation_keeps_the_other_shapes():
    """1x28x28 only changes the first layer's input channels and the first fc's fan-in."""
    vgg = param_shapes(build_model("vgg9", (1, 28, 28), 10))
    assert vgg["conv1.weight"] == (32, 1, 3, 3) and vgg["fc7.weight"] == (512, 256 * 3 * 3)
    lenet = param_shapes(build_model("lenet", (3, 32, 32), 10))
    assert lenet["conv1.weight"] == (20, 3, 5, 5) and lenet["fc1.weight"] == (500, 50 * 5 * 5)


def test_known_parameter_counts():
    assert count_parameters(build_model("resnet18", (3, 32, 32), 10)) == 11_173_962   # FedFM: 1.17e7
    assert count_parameters(build_model("tcnn", (3, 32, 32), 10)) == 878_538
    assert count_parameters(build_model("alexnet_cifar", (3, 32, 32), 10)) == 4_354_378


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bad_or_tiny_inputs_give_config_errors(name):
    """8x8 digits either work or are refused with a ConfigError; a wrong rank always is."""
    if name == "char_lstm":
        with pytest.raises(ConfigError):
            build_model(name, (1, 28, 28), 10)
        return
    with pytest.raises(ConfigError):
        build_model(name, (SEQ_LEN,), 10)
    try:
        model = build_model(name, (1, 8, 8), 10)
    except ConfigError:
        return
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="valid"):
        build_model("vgg16", (3, 32, 32), 10)
