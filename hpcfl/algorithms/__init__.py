"""Algorithm registry: one class per paper or baseline, both halves in one file."""
from hpcfl.algorithms.base import Algorithm, params_from
from hpcfl.algorithms.fedavg import FedAvg

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (FedAvg,)}


def algorithm_params(name: str, raw: dict) -> Algorithm.Params:
    return params_from(ALGORITHMS[name].Params, raw, "algorithm.params")
