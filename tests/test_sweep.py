"""Sweeps: a grid times seeds expands deterministically into named points; a point runs by index or
by SLURM array task id, writes its own result file, and is skipped once complete."""
import pytest

from hpcfl.config import read_job_file
from hpcfl.errors import ConfigError
from hpcfl.launch import main as launch
from hpcfl.metrics import read_run
from hpcfl.sweep import main, points

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


def test_bad_sweeps_and_direct_launches_are_refused_by_name(job, tmp_path, capsys):
    assert main([str(job), "--index", "8"]) == 2
    assert "0..7" in capsys.readouterr().err
    assert launch([str(job)]) == 2
    assert "`hpcfl sweep " in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP.replace('seeds = [0, 1]', 'seeds = "0"'))
    assert main([str(bad), "--list"]) == 2
    assert "sweep.seeds" in capsys.readouterr().err


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
    ({"FedAvg": "fedavg"}, "tables of config keys")])
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
