"""Where a result came from: versions, commit, hosts and devices, plug-ins, the parameters resolved
with their defaults (hpcfl.jobs.Resolved.tables), stored as root attributes."""
import subprocess
from importlib import metadata
from pathlib import Path

from hpcfl import _version
from hpcfl.jobs import Resolved
from hpcfl.plugins import plugins


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    """The commit of the hpcfl in use: the checkout's HEAD when it runs from one (with "-dirty" for
    uncommitted changes to tracked files), else the commit it was built from (hpcfl._version.built_commit,
    recorded when it was built), else 'unknown'."""
    built = _version.built_commit() or "unknown"
    here = str(_version.PACKAGE)
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel", "HEAD"],
                              capture_output=True, text=True, timeout=5)
        if head.returncode != 0 or Path(head.stdout.split()[0]).resolve() != _version.PACKAGE.resolve().parent:
            return built                            # not a checkout of hpcfl (an install inside another repo)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return built
    return head.stdout.split()[1] + ("-dirty" if dirty else "")


def run_attributes(job: Resolved, reports: list[dict]) -> dict:
    """reports: every rank's set-up info (rank, host, device), in rank order."""
    config = job.config
    versions = {name: _installed(name) for name in ("torch", "torchvision", "numpy", "h5py", "mpi4py", "mpich")}
    versions["hpcfl"] = _version.version()
    return {"versions": versions, "git_commit": git_commit(), "world_size": len(reports),
            "hostnames": [r["host"] for r in reports], "devices": [r["device"] for r in reports],
            "setup_max_rss_bytes": [r["setup_max_rss_bytes"] for r in reports],
            "setup_s": [round(r["setup_s"], 4) for r in reports],
            "study": config.run.study, "run": config.run_name, "status": "running",
            "resolved": job.tables,
            "plugins": plugins({"data.dataset": [config.data.dataset], "data.partition": [config.data.partition],
                                "model.name": list(job.models),
                                "algorithm.name": [config.algorithm.name],
                                "algorithm.terms": list(config.algorithm.terms)})}
