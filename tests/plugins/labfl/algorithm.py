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
        moved = {n: server_state[f"model.{n}"] + self.params.step * (mean[n] - server_state[f"model.{n}"])
                 for n in self.setup.parameter_names}
        assign(server_state, "model.", moved)

    def server_metrics(self, server_state):
        return {"step": self.params.step}
