"""Result files replayed into an experiment tracker's offline format:
`hpcfl analyze export --to tensorboard|mlflow|wandb RESULTS... --out DIR`.

Each run gives the tracker the same thing (`Replay`): every per-round figure (`round/*`) as a
scalar at step = round (1-based; rounds that were not evaluated are left out, not written as NaN),
every `final/*` figure at the last round, the job's configuration as it ran (every parameter table
resolved with its defaults: hpcfl.analysis.results.ran_with) and the run's status. Only
committed rounds are read, so a crashed or running run exports what it finished, on a compute node
without internet. The HDF5 file stays the source of truth: exporting a run again replaces what an
earlier export wrote for it.

A run is known to the tracker by its study and run name. Files of one export that share both (two
results roots, say) would overwrite each other there, so each of them is named `<run>-<8 hex digits of
its resolved path's SHA-256>` instead (`tracker_names`): the same name on every export of the same
files, so a re-export still replaces its own runs.

- tensorboard: DIR/<study>/<run>/, one event file (`tensorboard --logdir DIR`).
- mlflow: a file store in DIR (`mlruns` layout), one experiment per study, one run per result file
  named after it, the configuration as flattened parameters. MLflow keeps its file store in
  maintenance mode; hpcfl writes it with `MLFLOW_ALLOW_FILE_STORE=true`, the same setting reads it
  (`mlflow ui --backend-store-uri DIR`), and `mlflow migrate-filestore` moves it into a database.
- wandb: offline runs under DIR/wandb/ (`wandb sync DIR/wandb/offline-run-*` uploads them later),
  one project per study; the run id is derived from (study, run), so a later export replaces it.
"""
import hashlib
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hpcfl.analysis.results import find_files, ran_with
from hpcfl.config import flatten
from hpcfl.errors import ResultsError
from hpcfl.metrics import read_run

# target -> (the module it needs, what to install)
NEEDS = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny"),
         "wandb": ("wandb", "wandb")}
TARGETS = tuple(NEEDS)
# target -> how to look at what it wrote
VIEW = {"tensorboard": "tensorboard --logdir {out}",
        "mlflow": "MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {out} (the ui needs pip install mlflow)",
        "wandb": "wandb sync {out}/wandb/offline-run-* (uploads them)"}


def _identity(path: Path, attrs: dict) -> tuple[str, str]:
    """(study, run name) as the result file records them."""
    return str(attrs.get("study", "")), str(attrs.get("run", path.stem))


@dataclass
class Replay:
    """What a tracker is given of one result file."""
    study: str
    name: str
    config: dict
    status: str
    rounds: int
    scalars: list[tuple[str, int, float]]       # (figure, step, value), finite values only

    @classmethod
    def of(cls, path: Path) -> "Replay":
        run = read_run(path, keys=None)
        scalars = []
        for name, values in sorted(run.arrays.items()):
            series = np.asarray(values, dtype=float) if name.startswith(("round/", "final/")) else None
            if series is None or series.ndim > 1:
                continue
            steps = [run.rounds] if name.startswith("final/") else range(1, len(series) + 1)
            scalars += [(name, step, float(v)) for step, v in zip(steps, np.atleast_1d(series), strict=True)
                        if np.isfinite(v)]
        return cls(*_identity(path, run.attrs), ran_with(run.attrs), str(run.attrs.get("status", "running")),
                   run.rounds, scalars)

    def by_step(self) -> dict[int, dict[str, float]]:
        steps = defaultdict(dict)
        for name, step, value in self.scalars:
            steps[step][name] = value
        return dict(sorted(steps.items()))


def to_tensorboard(replay: Replay, out: Path) -> Path:
    from torch.utils.tensorboard import SummaryWriter
    folder = out / replay.study / replay.name
    shutil.rmtree(folder, ignore_errors=True)
    writer = SummaryWriter(log_dir=str(folder))
    for name, step, value in replay.scalars:
        writer.add_scalar(name, value, step)
    writer.add_text("config", f"```\n{json.dumps(replay.config, indent=2, sort_keys=True)}\n```")
    writer.add_text("status", f"{replay.status}, {replay.rounds} rounds committed")
    writer.close()
    return folder


