"""The `hpcfl` console script: its subcommands, exit statuses, `sweep --submit` and `status`."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import h5py
import pytest
from helpers import MPIRUN, launch

import hpcfl
from hpcfl import _version
from hpcfl._version import git_commit
from hpcfl.algorithms import ALGORITHMS
from hpcfl.cli import main
from hpcfl.errors import EXIT_MEANING, Exit
from hpcfl.models import model_options
from hpcfl.runtime.lock import STALE_S, lock_path
from hpcfl.sweep import digest
from hpcfl.testing import assert_same_metrics, run_metrics

SCRIPT = Path(sys.executable).with_name("hpcfl")      # the console script pip installed beside this Python


def test_help_lists_every_command_and_every_exit_status(capsys):
    assert main(["--help"]) == Exit.DONE
    text = capsys.readouterr().out
    assert all(f"hpcfl {command} " in text for command in ("run", "check", "sweep", "status", "analyze", "init"))
    assert all(f"  {int(code)}  " in text for code in EXIT_MEANING)
    assert main(["trian"]) == Exit.BAD_INPUT and "unknown command 'trian'" in capsys.readouterr().err
    assert main(["--version"]) == Exit.DONE
    assert capsys.readouterr().out == f"hpcfl {hpcfl.__version__} (commit {git_commit()})\n"
    for command in ("run", "sweep"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert f"hpcfl {command}" in (out := capsys.readouterr().out) and "  3  stopped at a checkpoint" in out


def test_check_prints_the_resolved_job_and_refuses_a_bad_one(tiny_job, capsys):
    job = tiny_job()
    assert main(["check", str(job), "--set", "train.lr=0.5", "--set", "algorithm.name=fedavgm"]) == Exit.DONE
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["lr"] == 0.5 and printed["algorithm"]["params"] == {}     # what the job wrote
    assert printed["resolved"]["algorithm"]["params"] == asdict(ALGORITHMS["fedavgm"].Params())   # what it runs with
    assert printed["resolved"]["model"]["params"] == asdict(model_options("fmnist_cnn")())
    assert main(["check", str(job), "--set", "train.optimiser=adam"]) == Exit.BAD_INPUT
    assert "optimiser" in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly(tiny_job):
    """`hpcfl check JOB | head`: the reader closes the pipe; hpcfl stops without a traceback."""
    reader = subprocess.Popen([sys.executable, "-m", "hpcfl.cli", "check", str(tiny_job())],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader.stdout.close()                           # closed before hpcfl writes a byte
    error = reader.communicate(timeout=120)[1]
    assert reader.returncode == Exit.DONE and "Traceback" not in error and "BrokenPipe" not in error


@pytest.mark.skipif(not SCRIPT.exists(), reason="hpcfl is not installed in this Python's environment")
def test_the_console_script_under_mpirun_gives_the_module_entry_points_result_file(tiny_job, tmp_path):
    job = tiny_job(rounds=2)
    script = subprocess.run([MPIRUN, "-np", "3", str(SCRIPT), "run", str(job), "--results-root", tmp_path / "script"],
                            capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert script.returncode == 0, script.stderr
    module = launch(job, "--results-root", tmp_path / "module", ranks=3)
    assert module.returncode == 0, module.stderr
    name = Path("test") / "fedavg-dirichlet-seed0.h5"
    assert_same_metrics(run_metrics(tmp_path / "script" / name), run_metrics(tmp_path / "module" / name), exact=True)


SWEEP = '[sweep]\nseeds = [0, 1]\ngrid = { "train.lr" = [0.05, 0.1, 0.2] }\n'


def test_sweep_submit_writes_the_array_size_and_passes_the_options(tiny_job, tmp_path, capsys, monkeypatch):
    job = tiny_job(extra=SWEEP)
    fake = tmp_path / "bin" / "sbatch"                     # records how it was called
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "called"}\necho "$HPCFL_SLURM" >> {tmp_path / "called"}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    script = tmp_path / "site" / "sweep.sbatch"
    script.parent.mkdir()
    script.write_text("#!/bin/bash\n")
    assert main(["sweep", str(job), "--submit", "--max-concurrent", "2", "--script", str(script),
                 "--set", "train.local_epochs=2", "--", "--time=00:10:00", "-n", "3"]) == Exit.DONE
    assert "hpcfl: 6 points: sbatch --array=0-5%2" in capsys.readouterr().out
    argv, folder = (tmp_path / "called").read_text().splitlines()
    assert argv == (f"--array=0-5%2 --time=00:10:00 -n 3 {script} {job} --job-digest {digest(str(job))} "
                    "--set train.local_epochs=2")
    assert folder == str(script.parent)                   # where the batch script finds site.sh and step.sh
    assert main(["sweep", str(job), "--submit", "--script", str(tmp_path / "none.sbatch")]) == Exit.BAD_INPUT
    assert "none.sbatch does not exist" in capsys.readouterr().err


def test_sweep_submit_finds_the_packaged_script_where_no_slurm_folder_is(tiny_job, tmp_path, capsys, monkeypatch):
    from hpcfl.init import TEMPLATES

    job = tiny_job(extra=SWEEP)
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$HPCFL_SLURM" > {tmp_path / "called"}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("HPCFL_SLURM", raising=False)
    monkeypatch.chdir(tmp_path)                            # no slurm/ here
    assert main(["sweep", str(job), "--submit"]) == Exit.DONE
    assert f"{TEMPLATES / 'slurm' / 'sweep.sbatch'} {job}" in capsys.readouterr().out
    assert (tmp_path / "called").read_text().strip() == str(TEMPLATES / "slurm")


def test_init_writes_the_slurm_scripts_and_jobs_and_keeps_edited_files(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == Exit.DONE
    assert os.access(tmp_path / "slurm" / "step.sh", os.X_OK) and (tmp_path / "slurm" / "sweep.sbatch").is_file()
    assert {"quickstart.toml", "fedma/mnist-lenet.toml"} <= {str(p.relative_to(tmp_path / "jobs"))
                                                            for p in (tmp_path / "jobs").rglob("*.toml")}
    assert "next: edit" in capsys.readouterr().out
    site = tmp_path / "slurm" / "site.sh"
    site.write_text("module load mpi\n")
    assert main(["init", str(tmp_path)]) == Exit.DONE
    assert site.read_text() == "module load mpi\n" and "wrote 0 files" in capsys.readouterr().out
    (tmp_path / "afile").write_text("")
    assert main(["init", str(tmp_path / "afile")]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert "cannot write " in err and "(Not a directory): choose another folder" in err


def test_in_a_clone_the_templates_are_the_files_git_tracks(tmp_path):
    from hpcfl.init import templates

    root = tmp_path / "templates"
    (root / "jobs").mkdir(parents=True)
    shipped, mine = root / "jobs" / "quickstart.toml", root / "jobs" / "mine.toml"
    shipped.write_text("")
    mine.write_text("")
    assert templates(root) == [mine, shipped]                      # an installed package: every file
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert templates(root) == [mine, shipped]                      # in a git work tree that tracks none of them
    subprocess.run(["git", "-C", str(tmp_path), "add", "templates/jobs/quickstart.toml"], check=True)
    assert templates(root) == [shipped]                            # a clone: a researcher's own file stays theirs
    assert templates(root / "jobs") == [shipped]                   # paths from the folder asked about


def _result(tmp_path, tiny_job, name: str) -> Path:
    job = tiny_job(rounds=2)
    return hpcfl.run(job, [f"run.name={name!r}", f"run.results_root={str(tmp_path / 'results')!r}"], quiet=True)


def test_status_tells_complete_running_interrupted_failed_unreadable_and_missing(tiny_job, tmp_path, capsys):
    complete = _result(tmp_path, tiny_job, "complete")
    for name, status, committed in [("running", "running", 1), ("interrupted", "interrupted", 1),
                                    ("killed", "running", 1), ("failed", "failed", 0)]:
        copy = complete.with_name(f"{name}.h5")
        shutil.copy(complete, copy)
        with h5py.File(copy, "r+") as file:
            file.attrs["status"], file.attrs["committed_rounds"] = status, committed
    lock_path(complete.with_name("running.h5")).write_text("{}")          # a writer that is alive
    stale = lock_path(complete.with_name("killed.h5"))                   # one that stopped refreshing its lock
    stale.write_text("{}")
    os.utime(stale, (time.time() - STALE_S - 60,) * 2)
    complete.with_name("corrupt.h5").write_bytes(b"not HDF5")
    assert main(["status", str(complete.parent)]) == Exit.BAD_INPUT           # any unreadable file: not 0
    lines = {line.split()[-1].split("/")[-1]: line.split()[:2] for line in capsys.readouterr().out.splitlines()[:-1]
             if not line.startswith("unreadable")}
    assert lines == {"complete.h5": ["complete", "2/2"], "running.h5": ["running", "1/2"],
                     "interrupted.h5": ["interrupted", "1/2"], "killed.h5": ["interrupted", "1/2"],
                     "failed.h5": ["failed", "0/2"]}
    sweep = tiny_job(rounds=2, extra='[sweep]\nseeds = [0, 1]\n')
    assert main(["sweep", str(sweep), "--index", "0", "--results-root", str(tmp_path / "sw")]) == Exit.DONE
    capsys.readouterr()
    done = tmp_path / "sw" / "test" / "sweep-seed0.h5"
    shutil.copy(done, done.with_name("another-sweeps-seed0.h5"))              # in the folder, not of this sweep
    assert main(["status", "--sweep", str(sweep), "--results-root", str(tmp_path / "sw")]) == Exit.DONE
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["complete", "2/2", str(done)]
    assert out[1].split() == ["missing", str(done.with_name("sweep-seed1.h5"))]
    assert out[-1] == "1 complete, 1 missing"
    assert main(["status", "--sweep", str(sweep), "--results-root", str(tmp_path / "sw"),
                 "--set", "train.local_epochs=2"]) == Exit.BAD_INPUT             # its task would refuse the file
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("other config") and out[0].endswith(
        f"{done}  (train.local_epochs: 1 in the file, 2 here)") and out[-1] == "1 missing, 1 other config"
    assert main(["status", "--sweep", str(sweep), str(tmp_path / "sw")]) == Exit.DONE      # its --results-root left out
    assert "a sweep run with --results-root needs the same --results-root here" in capsys.readouterr().err
    assert main(["status", "--sweep", str(sweep), str(tmp_path / "sw"), "--results-root", str(tmp_path / "sw")]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["status", str(tmp_path / "nothing-here")]) == Exit.BAD_INPUT
    with pytest.raises(SystemExit) as refused:                 # it would be ignored without a sweep
        main(["status", str(tmp_path / "sw"), "--results-root", str(tmp_path / "sw")])
    assert refused.value.code == Exit.BAD_INPUT and "need --sweep JOB" in capsys.readouterr().err


def test_status_of_nothing_says_which_paths_do_not_exist(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == Exit.BAD_INPUT                   # an empty folder
    assert "no result files found; name result files" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "typo")]) == Exit.BAD_INPUT
    assert f"no result files found ({tmp_path / 'typo'}: no such file or folder)" in capsys.readouterr().err


def test_status_names_an_unreadable_file_and_why(tmp_path, capsys):
    (tmp_path / "corrupt.h5").write_bytes(b"not HDF5")
    assert main(["status", str(tmp_path)]) == Exit.BAD_INPUT
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("unreadable") and "corrupt.h5" in line and "(" in line
    lock_path(tmp_path / "corrupt.h5").write_text("{}")         # its run holds it: caught between two flushes
    assert main(["status", str(tmp_path)]) == Exit.DONE
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("running") and "(not readable while it is written: " in line


def test_a_damaged_result_file_gets_one_verdict_from_status_analyze_and_read_run(tmp_path, capsys):
    from hpcfl.analysis import load
    from hpcfl.errors import ResultsError
    from hpcfl.metrics import read_run

    damaged = tmp_path / "damaged.h5"
    shutil.copy(sorted(Path(__file__).parent.parent.glob("studies/fedcme/results/*.h5"))[0], damaged)
    with open(damaged, "r+b") as file:              # 4 KiB overwritten inside: the object headers there
        file.seek(20000)
        file.write(b"\xff" * 4096)
    with pytest.raises(ResultsError, match="damaged.h5"):
        read_run(damaged)
    assert main(["status", str(damaged)]) == Exit.BAD_INPUT
    assert capsys.readouterr().out.startswith("unreadable")
    assert load([damaged]).problems and main(["analyze", "table", str(damaged)]) == Exit.BAD_INPUT


def test_the_version_is_a_release_number_written_once_and_the_install_reports_it():
    from importlib import metadata

    assert re.fullmatch(r"\d+\.\d+\.\d+", hpcfl.__version__)      # no tags needed: not 0.2.0.devN+g...
    assert metadata.version("hpcfl") == hpcfl.__version__


def test_provenance_records_the_checkouts_commit_or_else_the_one_the_install_was_built_from(tmp_path, monkeypatch):
    here = Path(hpcfl.__file__).parent
    head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:                             # tests running from a git checkout of hpcfl
        assert git_commit().removesuffix("-dirty") == head.stdout.strip()
    installed = tmp_path / "site-packages" / "hpcfl"    # an installed copy: no git around it
    installed.mkdir(parents=True)
    monkeypatch.setattr(_version, "PACKAGE", installed)
    monkeypatch.setitem(sys.modules, "hpcfl._commit", SimpleNamespace(__commit__="1234abc"))   # its _commit.py
    assert git_commit() == "1234abc"
    monkeypatch.setitem(sys.modules, "hpcfl._commit", None)          # a source tree never built
    assert git_commit() == "unknown"


def test_check_and_status_help_show_their_own_options_and_exit_codes(capsys):
    """`hpcfl check -h` is not `hpcfl run -h`: no run-only options, and only the codes a check can end with."""
    from hpcfl.cli import main

    for command in ("check", "status", "init", "analyze"):
        with pytest.raises(SystemExit):
            main([command, "-h"])
        text = capsys.readouterr().out
        assert "  0  done" in text and "  2  bad input" in text
        assert "  1  a failure during training" not in text and "  3  stopped at a checkpoint" not in text, command
    with pytest.raises(SystemExit):
        main(["check", "-h"])
    text = capsys.readouterr().out
    assert text.startswith("usage: hpcfl check [-h] [--set KEY=VALUE] [--results-root RESULTS_ROOT] job")
    assert "Validate a job file" in text and "--log-dir" not in text and "--data-root" not in text
    with pytest.raises(SystemExit):
        main(["run", "-h"])
    text = capsys.readouterr().out
    assert "--log-dir" in text and "  3  stopped at a checkpoint" in text and "only rank 0 exits non-zero" in text
