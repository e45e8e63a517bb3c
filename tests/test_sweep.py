"""Sweeps: a grid times seeds expands deterministically into named points; a point runs by index or
by SLURM array task id, writes its own result file, and is skipped once complete; values written
as TOML; submission as one job array."""
import os
import tomllib

import pytest

from hpcfl.config import read_job_file
from hpcfl.errors import ConfigError
from hpcfl.init import TEMPLATES
from hpcfl.launch import main as launch
from hpcfl.metrics import read_run
from hpcfl.sweep import array_spec, arrays, digest, main, max_array_size, points, toml_value

SWEEP = """
[run]
study = "grid"
rounds = 2
[data]
dataset = "digits"
num_clients = 4
partition = "dirichlet"
partition_params = { beta = 0.5 }
[model]
name = "fmnist_cnn"
[train]
clients_per_round = 2
batch_size = 32
[sweep]
seeds = [0, 1]
grid = { "algorithm.name" = ["fedavg", "fedprox"], "data.partition_params.beta" = [0.1, 0.5] }
"""


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP)
    return path


def test_points_expand_keys_in_order_with_seeds_last(job):
    todo = points(read_job_file(job))
    assert len(todo) == 8
    assert todo[0] == ['algorithm.name="fedavg"', "data.partition_params.beta=0.1", "run.seed=0",
                       'run.name="sweep-fedavg-0.1-seed0"']
    assert todo[1][-1] == 'run.name="sweep-fedavg-0.1-seed1"'
    assert todo[2][-1] == 'run.name="sweep-fedavg-0.5-seed0"'
    assert todo[7][-1] == 'run.name="sweep-fedprox-0.5-seed1"'
    assert len({p[-1] for p in todo}) == 8                  # one result file per point


