"""Where a result came from: versions, commit, hosts and devices, plug-ins, the parameters resolved
with their defaults (hpcfl.jobs.Resolved.tables), stored as root attributes.

These describe the run's latest start. A resumed run is several starts, which may differ (another
node, another hpcfl: resuming checks the configuration and the split, not the code), so `segments`
lists every start from its first round, with its commit, versions, world size and hosts."""
import logging
from importlib import metadata

from hpcfl import _version
from hpcfl.jobs import Resolved
from hpcfl.plugins import plugins

LOG = logging.getLogger(__name__)
SEGMENT_KEYS = ("git_commit", "versions", "world_size", "hostnames")


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def run_attributes(job: Resolved, reports: list[dict], earlier: dict | None = None, first_round: int = 0) -> dict:
    """reports: every rank's set-up info (rank, host, device), in rank order; `earlier`: a resumed
    file's attributes, its run going on from `first_round`."""
    config = job.config
    versions = {name: _installed(name)
                for name in ("torch", "torchvision", "numpy", "h5py", "mpi4py", "mpich")}
    versions["hpcfl"] = _version.version()
    this = {"first_round": first_round, "git_commit": _version.git_commit(), "versions": versions,
            "world_size": len(reports), "hostnames": [r["host"] for r in reports]}
    return {**{key: this[key] for key in SEGMENT_KEYS}, "segments": _segments(earlier or {}, this),
            "devices": [r["device"] for r in reports],
            "setup_max_rss_bytes": [r["setup_max_rss_bytes"] for r in reports],
            "setup_s": [round(r["setup_s"], 4) for r in reports],
            "study": config.run.study, "run": config.run_name, "status": "running",
            "resolved": job.tables,
            "plugins": plugins({"data.dataset": [config.data.dataset],
                                "data.partition": [config.data.partition],
                                "model.name": list(job.models),
                                "algorithm.name": [config.algorithm.name],
                                "algorithm.terms": list(config.algorithm.terms)})}


def _segments(earlier: dict, this: dict) -> list[dict]:
    """The starts that wrote the run's rounds, `this` last: one that began at or after `this` one's
    first round wrote only rounds run again now; a file of an hpcfl before segments has its one start
    in its top-level attributes. A commit or versions other than the last start's are warned of."""
    before = earlier.get("segments") or ([{"first_round": 0, **{k: earlier[k] for k in SEGMENT_KEYS if k in earlier}}]
                                         if "git_commit" in earlier else [])
    before = [segment for segment in before if segment["first_round"] < this["first_round"]]
    if before and any(before[-1].get(k) != this[k] for k in ("git_commit", "versions")):
        LOG.warning(f"resuming at round {this['first_round']} with hpcfl {this['versions']['hpcfl']} at commit "
                    f"{this['git_commit']}, where the rounds before were run by commit {before[-1].get('git_commit')} "
                    "(or other package versions): the result file's `segments` records both")
    return [*before, this]
