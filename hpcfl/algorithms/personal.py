"""Personalised algorithms: every client keeps its own whole model (local-only, the ensemble,
FedClassAvg, FedProto), so clients may have different architectures (`model.architectures`).

A client's model is its persistent state, owned by "model", on its worker (on the CPU between rounds).
Where it starts is `init` (hpcfl.algorithms.initial): "independent", its own initialisation, held
as its state from set-up on; "shared", the run's initial model of its architecture (one shared copy
per architecture and worker) until it first trains. FedClassAvg (Algorithm 1 initialises each
client's w_k^0) and FedProto start independent by default, as their authors' code builds each
client's model anew, and so do local-only and the ensemble (clients that share nothing; FedMA's
authors' ensemble and FedClassAvg's local baseline).
There is no single global model: accuracy is personalised, each trained client's model on its own
held-out data, so the job needs data.local_test_ratio or data.validation_fraction.
"""
from hpcfl.algorithms.base import Algorithm, Tensors, Traits
from hpcfl.algorithms.initial import independent_init
from hpcfl.errors import ConfigError
from hpcfl.models import load_state
from hpcfl.terms import matching_terms


class Personal(Algorithm):
    traits = Traits(global_model=False, heterogeneous=True, batched=True)

    def __init__(self, params, setup):
        super().__init__(params, setup)
        self.initial: dict[str, Tensors] = {}       # architecture -> its initial model state

    @classmethod
    def check(cls, job):
        super().check(job)
        matching = matching_terms(job.algorithm.terms)
        if matching:
            raise ConfigError(f"algorithm '{cls.name}' has no global model to compute FedFM's anchors with: "
                              f"drop {matching} from algorithm.terms")
        if not cls.traits.client_test and job.data.local_test_ratio <= 0 and job.data.validation_fraction <= 0:
            raise ConfigError(f"algorithm '{cls.name}' has no global model: its accuracy is personalised, on each "
                              "client's own held-out data; set data.local_test_ratio (e.g. 0.3) or "
                              "data.validation_fraction (e.g. 0.2)")

    def evaluate(self, server_state, model, x, y, batch_size):
        return None

    def init_client_state(self, client, initial_model):
        if getattr(self.params, "init", "shared") == "independent":
            return {"model": independent_init(initial_model, self.setup.job.run.seed, client.id)}
        if client.architecture not in self.initial:
            self.initial[client.architecture] = {k: v.detach().clone().cpu()
                                                 for k, v in initial_model.state_dict().items()}
        return {}

    def own_model(self, client) -> Tensors:
        """The client's own model state (its architecture's initial model before it first trains)."""
        return client.state.get("model") or self.initial[client.architecture]

    def keep_model(self, client, model) -> None:
        client.state["model"] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def start_own(self, model, client, received: Tensors | None = None) -> Tensors:
        """Load the client's own model overwritten by the `received` tensors, but for its own BatchNorm
        layers (model.batchnorm = "local", as `start_from`); returns the state loaded."""
        start = {**self.own_model(client), **(received or {}), **client.state.get("bn", {})}
        load_state(model, start)
        return start