def test_list_prints_every_point_with_its_index(job, capsys):
    assert main([str(job), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and lines[5].startswith("5\t") and "fedprox" in lines[5]


def test_a_point_runs_by_array_task_id_once(job, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    assert main([str(job), "--results-root", str(tmp_path / "results")]) == 0
    result = read_run(tmp_path / "results" / "grid" / "sweep-fedprox-0.1-seed1.h5")
    assert result.attrs["status"] == "completed"
    assert result.attrs["config"]["algorithm"]["name"] == "fedprox" and result.attrs["config"]["run"]["seed"] == 1
    capsys.readouterr()
    assert main([str(job), "--results-root", str(tmp_path / "results")]) == 0     # re-submitted: skipped
    assert "already complete" in capsys.readouterr().out


def test_a_task_refuses_a_job_file_edited_since_the_sweep_was_submitted(job, tmp_path, capsys):
    submitted = digest(str(job))
    job.write_text(SWEEP.replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))          # point 5 is another point now
    assert main([str(job), "--index", "5", "--job-digest", submitted, "--results-root", str(tmp_path)]) == 2
    assert f"{job} changed since the sweep was submitted" in capsys.readouterr().err
    assert not (tmp_path / "grid").exists()
    assert main([str(job), "--index", "5", "--job-digest", digest(str(job)), "--results-root", str(tmp_path)]) == 0
    assert (tmp_path / "grid" / "sweep-fedavg-0.5-seed2.h5").is_file()                # the file as it is now


def test_bad_sweeps_and_direct_launches_are_refused_by_name(job, tmp_path, capsys):
    assert main([str(job), "--index", "8"]) == 2
    assert "0..7" in capsys.readouterr().err
    assert launch([str(job)]) == 2
    assert "`hpcfl sweep " in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP.replace('seeds = [0, 1]', 'seeds = "0"'))
    assert main([str(bad), "--list"]) == 2
    assert "sweep.seeds" in capsys.readouterr().err
    misspelt = tmp_path / "misspelt.toml"
    misspelt.write_text(SWEEP.replace('"data.partition_params.beta"', '"data.partition_params.bta"'))
    assert main([str(misspelt), "--list"]) == 2                   # checked as each point's run will, not listed
    assert "point 0 (" in (err := capsys.readouterr().err) and "partition_params.bta" in err


ARMS = {"FedAvg": {"algorithm.name": "fedavg"},
        "FedProx": {"algorithm.name": "fedprox", "algorithm.params": {"mu": 0.01}}}


def test_arms_set_their_keys_together_outermost_and_label_the_run(job):
    raw = read_job_file(job)
    raw["sweep"] = {"seeds": [0, 1], "grid": {"data.partition_params.beta": [0.1, 0.5]}, "arms": ARMS}
    todo = points(raw)
    assert len(todo) == 8
    assert todo[0] == ['algorithm.name="fedavg"', 'run.arm="FedAvg"', "data.partition_params.beta=0.1", "run.seed=0",
                       'run.name="sweep-FedAvg-0.1-seed0"']
    assert todo[4] == ['algorithm.name="fedprox"', "algorithm.params={mu = 0.01}", 'run.arm="FedProx"',
                       "data.partition_params.beta=0.1", "run.seed=0", 'run.name="sweep-FedProx-0.1-seed0"']
    assert todo[7][-1] == 'run.name="sweep-FedProx-0.5-seed1"'


@pytest.mark.parametrize("arms, message", [
    ({"FedAvg": {"data.partition_params.beta": 0.1}}, "which sweep.grid varies too"),
    ({"Fed Avg": {"algorithm.name": "fedavg"}}, "letters, digits"),
    ({"FedAvg": {"run.arm": "x"}}, "sets run.arm itself"),
    ({"FedAvg": "fedavg"}, "tables of config keys"),
    ({"FedProx": {"algorithm": {"name": "fedprox"}}}, "sets 'algorithm', a whole table"),     # unquoted dotted key
    ({"X": {"run": {"arm": "x"}}}, "sets 'run', a whole table")])
def test_bad_arms_are_refused_by_name(job, arms, message):
    raw = read_job_file(job)
    raw["sweep"] = {"seeds": [0], "grid": {"data.partition_params.beta": [0.1]}, "arms": arms}
    with pytest.raises(ConfigError, match=message):
        points(raw)


def test_an_arm_naming_a_plug_in_term_in_table_form_runs_with_its_parameters(job, tmp_path):
    """The term's import path "labfl.term:Centring" is one key: quoted when the arm becomes --set overrides,
    not split on its dots (which gave "algorithm.terms must be a table" at --index, while --list looked fine)."""
    job.write_text(SWEEP.replace('seeds = [0, 1]\ngrid = { "algorithm.name" = ["fedavg", "fedprox"], ', 'seeds = [0]\n'
                                 'grid = { ').replace("[0.1, 0.5]", "[0.5]")
                   + '[sweep.arms.Centred]\n"algorithm.terms" = { "labfl.term:Centring" = { weight = 0.02 } }\n')
    assert points(read_job_file(job))[0][0] == 'algorithm.terms={"labfl.term:Centring" = {weight = 0.02}}'
    assert main([str(job), "--index", "0", "--results-root", str(tmp_path / "results")]) == 0
    config = read_run(tmp_path / "results" / "grid" / "sweep-Centred-0.5-seed0.h5").attrs["config"]
    assert config["algorithm"]["terms"] == {"labfl.term:Centring": {"weight": 0.02}}


@pytest.mark.parametrize("value", [True, 3, 0.25, 'say "hi"', [0.1, [1, 2]], {"mu": 0.01, "pkg.mod:T": {"w": [1]}},
                                   "caf\U0001f600", "\U00020000 a\x7fb\\c\nd", {"k\U0001f600": "é"}])
def test_a_sweep_value_is_written_as_the_toml_that_reads_it_back(value):
    """Characters past U+FFFF too (JSON's ASCII escape pairs for them are no TOML), and DEL."""
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


def test_a_value_toml_cannot_hold_is_refused():
    with pytest.raises(ConfigError, match="sweep value None has no TOML form"):
        toml_value(None)


@pytest.mark.parametrize("sweep, message", [
    (3, r"\[sweep\] must be a table"), ({"gird": {}}, r"\[sweep\] must be a table with `grid`"),
    ({"grid": {"train.lr": []}}, "sweep.grid must map each config key to a non-empty list"),
    ({"grid": {"train.lr": 0.1}}, "sweep.grid must map each config key to a non-empty list"),
    ({"grid": [1]}, "sweep.grid must map"), ({"seeds": [True]}, "sweep.seeds must be a non-empty list of integers"),
    ({"seeds": []}, "sweep.seeds must be a non-empty list")])
def test_a_malformed_sweep_table_is_refused_by_name(sweep, message):
    with pytest.raises(ConfigError, match=message):
        points({"sweep": sweep})


@pytest.mark.parametrize("sweep", [{"seeds": [0, 0]}, {"grid": {"train.lr": [0.1, 0.1]}},
                                   {"grid": {"data.partition": ["a b", "a_b"]}}])      # both label as a_b
def test_points_that_would_share_a_result_file_are_refused(sweep):
    with pytest.raises(ConfigError, match="sweep points share a result file"):
        points({"sweep": sweep})


@pytest.mark.parametrize("sweep, message", [
    ({"grid": {"run.seed": [5, 6]}}, "varies run.seed, which it sets on every point itself: list seeds in sweep.seeds"),
    ({"grid": {"run.name": ["a", "b"]}}, "varies run.name, which it sets on every point itself"),
    ({"arms": {"A": {"run.seed": 1}, "B": {"run.seed": 2}}}, "varies run.seed"),
    ({"grid": {"run.threads": [1, 2]}}, "sweep.grid varies run.threads, which cannot change a run's numbers, so the "
                                        "analysis would pool its values as more seeds of one group: vary it in "
                                        r"sweep.arms")])
def test_keys_the_sweep_sets_itself_or_the_analysis_would_pool_are_not_varied(sweep, message):
    with pytest.raises(ConfigError, match=message):
        points({"sweep": sweep})
    if "arms" not in sweep:
        assert len(points({"sweep": {"arms": {k: {"run.threads": 2}
                                               for k in ("A", "B")}}})) == 2       # in arms, run.arm keeps them apart


def test_points_in_different_studies_may_share_a_name():
    assert len(points({"sweep": {"grid": {"run.study": ["a b", "a_b"]}}})) == 2


def test_run_options_are_checked_before_anything_runs_or_is_submitted(job, tmp_path, sbatch, capsys):
    """A --set of a key the sweep sets would send every point to one file; a misplaced sbatch option
    would fail in every array task after its wait in the queue."""
    for args, message in ((["--set", "run.seed=3"], "--set run.seed: the sweep sets it on each point"),
                          (["--set", 'run.name="x"'], "--set run.name: the sweep sets it"),
                          (["--set", "algorithm.name='scaffold'"], "--set algorithm.name: the sweep sets it"),
                          (["--set", "algorithm={name = 'fedavg'}"], "--set algorithm: the sweep sets it on each "
                                                                     "point, or a key inside it"),
                          (["--set", "data.partition_params={beta = 9.0}"], "--set data.partition_params: the sweep"),
                          (["--ntasks=3"], "--ntasks=3: not options of a run (hpcfl run --help); sbatch's go after")):
        for mode in (["--submit", "--script", str(job)], ["--index", "0"]):
            assert main([str(job), *mode, *args]) == 2
            assert message in (err := capsys.readouterr().err)
            assert "usage:" not in err                      # one hpcfl error, not argparse's usage block first
    assert "(argparse: unrecognized arguments: --ntasks=3)" in err
    assert not sbatch.exists()
    rooted = tmp_path / "rooted.toml"            # arms with results roots of their own: --results-root clashes
    rooted.write_text('[sweep]\nseeds = [0]\n[sweep.arms.A]\n"run.results_root" = "rootA"\n'
                      '[sweep.arms.B]\n"run.results_root" = "rootB"\n')
    assert main([str(rooted), "--list", "--results-root", str(tmp_path / "x")]) == 2
    assert "--results-root (run.results_root): the sweep sets it on each point" in capsys.readouterr().err
    assert main([str(job), "--submit", "--script", str(job), "--set", "train.lr=0.05", "--", "--ntasks=3"]) == 0
    assert sbatch.read_text().split()[-5:] == [str(job), "--job-digest", digest(str(job)), "--set", "train.lr=0.05"]


def test_every_point_is_checked_before_the_array_is_submitted(job, tmp_path, sbatch, capsys):
    """A key or value only a point has (its grid's, or a run option's with it) is refused before sbatch,
    naming the point, not in each array task after its wait in the queue."""
    typo = tmp_path / "typo.toml"
    typo.write_text(SWEEP.replace('"algorithm.name" = ["fedavg", "fedprox"]', '"train.lrr" = [0.1, 0.2]'))
    assert main([str(typo), "--submit", "--script", str(job)]) == 2
    assert "point 0 (run.name=\"sweep-0.1-0.1-seed0\"): unknown key(s) ['lrr'] in [train]" in capsys.readouterr().err
    assert main([str(job), "--submit", "--script", str(job), "--set", "data.partition_params.alpha=1"]) == 2
    assert "point 0 (run.name=\"sweep-fedavg-0.1-seed0\"): " in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP.replace("[0.1, 0.5]", "[0.1, -1.0]"))
    assert main([str(bad), "--submit", "--script", str(job)]) == 2
    assert "point 2 (run.name=\"sweep-fedavg--1.0-seed0\"): data.partition_params.beta" in capsys.readouterr().err
    assert not sbatch.exists()


