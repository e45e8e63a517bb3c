"""Result files replayed into an experiment tracker's offline format: `hpcfl analyze export --to
tensorboard RESULTS... --out DIR`.

Each run becomes DIR/<study>/<run>/ with one TensorBoard event file: every per-round figure
(`round/*`) as a scalar at step = round (1-based; rounds that were not evaluated are left out, not
written as NaN), every `final/*` figure at the last round, and the job's configuration as text. Only
committed rounds are read, so a crashed or running run exports what it finished, on a compute node
without internet. The HDF5 file stays the source of truth: exporting again rewrites the folder.
"""
import json
import shutil
from pathlib import Path

import numpy as np

from hpcfl.analysis.results import find_files
from hpcfl.errors import ResultsError
from hpcfl.metrics import read_run

TARGETS = ("tensorboard",)


def export(paths, out: Path, to: str = "tensorboard") -> tuple[list[Path], list[str]]:
    """Write each readable result file under `out`; returns (the folders written, the problems)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ResultsError("the TensorBoard export needs the tensorboard package: pip install "
                           "'hpcfl[tensorboard]' (or pip install tensorboard)") from None
    written, problems = [], []
    for path in find_files(paths):
        try:
            run = read_run(path, keys=None)
        except ResultsError as err:
            problems.append(str(err))
            continue
        folder = Path(out) / str(run.attrs.get("study", "")) / str(run.attrs.get("run", path.stem))
        shutil.rmtree(folder, ignore_errors=True)
        writer = SummaryWriter(log_dir=str(folder))
        for name, values in sorted(run.arrays.items()):
            series = np.asarray(values, dtype=float) if name.startswith(("round/", "final/")) else None
            if series is None or series.ndim > 1:
                continue
            steps = [run.rounds] if name.startswith("final/") else range(1, len(series) + 1)
            for step, value in zip(steps, np.atleast_1d(series), strict=True):
                if np.isfinite(value):
                    writer.add_scalar(name, float(value), step)
        writer.add_text("config", f"```\n{json.dumps(run.attrs.get('config', {}), indent=2, sort_keys=True)}\n```")
        writer.add_text("status", f"{run.attrs.get('status', 'running')}, {run.rounds} rounds committed")
        writer.close()
        written.append(folder)
    return written, problems
