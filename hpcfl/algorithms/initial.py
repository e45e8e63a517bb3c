"""Where a client's first local training starts: `init = "shared"`, the run's one initial model, or
`init = "independent"`, a model of its own.

FedMA (Wang et al., ICLR 2020, Appendix A) and its authors' code (IBM/FedMA main.py: `init_models`
draws one network per client, `local_train` trains each from its own) start every client from its
own random initialisation, FedMA and the baselines it is compared with alike (FedAvg and FedProx
average those local models, then communicate; the ensemble votes with them). FedMA, FedAvg with its
presets (FedProx, ...) and local_only / ensemble take the option; each algorithm's docstring says
what it does with it.

A client's own initialisation is drawn from the (run.seed, "init", client) generator (hpcfl.seeding),
never the rank, by every module's own `reset_parameters`, on a CPU copy of the run's freshly
initialised model: the same numbers on 1 process and N ranks, CPU or GPU, and the same for a client
whichever algorithm draws it.
"""
import copy
from dataclasses import dataclass

import torch
from torch import nn

from hpcfl.seeding import torch_seed


@dataclass(frozen=True)
class InitParams:
    """The `init` parameter; as a base of another Params (listed first) it checks itself, then calls
    the other's __post_init__."""

    init: str = "shared"        # "independent": each client's first local training starts from its own init

    def __post_init__(self):
        if self.init not in ("shared", "independent"):
            raise ValueError(f"init = {self.init!r}; choose 'shared' (the run's one initial model) or "
                             "'independent' (each client its own, FedMA Appendix A)")
        after = getattr(super(), "__post_init__", None)
        if after is not None:
            after()


def with_init(params: type) -> type:
    """A preset's Params: its term's `params` plus `init`."""
    return dataclass(frozen=True)(type(params.__name__, (InitParams, params), {"__module__": params.__module__}))


def independent_init(model: nn.Module, seed: int, client: int) -> dict[str, torch.Tensor]:
    """The state (on the CPU) of `model`, a freshly initialised model left unchanged, initialised again
    for `client`: every module holding parameters draws them anew with its `reset_parameters`
    (BatchNorm: its statistics too); a module without one keeps `model`'s values."""
    model = copy.deepcopy(model).cpu()
    torch.manual_seed(torch_seed(seed, "init", client))
    for module in model.modules():
        if hasattr(module, "reset_parameters") and any(True for _ in module.parameters(recurse=False)):
            module.reset_parameters()
    return {k: v.detach() for k, v in model.state_dict().items()}