def test_without_seeds_a_sweep_runs_the_jobs_own_seed():
    assert points({"run": {"seed": 4}, "sweep": {"grid": {"train.lr": [0.1]}}})[0][1:] == [
        "run.seed=4", 'run.name="sweep-0.1-seed4"']
    assert points({"sweep": {"grid": {"train.lr": [0.1]}}})[0][1] == "run.seed=0"


def test_the_command_line_is_read_from_sys_argv_by_default(job, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["hpcfl-sweep", str(job), "--list"])
    assert main() == 0 and len(capsys.readouterr().out.splitlines()) == 8


@pytest.fixture
def sbatch(tmp_path, monkeypatch):
    """A stand-in `sbatch` on PATH that records its arguments (the last call's in "called", every call's in
    "calls") and exits with $FAKE_EXIT, and an `scontrol` that shows MaxArraySize = $FAKE_MAX_ARRAY."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "called"}\necho "$@" >> {tmp_path / "calls"}\n'
                    f'echo "$HPCFL_SLURM" > {tmp_path / "hpcfl_slurm"}\nexit "${{FAKE_EXIT:-0}}"\n')
    (fake.parent / "scontrol").write_text('#!/bin/sh\necho "MaxJobCount             = 10000"\n'
                                          'echo "MaxArraySize            = ${FAKE_MAX_ARRAY:-1001}"\n')
    for tool in fake.parent.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    return tmp_path / "called"


def test_submit_takes_the_script_from_hpcfl_slurm_then_slurm_here_and_returns_sbatchs_status(job, tmp_path, sbatch,
                                                                                              capsys, monkeypatch):
    site, here = tmp_path / "site", tmp_path / "work"
    for folder in (site, here / "slurm"):
        folder.mkdir(parents=True)
        (folder / "sweep.sbatch").write_text("#!/bin/bash\n")
    monkeypatch.chdir(here)
    monkeypatch.setenv("HPCFL_SLURM", str(site))
    assert main([str(job), "--submit"]) == 0
    assert sbatch.read_text().split() == ["--array=0-7", str(site / "sweep.sbatch"), str(job), "--job-digest",
                                          digest(str(job))]
    monkeypatch.delenv("HPCFL_SLURM")
    monkeypatch.setenv("FAKE_EXIT", "3")
    assert main([str(job), "--submit", "--max-concurrent", "0", "--", "--time=5"]) == 3   # 0: no limit; sbatch's status
    assert sbatch.read_text().split() == ["--array=0-7", "--time=5", "slurm/sweep.sbatch", str(job), "--job-digest",
                                          digest(str(job))]
    assert "hpcfl: 8 points: sbatch --array=0-7 --time=5 slurm/sweep.sbatch" in capsys.readouterr().out
    (here / "slurm" / "sweep.sbatch").unlink()
    monkeypatch.delenv("FAKE_EXIT")
    assert main([str(job), "--submit"]) == 0                                     # the one hpcfl ships
    assert sbatch.read_text().split()[1] == str(TEMPLATES / "slurm" / "sweep.sbatch")


def test_a_linked_batch_script_finds_site_sh_in_its_own_folder(job, tmp_path, sbatch, monkeypatch):
    """slurm/sweep.sbatch may be a link to hpcfl's own; slurm/site.sh beside the link is this site's."""
    here = tmp_path / "work" / "slurm"
    here.mkdir(parents=True)
    (here / "sweep.sbatch").symlink_to(TEMPLATES / "slurm" / "sweep.sbatch")
    monkeypatch.chdir(here.parent)
    assert main([str(job), "--submit"]) == 0
    assert (tmp_path / "hpcfl_slurm").read_text().strip() == str(here)


def test_submit_refuses_a_negative_limit_and_says_where_sbatch_is_missing(job, tmp_path, capsys, monkeypatch):
    script = tmp_path / "sweep.sbatch"
    assert main([str(job), "--submit", "--script", str(script)]) == 2
    assert f"batch script {script} does not exist: pass --script PATH" in capsys.readouterr().err
    script.write_text("#!/bin/bash\n")
    assert main([str(job), "--submit", "--script", str(script), "--max-concurrent", "-1"]) == 2
    assert "--max-concurrent -1 must be >= 1 (0: no limit)" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main([str(job), "--submit", "--script", str(script)]) == 2
    assert "sbatch is not on PATH: submit from a SLURM login node" in capsys.readouterr().err


def test_the_array_lists_runs_of_indices_as_ranges():
    assert [array_spec(i) for i in ([0, 1, 2, 3], [0, 1, 2, 3, 5, 7, 8, 9], [4], [1, 3])] == ["0-3", "0-3,5,7-9", "4",
                                                                                             "1,3"]


def test_points_past_the_clusters_max_array_size_go_in_more_arrays_each_task_to_its_point(job, tmp_path, sbatch,
                                                                                           capsys, monkeypatch):
    """SLURM refuses an array task id >= MaxArraySize: 8 points under MaxArraySize 3 are 3 arrays, task t of
    the one with --index-base B runs point B + t; where all ids fit, one array without a base."""
    assert [arrays(i, 3) for i in ([0, 1, 2], [1, 2, 4, 5, 6, 9], [3, 4], [5])] == [
        [(0, [0, 1, 2])], [(0, [1, 2]), (4, [0, 1, 2]), (9, [0])], [(3, [0, 1])], [(5, [0])]]    # ids 0..2 only
    monkeypatch.setenv("FAKE_MAX_ARRAY", "3")
    assert main([str(job), "--submit", "--script", str(job), "--max-concurrent", "2"]) == 0
    calls = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
    assert [(c[0], c[5:]) for c in calls] == [("--array=0-2%2", []), ("--array=0-2%2", ["--index-base", "3"]),
                                              ("--array=0-1%2", ["--index-base", "6"])]
    out = capsys.readouterr().out
    assert "hpcfl: 8 points (array 1 of 3): sbatch --array=0-2%2 " in out
    assert "hpcfl: 8 points (array 3 of 3): sbatch --array=0-1%2 " in out
    results = ["--results-root", str(tmp_path / "results")]
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert main([str(job), "--index-base", "3", *results]) == 0                 # point 5
    assert read_run(tmp_path / "results" / "grid" / "sweep-fedprox-0.1-seed1.h5").attrs["status"] == "completed"
    monkeypatch.setenv("FAKE_EXIT", "4")                                          # a failing sbatch stops the rest
    monkeypatch.setenv("FAKE_MAX_ARRAY", "5")
    assert main([str(job), "--submit", "--script", str(job), *results]) == 4
    assert len((tmp_path / "calls").read_text().splitlines()) == 4
    assert "hpcfl: 8 points, 1 complete (array 1 of 2): sbatch --array=0-4 " in capsys.readouterr().out
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert max_array_size() == 1001                                                 # SLURM's default without scontrol


def test_a_resubmitted_sweep_asks_only_for_the_points_not_complete(job, tmp_path, sbatch, capsys):
    results = ["--results-root", str(tmp_path / "results")]
    assert main([str(job), "--index", "5", *results]) == 0
    capsys.readouterr()
    assert main([str(job), "--submit", "--script", str(job), *results]) == 0
    assert sbatch.read_text().split()[0] == "--array=0-4,6-7"
    assert "hpcfl: 8 points, 1 complete: sbatch --array=0-4,6-7 " in capsys.readouterr().out
    assert main([str(job), "--submit", "--script", str(job), *results, "--set", "train.lr=0.2"]) == 0
    assert sbatch.read_text().split()[0] == "--array=0-7"            # another configuration: its task says so
    one = tmp_path / "one.toml"
    one.write_text(SWEEP.replace("seeds = [0, 1]", "seeds = [1]").replace('["fedavg", "fedprox"]', '["fedprox"]')
                   .replace("[0.1, 0.5]", "[0.1]"))
    sbatch.unlink()
    assert main([str(one), "--submit", "--script", str(job), *results]) == 0
    assert "hpcfl: 1 points, 1 complete: nothing to submit" in capsys.readouterr().out and not sbatch.exists()

