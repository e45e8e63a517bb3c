"""FedAvg with a server step size: the global model moves `step` of the way to the clients' mean."""
from dataclasses import dataclass

from hpcfl import FedAvg, Traits, assign


class HalfStep(FedAvg):
    name = "half_step"
    traits = Traits(stateless=True)

    @dataclass(frozen=True)
    class Params:
        step: float = 0.5

    def update_parameters(self, server_state, mean, uplink):
        model = server_state["model"]
        assign(model, {n: model[n] + self.params.step * (mean[n] - model[n]) for n in self.setup.parameter_names})

    def server_metrics(self, server_state):
        return {"step": self.params.step}
