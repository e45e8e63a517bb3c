"""Local training shared by every algorithm (a model's evaluation is hpcfl.models.evaluation).

A client's randomness in a round (batch order, dropout, augmentation) comes from generators keyed by
(seed, round, client), so its update is the same whichever rank trains it. Losses are accumulated on
the device and read once per client: no host synchronisation per batch. A model with BatchNorm skips
an epoch's last batch when it holds one sample (BatchNorm1d, or 2-d maps at 1x1, cannot train on it).
"""
import torch
import torch.nn.functional as F
from torch import nn

from hpcfl.config import TrainConfig
from hpcfl.data.augment import random_crop_flip, simclr_views
from hpcfl.seeding import torch_generator, torch_seed


class LocalTrainer:
    def __init__(self, cfg: TrainConfig, seed: int, normalization: tuple | None = None):
        """`normalization`: the data's per-channel (mean, std), which two-view augmentation needs."""
        self.cfg, self.seed, self.normalization = cfg, seed, normalization

    def optimizer(self, params) -> torch.optim.Optimizer:
        cfg = self.cfg
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

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

    def train(self, model: nn.Module, client, round: int, terms=(), epochs: range | None = None) -> dict[str, float]:
        """E local epochs of minibatch training on the client's data, the task loss being cross-entropy
        on the (term-adjusted) logits plus every term's term; returns the mean loss.

        If a term asks for two views (SupCon), each batch becomes two augmented views that go through
        the feature extractor together; the task loss and single-view terms see view 1."""
        part = (epochs.start,) if epochs is not None and epochs.start else ()     # a later part: fresh draws
        torch.manual_seed(torch_seed(self.seed, "client", round, client.id, *part))   # dropout & co.
        model.train()
        opt = self.optimizer(model.parameters())
        total = torch.zeros((), device=client.y.device)
        batches = self.batches(client.num_samples, round, client.id, client.y.device, epochs)
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            batches = [idx for idx in batches if len(idx) > 1]   # BatchNorm cannot train on one sample (1-d, 1x1 maps)
        two_views = any(term.views == 2 for term in terms)
        augment = (torch_generator(self.seed, "augment", round, client.id, *part, device=client.y.device)
                   if two_views or self.cfg.augment == "crop_flip" else None)
        for idx in batches:
            x, y = client.inputs(idx), client.y.index_select(0, idx)
            if two_views:
                x, second = simclr_views(x, augment, *self.normalization)
                both = model.features(torch.cat([x, second]))
                features, paired = both[:len(y)], torch.stack(both.split(len(y)), dim=1)
            else:
                if augment is not None:
                    x = random_crop_flip(x, augment)
                features = paired = model.features(x)
            logits = model.classifier(features)
            for term in terms:
                logits = term.logits(logits)
            loss = F.cross_entropy(logits, y)
            for term in terms:
                extra = term.loss(model, x, y, paired if term.views == 2 else features, logits)
                if extra is not None:
                    loss = loss + extra
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach() * y.shape[0]
        seen = sum(int(i.shape[0]) for i in batches)
        return {"train_loss": float(total) / max(seen, 1), "steps": float(len(batches))}
