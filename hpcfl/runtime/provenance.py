"""Where a result came from: versions, commit, hosts and devices, plug-ins, stored as root attributes."""
import subprocess
from importlib import metadata
from pathlib import Path

import hpcfl
from hpcfl.config import JobConfig
from hpcfl.plugins import plugins


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    """The commit of the hpcfl checkout in use ('unknown' for an installed copy)."""
    try:
        out = subprocess.run(["git", "-C", str(Path(hpcfl.__file__).parent), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def run_attributes(config: JobConfig, reports: list[dict]) -> dict:
    """reports: every rank's set-up info (rank, host, device), in rank order."""
    versions = {name: _version(name) for name in ("torch", "torchvision", "numpy", "h5py", "mpi4py", "mpich")}
    versions["hpcfl"] = hpcfl.__version__
    return {"versions": versions, "git_commit": git_commit(), "world_size": len(reports),
            "hostnames": [r["host"] for r in reports], "devices": [r["device"] for r in reports],
            "setup_max_rss_bytes": [r["setup_max_rss_bytes"] for r in reports],
            "study": config.run.study, "run": config.run_name, "status": "running",
            "plugins": plugins({"data.dataset": [config.data.dataset], "model.name": list(config.architectures),
                                "algorithm.name": [config.algorithm.name],
                                "algorithm.terms": list(config.algorithm.terms)})}