def _runs_named(client, experiment: str, name: str) -> list:
    """The experiment's runs an earlier export of run `name` wrote, matched here, not in a filter string
    (where a quote in the name would end the string)."""
    found, token = [], None
    while True:
        page = client.search_runs([experiment], max_results=1000, page_token=token)
        found += [run for run in page if run.data.tags.get("hpcfl.run") == name]
        token = page.token
        if not token:
            return found


def to_mlflow(replay: Replay, out: Path) -> Path:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=out.resolve().as_uri())
    found = client.get_experiment_by_name(replay.study)
    experiment = found.experiment_id if found else client.create_experiment(replay.study)
    for old in _runs_named(client, experiment, replay.name):
        client.delete_run(old.info.run_id)
    run = client.create_run(experiment, run_name=replay.name, tags={
        "hpcfl.run": replay.name, "hpcfl.status": replay.status, "hpcfl.committed_rounds": str(replay.rounds)})
    now = int(time.time() * 1000)
    params = [Param(k, (json.dumps(v) if isinstance(v, dict | list | bool) else str(v))[:6000])    # as text
              for k, v in flatten(replay.config).items()]
    metrics = [Metric(name, value, now, step) for name, step, value in replay.scalars]
    for i in range(0, max(len(params), len(metrics)), 100):     # MLflow takes at most 100 parameters a batch
        client.log_batch(run.info.run_id, metrics=metrics[i:i + 100], params=params[i:i + 100])
    client.set_terminated(run.info.run_id, "FINISHED" if replay.status == "completed" else "FAILED")
    return out / experiment / run.info.run_id


def to_wandb(replay: Replay, out: Path) -> Path:
    import wandb
    run_id = hashlib.sha256(f"{replay.study}/{replay.name}".encode()).hexdigest()[:16]
    for old in (out / "wandb").glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(old)
    run = wandb.init(mode="offline", dir=str(out), project=replay.study or "hpcfl", name=replay.name, id=run_id,
                     config=replay.config, settings=wandb.Settings(silent=True, console="off"))
    for step, figures in replay.by_step().items():
        run.log(figures, step=step)
    run.summary.update({"status": replay.status, "committed_rounds": replay.rounds})
    run.finish()
    return Path(run.dir).parent


WRITERS = {"tensorboard": to_tensorboard, "mlflow": to_mlflow, "wandb": to_wandb}


def export(paths, out: Path, to: str = "tensorboard") -> tuple[list[Path], list[str]]:
    """Write each readable result file under `out`; returns (where each run went, the problems)."""
    module, install = NEEDS[to]
    try:
        __import__(module)
    except ImportError:
        raise ResultsError(f"the {to} export needs the {module.rsplit('.', 1)[-1]} package: pip install {install} "
                           f"(or, in hpcfl's checkout, pip install '.[{to}]')") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names, problems = tracker_names(find_files(paths))
    written = []
    for path, name in names.items():
        try:
            replay = Replay.of(path)
        except ResultsError as err:           # its arrays damaged: only its attributes were read so far
            problems.append(str(err))
            continue
        written.append(WRITERS[to](replace(replay, name=name), out))
    return written, problems


def tracker_names(paths: list[Path]) -> tuple[dict[Path, str], list[str]]:
    """Each readable file's run name in the tracker, and the files not read: its own name, unless another
    of `paths` has the same study and name (they would overwrite each other); then the name and 8 hex
    digits of the file's resolved path, which a re-export of the file gives again. Reads attributes only."""
    found, problems = {}, []
    for path in paths:
        try:
            found[path] = _identity(path, read_run(path, keys=()).attrs)
        except ResultsError as err:
            problems.append(str(err))
    shared = Counter(found.values())
    return {path: name if shared[study, name] == 1
            else f"{name}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
            for path, (study, name) in found.items()}, problems
