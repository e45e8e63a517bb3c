"""Model registry: every model builds, splits into features/classifier, is seed-deterministic, and the
FedMA models have the papers' exact parameter shapes; the model options ([model] params)."""
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from hpcfl.algorithms.base import Client
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.models import MODELS, build_model, count_parameters, model_options
from hpcfl.models.common import DEFAULT_HEAD, HeadOptions, ReluLinear
from hpcfl.models.evaluation import evaluate
from hpcfl.models.vision import ResNetOptions
from hpcfl.params import model_params
from hpcfl.runtime.build import build_models
from hpcfl.terms import adapt_model, term_params
from hpcfl.training import LocalTrainer

torch.set_num_threads(1)

IMAGE_MODELS = ["fmnist_cnn", "fmnist_cnn_narrow", "fmnist_cnn_wide", "fmnist_cnn_bn", "tcnn", "lenet", "vgg9",
                "resnet18", "resnet50", "shufflenetv2", "googlenet", "alexnet_cifar"]
SEQ_LEN, VOCAB = 20, 80

FEATURE_WIDTH = {
    "fmnist_cnn": 128, "fmnist_cnn_narrow": 128, "fmnist_cnn_wide": 128, "fmnist_cnn_bn": 128, "tcnn": 512,
    "lenet": 500, "vgg9": 512, "char_lstm": 256, "resnet18": 512, "resnet50": 2048, "shufflenetv2": 512,
    "googlenet": 512, "alexnet_cifar": 512,
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
        states.append(build_model(name, in_shape, num_classes).state_dict())
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


def _relu_then_pool(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`model`'s output computed in the papers' order: each ReLU before its max-pool."""
    if hasattr(model, "conv"):                          # fmnist_cnn*, alexnet_cifar: a Sequential
        layers = list(model.conv)
        for i, layer in enumerate(layers[:-1]):
            if isinstance(layer, nn.MaxPool2d) and isinstance(layers[i + 1], nn.ReLU):
                layers[i], layers[i + 1] = layers[i + 1], layer
        return model.classifier(model.fc(nn.Sequential(*layers)(x)))
    pool, relu = nn.functional.max_pool2d, nn.functional.relu
    if hasattr(model, "conv6"):                          # vgg9: dropout after the pools
        x = pool(relu(model.conv2(relu(model.conv1(x)))), 2)
        x = model.drop5(pool(relu(model.conv4(relu(model.conv3(x)))), 2))
        x = model.drop6(pool(relu(model.conv6(relu(model.conv5(x)))), 2))
        return model.classifier(model.drop8(relu(model.fc8(relu(model.fc7(x.flatten(1)))))))
    x = pool(relu(model.conv2(pool(relu(model.conv1(x)), 2))), 2)     # tcnn, lenet
    return model.classifier(relu(model.fc1(x.flatten(1))))


@pytest.mark.parametrize("name,shape", [("fmnist_cnn_bn", (1, 28, 28)), ("lenet", (1, 28, 28)),
                                        ("vgg9", (3, 32, 32)), ("alexnet_cifar", (3, 32, 32))])
def test_pooling_before_relu_gives_the_papers_values_and_gradients_bit_for_bit(name, shape):
    torch.manual_seed(0)
    model, x = build_model(name, shape, 10), torch.randn(8, *shape)
    model.train()                           # BatchNorm in training mode: order relative to it matters
    grads = []
    for forward in (model, lambda x: _relu_then_pool(model, x)):
        model.zero_grad()
        torch.manual_seed(1)                    # dropout (vgg9, alexnet) draws the same masks
        out = forward(x)
        out.square().sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (ours, ours_grads), (paper, paper_grads) = grads
    assert torch.equal(ours, paper) and all(map(torch.equal, ours_grads, paper_grads))
    assert (ours_grads[0] != 0).any()


def test_vgg9_matches_fedma_table4_exactly():
    model = build_model("vgg9", (3, 32, 32), 10)
    expected = {our_name(k): to_torch_layout(v) for k, v in VGG9_TABLE4.items()}
    assert param_shapes(model) == expected
    assert count_parameters(model) == 3_491_530          # FedMA Table 7, "original" parameter count
    assert not has_norm_layer(model)
    assert not any(k.endswith(("running_mean", "running_var")) for k in model.state_dict())
    dropouts = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts == [0.05, 0.10, 0.10]
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 6 and {(m.stride, m.padding) for m in convs} == {((1, 1), (1, 1))}   # size-preserving
    with pytest.raises(ConfigError, match="at least 8x8 px"):       # three 2x2 pools leave nothing of 7 px
        build_model("vgg9", (3, 7, 7), 10)


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
    assert build_model("char_lstm", (1,), VOCAB)(torch.zeros(2, 1, dtype=torch.int64)).shape == (2, VOCAB)
    with pytest.raises(ConfigError, match=r"in_shape must be \(seq_len,\), got \(0,\)"):
        build_model("char_lstm", (0,), VOCAB)


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
    # fmnist_cnn by hand: conv 1->16 (5x5) 416, conv 16->32 12,832, the 128-d layer on 32 maps of side s,
    # 10 classes 1,290. 28 px, unpadded: 28 -> 24 -> 12 -> 8 -> 4, 512 inputs, 65,664.
    assert count_parameters(build_model("fmnist_cnn", (1, 28, 28), 10)) == 416 + 12_832 + 65_664 + 1_290
    assert count_parameters(build_model("fmnist_cnn_bn", (1, 28, 28), 10)) == 80_554     # + 2 (16 + 32 + 128)
    # 20 px, unpadded: 20 -> 16 -> 8 -> 4 -> 2; 8 px (digits), padded by 2: 8 -> 8 -> 4 -> 4 -> 2: 128 inputs
    for side in (20, 8):
        assert count_parameters(build_model("fmnist_cnn", (1, side, side), 10)) == 416 + 12_832 + 16_512 + 1_290


@pytest.mark.parametrize("name, smallest", [("fmnist_cnn", 4), ("tcnn", 16)])
def test_the_smallest_images_a_model_takes_and_the_message_below(name, smallest):
    """fmnist_cnn pads small inputs: 4 px -> 4 -> 2 -> 2 -> 1; tcnn does not: 16 px -> 12 -> 6 -> 2 -> 1."""
    model = build_model(name, (1, smallest, smallest), 10)
    assert model(torch.randn(2, 1, smallest, smallest)).shape == (2, 10)
    with pytest.raises(ConfigError, match=f"needs images at least {smallest}x{smallest} px"):
        build_model(name, (1, smallest - 1, smallest - 1), 10)


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"char_lstm"}))
def test_non_square_images_work_either_way_round_or_are_refused_by_their_short_side(name):
    """Height and width are read apart: a wide and a tall image both build a model that runs, the
    8-px side decides the small-input padding (fmnist_cnn) and the size check, whichever side it is."""
    for shape in ((3, 32, 40), (3, 40, 32), (1, 8, 28), (1, 28, 8)):
        try:
            model = build_model(name, shape, 10)
        except ConfigError as err:
            assert "needs images at least 16x16 px" in str(err) and min(shape[1:]) == 8, (name, shape)
            continue
        assert model(torch.randn(2, *shape)).shape == (2, 10), (name, shape)
        assert all(module.training for module in model.modules())    # the size probe ran in eval, then put back
    if name.startswith("fmnist_cnn"):
        build_model(name, (1, 8, 28), 10)
        with pytest.raises(ConfigError, match="at least 4x4 px"):
            build_model(name, (1, 3, 28), 10)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bad_or_tiny_inputs_give_config_errors(name):
    """8x8 digits either work or are refused with a ConfigError; a wrong rank always is, naming the model
    the job picked."""
    if name == "char_lstm":
        with pytest.raises(ConfigError):
            build_model(name, (1, 28, 28), 10)
        return
    with pytest.raises(ConfigError, match=f"model '{name}' takes images"):
        build_model(name, (SEQ_LEN,), 10)
    try:
        model = build_model(name, (1, 8, 8), 10)
    except ConfigError:
        return
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="valid"):
        build_model("vgg16", (3, 32, 32), 10)


# -- model options ([model] params) ----------------------------------------------------------------
PREACTIVATION = [(name, HeadOptions(preactivation=True)) for name in
                 ("fmnist_cnn", "fmnist_cnn_bn", "tcnn", "lenet", "vgg9", "alexnet_cifar", "shufflenetv2", "googlenet")]
PREACTIVATION.append(("resnet18", ResNetOptions(preactivation=True, feature_layer=64)))


@pytest.mark.parametrize("name, options", PREACTIVATION, ids=[n for n, _ in PREACTIVATION])
def test_preactivation_moves_the_last_relu_into_the_classifier(name, options):
    """Same seed, same weights and the same function; features(x) stops before the ReLU, so it can be
    negative; the classifier is still one Linear named `classifier` (what algorithms select)."""
    plain_options = ResNetOptions(feature_layer=64) if name == "resnet18" else None
    torch.manual_seed(1)
    plain = build_model(name, (3, 32, 32), 10, plain_options).eval()
    torch.manual_seed(1)
    pre = build_model(name, (3, 32, 32), 10, options).eval()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), pre.state_dict().values(), strict=True))
    assert plain.state_dict().keys() == pre.state_dict().keys()
    assert [n for n, _ in pre.named_parameters() if n.startswith("classifier.")] == ["classifier.weight",
                                                                                      "classifier.bias"]
    assert isinstance(pre.classifier, ReluLinear) and type(plain.classifier) is nn.Linear
    assert pre.classifier.in_features == (64 if name == "resnet18" else FEATURE_WIDTH[name])
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        features = pre.features(x)
        assert (features < 0).any()
        torch.testing.assert_close(pre.classifier(features), pre(x))
        torch.testing.assert_close(pre(x), plain(x))
        torch.testing.assert_close(features.relu(), plain.features(x))


def test_the_shared_default_head_options_cannot_be_changed_by_one_model():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_HEAD.preactivation = True


def test_moon_head_refuses_a_preactivation_classifier():
    model = build_model("fmnist_cnn", (1, 8, 8), 10, HeadOptions(preactivation=True))
    with pytest.raises(ConfigError, match="ReluLinear"):
        adapt_model(model, {"moon": term_params("moon", {})}, seed=0)


def test_resnet_options_change_the_counts_by_hand():
    """torchvision's ResNet-18 without fc: 11,176,512 parameters, of which conv1 (64 x 3 x 7 x 7) 9,408."""
    head = 512 * 10 + 10
    counts = {ResNetOptions(stem="imagenet"): 11_176_512 + head,
              ResNetOptions(): 11_176_512 - 9_408 + 64 * 3 * 3 * 3 + head,                     # 11,173,962 as above
              ResNetOptions(feature_layer=512, preactivation=True): 11_173_962 + 512 * 512 + 512}
    for options, expected in counts.items():
        assert count_parameters(build_model("resnet18", (3, 32, 32), 10, options)) == expected
    one_channel = build_model("resnet18", (1, 28, 28), 10, ResNetOptions(stem="imagenet"))
    assert count_parameters(one_channel) == 11_176_512 - 9_408 + 64 * 7 * 7 + head
    assert one_channel.backbone.conv1.kernel_size == (7, 7) and one_channel.backbone.conv1.stride == (2, 2)
    wide = build_model("resnet18", (3, 32, 32), 10, ResNetOptions(feature_layer=256))
    assert wide.features(torch.randn(2, 3, 32, 32)).min() >= 0 and wide.classifier.in_features == 256


@pytest.mark.parametrize("in_shape, cifar, imagenet", [((3, 32, 32), 4, 1), ((1, 28, 28), 4, 1), ((3, 64, 64), 8, 2)])
def test_imagenet_stem_downsamples_by_4_before_layer1(in_shape, cifar, imagenet):
    """CIFAR stem: 32 -> 32 (layer1) -> 16 -> 8 -> 4; ImageNet: conv stride 2 and max-pool stride 2 first."""
    sides = {}
    for stem in ("cifar", "imagenet"):
        model = build_model("resnet18", in_shape, 10, ResNetOptions(stem=stem)).eval()
        seen = []
        model.backbone.layer4.register_forward_hook(lambda m, i, out, seen=seen: seen.append(out.shape))
        with torch.no_grad():
            assert model.features(torch.randn(2, *in_shape)).shape == (2, 512)
        sides[stem] = seen[0][-2:]
    assert sides == {"cifar": (cifar, cifar), "imagenet": (imagenet, imagenet)}


def test_model_params_are_validated_against_every_architecture():
    def job(params, **model):
        return job_from_dict({"algorithm": {"name": "local_only"}, "data": {"local_test_ratio": 0.3},
                              "model": {"params": params, **model}})

    assert job({"stem": "imagenet"}, name="resnet18").model.params == {"stem": "imagenet"}
    bad = [({"feature_layers": 512}, r"model.params.feature_layers is not an option of model 'resnet18'; "
                                      r"its options: \['preactivation', 'feature_layer', 'stem'\]"),
           ({"preactivation": 1}, r"model.params.preactivation must be of type bool"),
           ({"stem": "tiny"}, r"stem = 'tiny'; choose 'cifar' or 'imagenet'"),
           ({"feature_layer": -1}, r"feature_layer = -1 must be >= 0"),
           ({"preactivation": True}, r"preactivation = true needs feature_layer > 0")]
    for params, message in bad:
        with pytest.raises(ConfigError, match=message):
            job(params, name="resnet18")
    with pytest.raises(ConfigError, match=r"model.params.preactivation is not an option of model 'char_lstm'"):
        job({"preactivation": True}, name="char_lstm")
    mixed = ["resnet18", "fmnist_cnn"]
    with pytest.raises(ConfigError, match=r"model.params.stem is not an option of model 'fmnist_cnn'.*"
                                          r"model.params.resnet18 = \{stem = ...\}"):
        job({"stem": "imagenet"}, architectures=mixed)
    with pytest.raises(ConfigError, match=r"model.params.resnet18.feature_layer must be of type int"):
        job({"resnet18": {"feature_layer": "512"}}, architectures=mixed)
    with pytest.raises(ConfigError, match=r"model.params.fmnist_cnn.stem is not an option of model 'fmnist_cnn'"):
        job({"fmnist_cnn": {"stem": "imagenet"}}, architectures=mixed)


def test_per_architecture_options_reach_their_models():
    """A key for all, a table for one: ResNet-18 with a 128-d extra layer beside the 128-d FMNIST CNN."""
    config = job_from_dict({"algorithm": {"name": "local_only"}, "data": {"local_test_ratio": 0.3},
                            "model": {"architectures": ["resnet18", "fmnist_cnn"],
                                      "params": {"preactivation": True, "resnet18": {"feature_layer": 128}}}})
    assert model_params(config.model.params, {a: model_options(a) for a in config.architectures}) == {
        "resnet18": ResNetOptions(preactivation=True, feature_layer=128), "fmnist_cnn": HeadOptions(preactivation=True)}
    models = build_models(config, (1, 28, 28), 10, torch.device("cpu"))
    assert all(isinstance(m.classifier, ReluLinear) and m.classifier.in_features == 128 for m in models.values())


def test_batches_of_one_sample_are_refused_for_a_model_with_batchnorm():
    one = {"train": {"batch_size": 1}}
    build_models(job_from_dict({**one, "model": {"name": "fmnist_cnn"}}), (1, 28, 28), 10, torch.device("cpu"))
    with pytest.raises(ConfigError, match="train.batch_size = 1, but the model has BatchNorm layers"):
        build_models(job_from_dict({**one, "model": {"name": "fmnist_cnn_bn"}}), (1, 28, 28), 10, torch.device("cpu"))


def _digits_client(cid, samples):
    data = load_dataset("digits", resolve_data_root(None))
    idx = torch.from_numpy(np.random.default_rng(cid).permutation(len(data.train_y))[:samples])
    y = data.train_y[idx]
    return Client(cid, data.train_x[idx], y, np.bincount(y.numpy(), minlength=10)), data


def test_fmnist_cnn_bn_has_batchnorm_and_trains():
    model = build_model("fmnist_cnn_bn", (1, 28, 28), 10)
    norms = [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert norms == ["BatchNorm2d", "BatchNorm2d", "BatchNorm1d"]
    assert count_parameters(model) == count_parameters(build_model("fmnist_cnn", (1, 28, 28), 10)) + 2 * (16 + 32 + 128)
    assert torch.equal(model.conv[1].running_var, torch.ones(16))        # building probes in eval mode
    torch.manual_seed(0)
    model = build_model("fmnist_cnn_bn", (1, 8, 8), 10)
    me, data = _digits_client(0, 321)             # 321 = 10 x 32 + 1: every epoch ends with a batch of one
    cfg = job_from_dict({"train": {"batch_size": 32, "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4,
                                   "local_epochs": 5}}).train
    before = evaluate(model, data.test_x, data.test_y, 10, 1000)["acc"]
    metrics = LocalTrainer(cfg, seed=0).train(model, me, 0)
    assert metrics["steps"] == 50                                        # the single-sample batches skipped
    assert model.conv[1].num_batches_tracked == 50
    after = evaluate(model, data.test_x, data.test_y, 10, 1000)["acc"]
    assert after > 0.8 and after > before + 0.5, (before, after)


def _pooled_sides(model, module_type, in_shape) -> list[int]:
    """The side of every `module_type` module's output, in order, for one image of `in_shape`."""
    sides = []
    for module in model.modules():
        if isinstance(module, module_type):
            module.register_forward_hook(lambda m, i, out: sides.append(out.shape[-1]))
    with torch.no_grad():
        model.eval()(torch.randn(1, *in_shape))
    return sides


@pytest.mark.parametrize("in_shape, sides", [((3, 32, 32), [16, 8, 4]), ((1, 28, 28), [14, 7, 3])])
def test_alexnet_pools_to_the_documented_sides(in_shape, sides):
    assert _pooled_sides(build_model("alexnet_cifar", in_shape, 10), nn.MaxPool2d, in_shape) == sides


def _stem(conv) -> tuple:
    return conv.kernel_size, conv.stride, conv.padding, conv.bias is None


def test_the_cifar_stems_are_3x3_stride_1_without_max_pool_and_every_net_ends_at_4x4():
    """vision's docstring: a 32x32 image reaches layer4 / stage4 / inception5 at 4x4."""
    last = {"resnet18": "layer4", "shufflenetv2": "stage4", "googlenet": "inception5b"}
    stems = {"resnet18": lambda m: m.backbone.conv1, "shufflenetv2": lambda m: m.backbone.conv1[0],
             "googlenet": lambda m: m.backbone.conv1.conv}
    for name, block in last.items():
        model = build_model(name, (3, 32, 32), 10)
        assert _stem(stems[name](model)) == ((3, 3), (1, 1), (1, 1), True), name
        assert isinstance(getattr(model.backbone, "maxpool" if name != "googlenet" else "maxpool1"), nn.Identity)
        seen = []
        getattr(model.backbone, block).register_forward_hook(lambda m, i, out, seen=seen: seen.append(out.shape[-2:]))
        with torch.no_grad():
            model.eval().features(torch.randn(1, 3, 32, 32))
        assert seen == [(4, 4)], name


def test_a_replaced_stem_is_initialised_as_torchvision_initialises_that_model_and_its_own_is_kept():
    from torchvision import models as tvm

    torch.manual_seed(0)
    resnet = build_model("resnet18", (3, 32, 32), 10)          # kaiming normal, fan out: std sqrt(2 / (64 * 9))
    assert resnet.backbone.conv1.weight.std().item() == pytest.approx((2 / 576) ** 0.5, rel=0.1)
    torch.manual_seed(0)
    googlenet = build_model("googlenet", (3, 32, 32), 10)      # truncated normal, mean 0, std 0.01, everywhere
    for weight in (googlenet.backbone.conv1.conv.weight, googlenet.backbone.inception3a.branch1.conv.weight):
        assert weight.std().item() == pytest.approx(0.01, rel=0.1) and abs(weight.mean().item()) < 0.002
    torch.manual_seed(0)
    imagenet = build_model("resnet18", (3, 32, 32), 10, ResNetOptions(stem="imagenet"))
    torch.manual_seed(0)
    assert torch.equal(imagenet.backbone.conv1.weight, tvm.resnet18(weights=None).conv1.weight)   # not replaced
    assert isinstance(imagenet.backbone.maxpool, nn.MaxPool2d)
    one_channel = build_model("resnet18", (1, 28, 28), 10, ResNetOptions(stem="imagenet"))
    assert _stem(one_channel.backbone.conv1) == ((7, 7), (2, 2), (3, 3), True)
