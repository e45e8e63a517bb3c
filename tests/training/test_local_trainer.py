"""LocalTrainer's own rules, each against what it must equal: a round trained in parts sees the batches
of one in one go, dropout draws depend on (seed, round, client) alone, the model trains in training
mode whatever mode it arrives in, BatchNorm models skip a one-sample last batch (others keep it), and the
task loss sees the logits as the terms adjust them; a term's loss that is not one number is named."""
import numpy as np
import pytest
import torch
from torch import nn

from hpcfl.algorithms.base import Client
from hpcfl.config import TrainConfig
from hpcfl.training import LocalTrainer

torch.set_num_threads(1)


def _client(n: int, seed: int = 0) -> Client:
    gen = torch.Generator().manual_seed(seed)
    return Client(3, torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen), np.ones(3))


class Net(nn.Module):
    def __init__(self, *middle: nn.Module):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(4, 6), *middle, nn.ReLU())
        self.classifier = nn.Linear(6, 3)

    def forward(self, x):
        return self.classifier(self.features(x))


def _net(*middle: nn.Module) -> Net:
    torch.manual_seed(0)
    return Net(*middle)


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_epochs_in_parts_see_the_batches_of_one_go_and_later_epochs_continue_the_draws():
    trainer = LocalTrainer(TrainConfig(local_epochs=3, batch_size=4), seed=5)
    whole = trainer.batches(10, 2, 7, "cpu")
    assert [len(b) for b in whole] == [4, 4, 2] * 3
    for epoch in range(3):
        assert all(torch.equal(a, b) for a, b in zip(trainer.batches(10, 2, 7, "cpu", range(epoch, epoch + 1)),
                                                     whole[3 * epoch:3 * epoch + 3], strict=True))
    assert all(torch.equal(torch.sort(b).values, torch.arange(10)) for b in
               (torch.cat(whole[i:i + 3]) for i in (0, 3, 6)))                 # each epoch is a permutation
    later = trainer.batches(10, 2, 7, "cpu", range(3, 5))                     # past the local epochs (FedMA)
    assert len(later) == 6 and not torch.equal(torch.cat(later[:3]), torch.cat(whole[6:]))
    assert all(torch.equal(a, b) for a, b in zip(trainer.batches(10, 2, 7, "cpu", range(0, 5)), whole + later,
                                                 strict=True))


