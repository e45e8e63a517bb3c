"""Where a result came from: versions, commit, hosts and devices, plug-ins, the parameters resolved
with their defaults (hpcfl.jobs.Resolved.tables), stored as root attributes."""
from importlib import metadata

from hpcfl import _version
from hpcfl.jobs import Resolved
from hpcfl.plugins import plugins


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def run_attributes(job: Resolved, reports: list[dict]) -> dict:
    """reports: every rank's set-up info (rank, host, device), in rank order."""
    config = job.config
    versions = {name: _installed(name)
                for name in ("torch", "torchvision", "numpy", "h5py", "mpi4py", "mpich")}
    versions["hpcfl"] = _version.version()
    return {"versions": versions, "git_commit": _version.git_commit(), "world_size": len(reports),
            "hostnames": [r["host"] for r in reports], "devices": [r["device"] for r in reports],
            "setup_max_rss_bytes": [r["setup_max_rss_bytes"] for r in reports],
            "setup_s": [round(r["setup_s"], 4) for r in reports],
            "study": config.run.study, "run": config.run_name, "status": "running",
            "resolved": job.tables,
            "plugins": plugins({"data.dataset": [config.data.dataset],
                                "data.partition": [config.data.partition],
                                "model.name": list(job.models),
                                "algorithm.name": [config.algorithm.name],
                                "algorithm.terms": list(config.algorithm.terms)})}
