"""Local training shared by every algorithm (a model's evaluation is hpcfl.models.evaluation).

A client's randomness in a round (batch order, dropout, augmentation) comes from generators keyed by
(seed, round, client), so its update is the same whichever rank trains it. Losses are accumulated on
the device and read once per client: no host synchronisation per batch. A model with BatchNorm skips
an epoch's last batch when it holds one sample (BatchNorm1d, or 2-d maps at 1x1, cannot train on it;
train.batch_size = 1 is refused with BatchNorm, and a client of one sample trains no step).
With train.precision = "bf16" the loss is computed under bfloat16 autocast (torch's op lists: matmuls
and convolutions in bf16, reductions and the cross-entropy in fp32); parameters, gradients and the
optimizer stay fp32, and bf16's fp32 exponent range needs no loss scaling.
"""
import torch
import torch.nn.functional as F
from torch import nn

from hpcfl.config import TrainConfig
from hpcfl.data.augment import random_crop_flip, simclr_views
from hpcfl.seeding import torch_generator, torch_seed


class LocalTrainer:
    def __init__(self, cfg: TrainConfig, seed: int, normalization: tuple | None = None):
        """`normalization`: the data's per-channel (mean, std), which augmentation needs (the colour ops
        work on pixels; the crop pads with black ones)."""
        self.cfg, self.seed, self.normalization = cfg, seed, normalization

    def optimizer(self, params) -> torch.optim.Optimizer:
        cfg = self.cfg
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def autocast(self, device: torch.device) -> torch.autocast:
        """The context a batch's loss is computed in: bfloat16 autocast with train.precision = "bf16"."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")

    def batches(self, n: int, round: int, client: int, device, epochs: range | None = None) -> list[torch.Tensor]:
        """Index batches for the local epochs `epochs` (default: all), drawn from the (seed, round,
        client) generator, so a round trained in two parts sees the batches of one in one go; epochs
        past the local ones continue the draws (FedMA's retraining)."""
        gen = torch_generator(self.seed, "batches", round, client)
        size = self.cfg.batch_size
        out = []
        for epoch in range(self.cfg.local_epochs if epochs is None else max(self.cfg.local_epochs, epochs.stop)):
            order = torch.randperm(n, generator=gen)
            if epochs is None or epoch in epochs:
                out += list(order.to(device).split(size))
        return out

    def plan(self, model: nn.Module, client, round: int, device, epochs: range | None = None) -> list[torch.Tensor]:
        """The client's index batches this round (`batches`), less a one-sample batch on a model with
        BatchNorm (which cannot train on it: 1-d, or 1x1 maps)."""
        batches = self.batches(client.num_samples, round, client.id, device, epochs)
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            batches = [idx for idx in batches if len(idx) > 1]
        return batches

    def augmenter(self, client, round: int, terms, epochs: range | None = None) -> torch.Generator | None:
        """The client's augmentation generator this round (a later part of it: fresh draws), if it augments."""
        part = (epochs.start,) if epochs is not None and epochs.start else ()
        if any(term.views == 2 for term in terms) or self.cfg.augment != "none":
            return torch_generator(self.seed, "augment", round, client.id, *part, device=client.y.device)
        return None

    def views(self, x: torch.Tensor, augment: torch.Generator | None, terms) -> tuple:
        """A batch as the loss takes it: two augmented views if a term asks for them (SupCon), else
        the batch, cropped and flipped with train.augment = "crop_flip" (padded with black pixels) or
        "crop_flip_reflect" (with the image's mirrored border)."""
        if any(term.views == 2 for term in terms):
            return simclr_views(x, augment, *self.normalization)
        if augment is None:
            return x, None
        mean, std = self.normalization or (None, None)
        black = None if mean is None else [-m / sd for m, sd in zip(mean, std, strict=True)]
        return random_crop_flip(x, augment, fill=black, reflect=self.cfg.augment == "crop_flip_reflect"), None

    def train(self, model: nn.Module, client, round: int, terms=(), epochs: range | None = None) -> dict[str, float]:
        """E local epochs of minibatch training on the client's data (`batch_loss` each batch); returns
        the mean loss."""
        part = (epochs.start,) if epochs is not None and epochs.start else ()     # a later part: fresh draws
        torch.manual_seed(torch_seed(self.seed, "client", round, client.id, *part))   # dropout & co.
        model.train()
        opt = self.optimizer(model.parameters())
        total = torch.zeros((), device=client.y.device)
        batches = self.plan(model, client, round, client.y.device, epochs)
        augment, precision = self.augmenter(client, round, terms, epochs), self.autocast(client.y.device)
        for idx in batches:
            y = client.y.index_select(0, idx)
            with precision:
                loss = batch_loss(model, terms, *self.views(client.inputs(idx), augment, terms), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach() * y.shape[0]
        seen = sum(int(i.shape[0]) for i in batches)
        return {"train_loss": float(total) / max(seen, 1), "steps": float(len(batches))}


def batch_loss(model: nn.Module, terms, x: torch.Tensor, second: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """One batch's loss: cross-entropy on the (term-adjusted) logits plus every term's term. With a
    second view (SupCon) both views go through the feature extractor together; the task loss and
    single-view terms see view 1, a two-view term both as N x 2 x d. The sequential and the batched
    trainer (hpcfl.training.batched, under vmap) both compute it here."""
    if second is None:
        features = paired = model.features(x)
    else:
        both = model.features(torch.cat([x, second]))
        features, paired = both[:len(y)], torch.stack(both.split(len(y)), dim=1)
    logits = model.classifier(features)
    for term in terms:
        logits = term.logits(logits)
    loss = F.cross_entropy(logits, y)
    for term in terms:
        extra = term.loss(model, x, y, paired if term.views == 2 else features, logits)
        if extra is not None:
            if not (isinstance(extra, torch.Tensor) and extra.dim() == 0):
                raise TypeError(f"loss term '{term.name}' returned {type(extra).__name__} "
                                f"{tuple(getattr(extra, 'shape', ()))} from `loss`: a term returns the batch's "
                                "loss as a 0-dim tensor (or None: no loss)")
            loss = loss + extra
    return loss
