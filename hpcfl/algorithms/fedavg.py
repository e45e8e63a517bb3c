"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, Algorithm 1: each sampled client k starts from the global model w, runs E local
epochs of minibatch SGD, and the server sets w <- sum_k n_k w_k / sum_k n_k over the cohort.

Every state_dict tensor (BatchNorm running statistics included) is averaged the same way.
"""
import torch

from hpcfl.algorithms.base import ONE, WEIGHT, Algorithm, Phase, load_state, weighted_model_layout


class FedAvg(Algorithm):
    name = "fedavg"

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.phase = Phase("train", downlink={"model": setup.model_layout}, uplink={"model": weighted_model_layout(setup)})

    def plan(self, round):
        return [self.phase]

    def downlink(self, phase, round, server_state):
        return {"model": self.global_state(server_state)}

    def client_update(self, phase, round, client, downlink, model, trainer):
        load_state(model, downlink["model"])
        metrics = trainer.train(model, client, round)
        return {"model": ({**model.state_dict(), WEIGHT: ONE}, float(client.num_samples))}, metrics

    def aggregate(self, phase, round, server_state, uplink):
        sums = uplink["model"]
        total = float(sums[WEIGHT])
        if total == 0.0:          # nobody trained: keep the model
            return
        for name, value in sums.items():
            if name != WEIGHT:
                target = server_state[f"model.{name}"]
                target.copy_((value / total).to(target.dtype) if target.is_floating_point()
                             else torch.round(value / total).to(target.dtype))