def test_dropout_draws_depend_on_seed_round_and_client_only():
    trainer, client = LocalTrainer(TrainConfig(batch_size=4, lr=0.1), seed=1), _client(12)

    def trained(global_seed: int, round: int) -> list[torch.Tensor]:
        model = _net(nn.Dropout(0.5))
        torch.manual_seed(global_seed)                 # whatever ran before must not matter
        trainer.train(model, client, round)
        return _weights(model)

    same = trained(11, 0)
    assert all(torch.equal(a, b) for a, b in zip(same, trained(99, 0), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(same, trained(11, 1), strict=True))


def test_a_model_that_arrives_in_eval_mode_trains_in_training_mode():
    trainer, client = LocalTrainer(TrainConfig(batch_size=4, lr=0.1), seed=1), _client(12)
    as_given, evaluated = _net(nn.Dropout(0.5)), _net(nn.Dropout(0.5))
    evaluated.eval()
    for model in (as_given, evaluated):
        trainer.train(model, client, 0)
    assert evaluated.training
    assert all(torch.equal(a, b) for a, b in zip(_weights(as_given), _weights(evaluated), strict=True))


@pytest.mark.parametrize("n, steps_bn, steps_plain", [(9, 2, 3), (10, 3, 3)])
def test_batchnorm_models_skip_a_one_sample_last_batch_and_other_models_keep_it(n, steps_bn, steps_plain):
    trainer, client = LocalTrainer(TrainConfig(batch_size=4, lr=0.1), seed=1), _client(n)
    with_bn = trainer.train(_net(nn.BatchNorm1d(6)), client, 0)
    plain = trainer.train(_net(), client, 0)
    assert (with_bn["steps"], plain["steps"]) == (steps_bn, steps_plain)

    # the loss is the mean over the samples trained on: the skipped sample counts for nothing
    model = _net(nn.BatchNorm1d(6))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(0)
    total, seen = 0.0, 0
    for idx in trainer.batches(n, 0, client.id, "cpu"):
        if len(idx) < 2:
            continue
        loss = nn.functional.cross_entropy(model(client.x[idx]), client.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total, seen = total + loss.item() * len(idx), seen + len(idx)
    assert with_bn["train_loss"] == pytest.approx(total / seen, rel=1e-6)


def test_a_terms_adjusted_logits_are_what_the_task_loss_sees():
    """FedRS scales each class's logit by its share of the client's labels; the trainer must train
    on those logits, as a hand loop does."""
    from hpcfl.terms.logits import RestrictedSoftmax

    trainer, client = LocalTrainer(TrainConfig(batch_size=4, lr=0.1), seed=1), _client(12)
    client.class_counts = np.array([6.0, 0.0, 2.0])
    model, by_hand = _net(), _net()
    term = RestrictedSoftmax(RestrictedSoftmax.Params(alpha=0.25))
    term.start(model, client, 0, {})
    trainer.train(model, client, 0, terms=[term])
    term.start(by_hand, client, 0, {})
    opt = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    for idx in trainer.batches(12, 0, client.id, "cpu"):
        loss = nn.functional.cross_entropy(term.logits(by_hand(client.x[idx])), client.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(_weights(model), _weights(by_hand), strict=True))
    plain = _net()
    trainer.train(plain, client, 0)
    assert not all(torch.allclose(a, b, atol=1e-3) for a, b in zip(_weights(model), _weights(plain), strict=True))


def test_bf16_trains_through_bfloat16_matmuls_with_fp32_weights():
    """train.precision = "bf16": the layers compute from inputs and weights rounded to bfloat16, the loss
    and the SGD step in fp32 (a hand loop with the casts written out), and the weights stay fp32."""
    cfg = {"batch_size": 4, "lr": 0.1, "momentum": 0.9}
    trainer, client = LocalTrainer(TrainConfig(precision="bf16", **cfg), seed=1), _client(12)
    model, by_hand = _net(), _net()
    trainer.train(model, client, 0)

    def linear(layer, x):
        return nn.functional.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16())

    opt = torch.optim.SGD(by_hand.parameters(), lr=0.1, momentum=0.9)
    for idx in trainer.batches(12, 0, client.id, "cpu"):
        hidden = linear(by_hand.features[0], client.x[idx]).relu()
        loss = nn.functional.cross_entropy(linear(by_hand.classifier, hidden).float(), client.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(_weights(model), _weights(by_hand), strict=True))
    fp32 = _net()
    LocalTrainer(TrainConfig(**cfg), seed=1).train(fp32, client, 0)
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(_weights(model), _weights(fp32), strict=True))


def test_crop_flip_pads_normalised_images_with_black_pixels():
    """train.augment = "crop_flip" as torchvision's RandomCrop(padding=4) before Normalize: the padding
    is pixel 0, which the data's normalisation maps to -mean / std per channel."""
    stats = ((0.5, 0.25), (0.25, 0.5))
    trainer = LocalTrainer(TrainConfig(augment="crop_flip"), seed=0, normalization=stats)
    x = torch.full((64, 2, 8, 8), 3.0)
    out, second = trainer.views(x, torch.Generator().manual_seed(1), terms=())
    assert second is None
    assert set(out[:, 0].unique().tolist()) == {3.0, -2.0} and set(out[:, 1].unique().tolist()) == {3.0, -0.5}
    reflecting = LocalTrainer(TrainConfig(augment="crop_flip_reflect"), seed=0, normalization=stats)
    assert set(reflecting.views(x, torch.Generator().manual_seed(1), terms=())[0].unique().tolist()) == {3.0}


@pytest.mark.parametrize("returned, what", [(lambda f: f.pow(2).sum(dim=1), r"Tensor \(4,\)"),
                                            (lambda f: 0.5, r"float \(\)")])
def test_a_term_whose_loss_is_not_one_number_tensor_is_named(returned, what):
    """A vector would fail in backward with a message about implicit gradients; a float would add a
    constant that trains nothing: both are a plug-in's mistake, named with the term."""
    from hpcfl.terms import Term

    class Wrong(Term):
        name = "wrong"

        def loss(self, model, x, y, features, logits):
            return returned(features)

    trainer, client = LocalTrainer(TrainConfig(batch_size=4, lr=0.1), seed=1), _client(8)
    with pytest.raises(TypeError, match=rf"loss term 'wrong' returned {what} from `loss`: a term returns the "
                                        r"batch's loss as a 0-dim tensor"):
        trainer.train(_net(), client, 0, terms=[Wrong(None)])
