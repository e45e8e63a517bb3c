"""hpcfl: federated-learning experiments on HPC clusters.

`python -m hpcfl.launch JOB.toml` runs one job; rank 0 is the server, ranks >= 1 host clients.
From Python, `hpcfl.run(JOB)` runs one in this process and returns its result file's path.

What a plug-in author needs (an algorithm, a model, a data set, a partition or a loss term named in a
job file by its import path, "package.module:Name"; hpcfl.plugins) is importable from here. The names
load on first use, so `import hpcfl` stays light and the analysis never pulls in the runtime.
"""
import importlib

from hpcfl._version import built_commit

__commit__ = built_commit()            # "" for a source tree never built (git_commit reads the checkout instead)

# public name -> the module that defines it
_EXPORTS = {
    "Algorithm": "hpcfl.algorithms.base", "Client": "hpcfl.data.client",
    "Phase": "hpcfl.algorithms.phases", "SwapPhase": "hpcfl.algorithms.phases", "MatchPhase": "hpcfl.algorithms.phases",
    "Swapping": "hpcfl.algorithms.phases", "Matching": "hpcfl.algorithms.phases", "MATCHED": "hpcfl.algorithms.phases",
    "Setup": "hpcfl.algorithms.base", "Traits": "hpcfl.algorithms.base", "ONE": "hpcfl.algorithms.base",
    "WEIGHT": "hpcfl.algorithms.base",
    "assign": "hpcfl.algorithms.base", "weighted": "hpcfl.algorithms.base", "weighted_mean": "hpcfl.algorithms.base",
    "FedAvg": "hpcfl.algorithms.fedavg", "Term": "hpcfl.terms.base", "Frozen": "hpcfl.terms.base",
    "Layout": "hpcfl.payload", "Dataset": "hpcfl.data.base", "JobConfig": "hpcfl.config", "load_job": "hpcfl.jobs",
    "read_run": "hpcfl.metrics", "ConfigError": "hpcfl.errors", "DataError": "hpcfl.errors",
    "torch_generator": "hpcfl.seeding", "numpy_rng": "hpcfl.seeding",
    "Regularizer": "hpcfl.terms.base",      # Term's old name, until the next release
}
__all__ = ["run", "__version__", *_EXPORTS]


def run(job, overrides=(), data_root=None, quiet=False):
    """Run a job in this process; see hpcfl.launch.run_job."""
    from hpcfl.launch import run_job

    return run_job(job, overrides, data_root, quiet)


def __getattr__(name):
    if name == "__version__":          # pyproject.toml's, as package metadata (hpcfl._version)
        from hpcfl._version import version

        return version()
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hpcfl' has no attribute {name!r}")
