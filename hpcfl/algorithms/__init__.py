"""Algorithm registry: one class per paper or baseline, both halves in one file."""
from hpcfl.algorithms.base import Algorithm
from hpcfl.algorithms.fedavg import MOON, FedAvg, FedFM, FedKA, FedNTD, FedProx, FedRS
from hpcfl.algorithms.fedavgm import FedAvgM
from hpcfl.algorithms.fedclassavg import FedClassAvg
from hpcfl.algorithms.fedcme import FedCME
from hpcfl.algorithms.feddyn import FedDyn
from hpcfl.algorithms.fedfm_lite import FedFMLite
from hpcfl.algorithms.fedma import FedMA
from hpcfl.algorithms.fednova import FedNova
from hpcfl.algorithms.fedopt import FedAdagrad, FedAdam, FedYogi
from hpcfl.algorithms.fedproto import FedProto
from hpcfl.algorithms.local import Ensemble, LocalOnly
from hpcfl.algorithms.scaffold import Scaffold
from hpcfl.params import params_from
from hpcfl.plugins import Registry, subclass_of

HOOKS = ("plan", "downlink", "client_update")     # what every phase kind needs (aggregate: averaging phases')
# algorithm.name: these, or a plug-in's "package.module:Class" (hpcfl.plugins)
ALGORITHMS = Registry("algorithm.name", subclass_of(Algorithm, "an hpcfl algorithm", HOOKS), {cls.name: cls for cls in (
    FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi, FedProx, Scaffold, FedNova, FedDyn, MOON, FedRS, FedNTD,
    LocalOnly, Ensemble, FedFM, FedFMLite, FedClassAvg, FedProto, FedKA, FedCME, FedMA)})


def algorithm_params(name: str, raw: dict) -> Algorithm.Params:
    return params_from(ALGORITHMS[name].Params, raw, "algorithm.params")
