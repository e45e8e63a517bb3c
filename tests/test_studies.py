"""The studies: every shipped sweep file expands into valid jobs, and studies/run.py runs a study's
points seed by seed, resumes where it stopped, compacts finished results and estimates the rest."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from hpcfl.config import read_job_file
from hpcfl.jobs import prepare
from hpcfl.metrics import read_run
from hpcfl.sweep import points

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted((REPO / "studies").glob("*/*.toml")) + sorted((REPO / "studies").glob("*/gpu/*.toml"))


def test_the_studies_are_shipped():
    assert {p.parent.name for p in SWEEPS} == {"fedcme", "fedfm", "fedka", "fedclassavg", "fedma", "precision", "gpu"}


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: str(p.parent.relative_to(REPO / "studies") / p.name))
def test_every_point_of_every_study_is_a_valid_job_with_its_results_in_its_folder(sweep):
    """...in its study's folder, its arms paired (the same seeds and splits) and started alike: the clients
    of every arm at one grid point each from its own initial model, or all from one (`init`; an algorithm
    without it starts them from the global model)."""
    todo = points(read_job_file(sweep))
    jobs = [prepare(sweep, overrides, allow_sweep=True) for overrides in todo]
    configs = [job.config for job in jobs]
    assert len({c.result_path for c in configs}) == len(configs)
    folder = "results" if sweep.name == "sweep.toml" else f"results-{sweep.stem}"       # one folder per sweep file
    assert all(c.result_path.parent == sweep.parent.relative_to(REPO) / folder for c in configs)
    assert {c.run.device for c in configs} == {"cuda" if sweep.parent.name == "gpu" else "auto"}
    arms = {c.run.arm for c in configs}
    for arm in arms:                        # arms are paired: the same seeds and the same split seeds
        assert {(c.run.seed, c.data_seed) for c in configs if c.run.arm == arm} == {(c.run.seed, c.data_seed)
                                                                                   for c in configs}
    starts = {}
    for job in jobs:
        point = job.config.run_name.replace(f"-{job.config.run.arm}-", "-")
        starts.setdefault(point, set()).add(getattr(job.algorithm, "init", "shared"))
    assert all(len(alike) == 1 for alike in starts.values()), starts


TINY = """
[run]
study = "results"
name = "tiny"
results_root = "{root}"
rounds = 2
[data]
dataset = "digits"
num_clients = 3
partition = "iid"
[train]
clients_per_round = 3
batch_size = 32
[sweep]
seeds = [0, 1]
[sweep.arms.A]
"algorithm.name" = "fedavg"
[sweep.arms.B]
"algorithm.name" = "fedprox"
"""


def _runner(root, *args):
    return subprocess.run([sys.executable, str(REPO / "studies" / "run.py"), "tiny", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=300)


def test_the_runner_goes_seed_by_seed_compacts_and_resumes(tmp_path):
    study = tmp_path / "studies" / "tiny"
    study.mkdir(parents=True)
    results = tmp_path / "out"
    (study / "sweep.toml").write_text(TINY.format(root=results))
    planned = _runner(tmp_path / "studies", "--plan")
    assert planned.returncode == 0 and "0/4 points done" in planned.stdout and "unknown" in planned.stdout
    assert not results.exists()                                           # --plan runs nothing
    done = _runner(tmp_path / "studies")
    assert done.returncode == 0, done.stderr
    order = [line.split(" point ")[1].split()[0] for line in done.stdout.splitlines() if " point " in line]
    assert order == ["0", "2", "1", "3"]                                  # A and B of seed 0, then of seed 1
    files = sorted((results / "results").glob("*.h5"))
    assert [f.name for f in files] == ["tiny-A-seed0.h5", "tiny-A-seed1.h5", "tiny-B-seed0.h5", "tiny-B-seed1.h5"]
    for file in files:
        assert read_run(file).attrs["status"] == "completed"
        with h5py.File(file, "r") as h5:
            assert h5["round/test_acc"].chunks is None                      # compacted: exact length, contiguous
    timing = json.loads((study / "timing.json").read_text())
    assert timing["sweep.toml"] > 0
    files[3].unlink()                                                     # one point lost: only it runs again
    again = _runner(tmp_path / "studies")
    assert again.returncode == 0 and "3/4 points done" in again.stdout and "about 0.0 hours" in again.stdout
    assert [line for line in again.stdout.splitlines() if " point " in line] == [
        "studies: tiny sweep.toml point 3 (tiny-B-seed1.h5, 2 rounds left)"]


def test_a_stop_signal_checkpoints_the_running_points_and_starts_no_more(tmp_path):
    study = tmp_path / "studies" / "tiny"
    study.mkdir(parents=True)
    results = tmp_path / "out" / "results"
    (study / "sweep.toml").write_text(TINY.format(root=results.parent).replace("rounds = 2", "rounds = 400"))
    runner = subprocess.Popen([sys.executable, str(REPO / "studies" / "run.py"), "tiny", "--root",
                               str(tmp_path / "studies"), "--parallel", "2"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(results.glob("*.h5"))) < 2 and time.monotonic() < deadline:    # both points training
        time.sleep(0.2)
    time.sleep(1)
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=120)
    assert runner.returncode == 3                                         # stopped, resumable
    assert [line.split(" point ")[1].split()[0] for line in out.splitlines() if " point " in line] == ["0", "2"]
    stopped = {f.name: read_run(f) for f in results.glob("*.h5")}
    assert set(stopped) == {"tiny-A-seed0.h5", "tiny-B-seed0.h5"}         # seed 0's pair only, none after it
    assert all(run.attrs["status"] != "completed" and 0 < len(run.arrays["round/test_acc"]) < 400
               for run in stopped.values())
    assert "0/4 points done, 2 partly" in _runner(tmp_path / "studies", "--plan").stdout


def test_a_diverging_point_is_a_result_the_others_go_on_and_it_is_not_run_again(tmp_path):
    study = tmp_path / "studies" / "tiny"
    study.mkdir(parents=True)
    results = tmp_path / "out" / "results"
    (study / "sweep.toml").write_text(TINY.format(root=results.parent).replace(
        '"algorithm.name" = "fedavg"', '"algorithm.name" = "fedavg"\n"train.lr" = 1e12'))   # arm A diverges
    first = _runner(tmp_path / "studies")
    assert first.returncode == 1 and first.stderr.count("failed with exit code 1") == 2
    runs = {f.name: read_run(f) for f in results.glob("*.h5")}
    assert [runs[f"tiny-B-seed{s}.h5"].attrs["status"] for s in (0, 1)] == ["completed", "completed"]
    assert [runs[f"tiny-A-seed{s}.h5"].attrs["status"] for s in (0, 1)] == ["failed", "failed"]
    again = _runner(tmp_path / "studies")
    assert again.returncode == 0 and "4/4 points done (2 diverged: final, a result)" in again.stdout
    assert " point " not in again.stdout                                  # nothing runs again
    (study / "sweep.toml").write_text(TINY.format(root=results.parent))  # a crash is not a divergence:
    with h5py.File(results / "tiny-B-seed1.h5", "a") as h5:              # a failed file with finite losses
        h5.attrs["status"] = "failed"
    assert "3/4 points done (2 diverged" in _runner(tmp_path / "studies", "--plan").stdout


def test_report_rewrites_each_readme_table_with_what_analyze_prints(tmp_path):
    sys.path.insert(0, str(REPO / "studies"))
    from report import refresh

    from hpcfl.metrics import Recorder

    for arm, acc in (("A", 0.5), ("B", 0.7)):
        with Recorder.create(tmp_path / "r" / f"{arm}.h5", {"config": {"run": {"seed": 0, "arm": arm}}}) as rec:
            rec.append_round(0, {"round/test_acc": acc})
            rec.set_attr("status", "completed")
    readme = tmp_path / "README.md"
    readme.write_text("# Study\n<!-- analysis: python -m hpcfl.analyze table r --by run.arm -->\nstale\n<!-- end -->\n"
                      "Verdict: ...\n")
    assert refresh(readme, cwd=tmp_path) == 1
    text = readme.read_text()
    assert "stale" not in text and "| A " in text and "0.7" in text and text.endswith("<!-- end -->\nVerdict: ...\n")
    assert refresh(readme, cwd=tmp_path) == 1 and readme.read_text() == text          # idempotent
    readme.write_text("<!-- analysis: rm -rf r -->\n<!-- end -->\n")
    with pytest.raises(SystemExit, match="only `python -m hpcfl.analyze"):
        refresh(readme, cwd=tmp_path)
    assert (tmp_path / "r").exists()
