"""Tables and figures from result files written here with known numbers: seed aggregation and
grouping, final vs best, rounds to a target and the speed-up, personalised accuracy, the forgetting
degree per class, time and bytes, the three renderings, curves and the partition heat map, and a
folder mixing complete, unfinished and corrupt files."""
import numpy as np
import pytest

from hpcfl.analysis import load, render, rounds_to_target, summary, tidy
from hpcfl.analysis.tables import forgetting, time_and_bytes
from hpcfl.analyze import main
from hpcfl.metrics import Recorder

CURVES = {("fedavg", 0.1, 0): [0.2, 0.5, np.nan, 0.6], ("fedavg", 0.1, 1): [0.3, 0.4, np.nan, 0.8],
          ("fedprox", 0.1, 0): [0.5, 0.9, np.nan, 0.7], ("fedprox", 0.1, 1): [0.6, 0.7, np.nan, 0.9],
          ("fedavg", 0.5, 0): [0.1, 0.2, np.nan, 0.3]}


def _write(folder, algorithm, beta, seed, curve, status="completed"):
    config = {"run": {"seed": seed, "name": f"{algorithm}-{beta}-{seed}"}, "algorithm": {"name": algorithm},
              "data": {"partition": "dirichlet", "partition_params": {"beta": beta}}}
    path = folder / f"{algorithm}-{beta}-{seed}.h5"
    with Recorder.create(path, {"config": config}) as recorder:
        recorder.write_array("partition", np.array([[5, 0, 1], [0, 3, 3]]))
        for round, value in enumerate(curve):
            recorder.append_round(round, {
                "round/test_acc": value, "round/train_loss": 1.0 - value,
                "round/personal_acc_mean": value + 0.1, "round/personal_acc_std": 0.01 * (seed + 1),
                "client_class/forgetting": np.array([[0.2, np.nan], [0.4, 0.1 * seed]]),      # client x class
                "round/phase_s/train": 2.0 + seed, "rank/compute_s": np.array([1.0, 3.0]), "rank/wait_s": np.array([0.5, 0.0]),
                "round/bytes_down/model": 1e6, "round/bytes_up/model": 2e6})
        if status:
            recorder.set_attr("status", status)
    return path


@pytest.fixture
def folder(tmp_path):
    for (algorithm, beta, seed), curve in CURVES.items():
        _write(tmp_path, algorithm, beta, seed, curve)
    return tmp_path


def test_final_and_best_are_aggregated_over_seeds_per_group(folder):
    table = summary(load([folder]), ["algorithm.name", "data.partition_params.beta"])
    rows = {(r["algorithm.name"], r["data.partition_params.beta"]): r for r in table.to_dict("records")}
    fedavg = rows[("fedavg", 0.1)]
    assert fedavg["runs"] == 2
    assert fedavg["final_mean"] == pytest.approx(0.7) and fedavg["final_std"] == pytest.approx(0.1)   # 0.6, 0.8
    assert fedavg["best_mean"] == pytest.approx(0.7)
    fedprox = rows[("fedprox", 0.1)]
    assert fedprox["final_mean"] == pytest.approx(0.8) and fedprox["best_mean"] == pytest.approx(0.9)  # best 0.9, 0.9
    assert fedprox["best_std"] == pytest.approx(0.0)
    assert rows[("fedavg", 0.5)]["runs"] == 1 and rows[("fedavg", 0.5)]["final_mean"] == pytest.approx(0.3)


def test_rounds_to_target_and_speedup_over_a_baseline(folder):
    table = rounds_to_target(load([folder]), 0.5, ["algorithm.name"], baseline={"algorithm.name": "fedavg"})
    rows = {r["algorithm.name"]: r for r in table.to_dict("records")}
    # fedavg: seed 0 reaches 0.5 in round 2, seed 1 in round 4 (0.4 < 0.5), beta 0.5 never -> mean 3 over 2
    assert rows["fedavg"]["runs"] == 3 and rows["fedavg"]["reached"] == 2 and rows["fedavg"]["rounds_mean"] == 3.0
    assert rows["fedprox"]["rounds_mean"] == 1.0 and rows["fedprox"]["speedup"] == pytest.approx(3.0)
    assert rows["fedavg"]["speedup"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="baseline"):
        rounds_to_target(load([folder]), 0.5, ["algorithm.name"], baseline={"algorithm.name": "scaffold"})


def test_tidy_has_one_row_per_run_round_metric(folder):
    long = tidy(load([folder], metrics=("round/test_acc", "round/train_loss")))
    assert len(long) == 5 * 4 * 2
    row = long[(long["run.seed"] == 1) & (long["algorithm.name"] == "fedprox") & (long["round"] == 3)
               & (long["metric"] == "round/train_loss")]
    assert row["value"].item() == pytest.approx(0.1)


def test_renderings_carry_the_numbers(folder):
    table = summary(load([folder]), ["algorithm.name"])
    assert "| fedprox | 2 | 0.8000 ± 0.1000 | 0.9000 ± 0.0000 |" in render(table, "md")
    assert r"fedprox & 2 & 0.8000 $\pm$ 0.1000" in render(table, "latex")
    assert "fedprox,2,0.8" in render(table, "csv").replace("0.8000000000000000", "0.8")


def test_a_mixed_folder_reports_unfinished_and_corrupt_files_by_name(folder, capsys):
    _write(folder, "scaffold", 0.1, 0, [0.4, 0.45], status=None)                # still running (or killed)
    (folder / "broken.h5").write_bytes(b"not hdf5 at all")
    whole = (folder / "fedavg-0.5-0.h5").read_bytes()
    (folder / "truncated.h5").write_bytes(whole[:len(whole) // 2])
    assert main(["table", str(folder), "--by", "algorithm.name"]) == 0
    captured = capsys.readouterr()
    assert "broken.h5" in captured.err and "truncated.h5" in captured.err
    assert "scaffold-0.1-0.h5 is running (2 rounds committed)" in captured.err
    assert "| scaffold | 1 | 0.4500 ± 0.0000 |" in captured.out
    assert main(["table", str(folder / "broken.h5")]) == 2
    assert main(["table", str(folder), "--by", "no.such.key"]) == 2


def test_default_grouping_is_every_key_that_varies_but_the_seed(folder, capsys):
    assert main(["table", str(folder), "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("algorithm.name,data.partition_params.beta,runs")


def test_personalised_accuracy_across_clients(folder, capsys):
    assert main(["personal", str(folder), "--by", "algorithm.name", "--format", "csv"]) == 0
    rows = {line.split(",")[0]: line.split(",") for line in capsys.readouterr().out.splitlines()[1:]}
    # fedprox: final personal means 0.8 and 1.0 -> 0.9; stds 0.01 and 0.02 across clients -> 0.015
    assert float(rows["fedprox"][2]) == pytest.approx(0.9) and float(rows["fedprox"][3]) == pytest.approx(0.015)


def test_forgetting_degree_per_class(folder):
    table = forgetting(load([folder], metrics=("client_class/forgetting",)), ["algorithm.name"])
    fedprox = table[table["algorithm.name"] == "fedprox"].iloc[0]
    # class 0: 0.2 and 0.4 every round -> 0.3; class 1: NaN and 0.1 * seed -> 0 (seed 0), 0.1 (seed 1) -> 0.05
    assert fedprox["class 0"] == pytest.approx(0.3) and fedprox["class 1"] == pytest.approx(0.05)
    assert fedprox["all classes"] == pytest.approx(0.175)


def test_time_and_bytes(folder):
    table = time_and_bytes(load([folder], metrics=(), prefixes=("round/phase_s/", "rank/", "round/bytes_")),
                           ["algorithm.name"])
    fedprox = table[table["algorithm.name"] == "fedprox"].iloc[0]
    assert fedprox["train s"] == pytest.approx(2.5)                      # seeds 0, 1: 2 and 3 s per round
    assert fedprox["compute_s (all ranks)"] == pytest.approx(4.0) and fedprox["wait_s (all ranks)"] == pytest.approx(0.5)
    assert fedprox["down/model MB"] == pytest.approx(4.0) and fedprox["up/model MB"] == pytest.approx(8.0)


@pytest.mark.parametrize("x", ["round", "bytes"])
def test_curves_and_the_partition_heat_map_are_drawn(folder, tmp_path, x):
    out = tmp_path / f"curves-{x}.png"
    assert main(["curves", str(folder), "--by", "algorithm.name", "--x", x, "--out", str(out)]) == 0
    assert out.stat().st_size > 5000 and out.read_bytes()[:4] == b"\x89PNG"
    heat = tmp_path / "partition.svg"
    assert main(["partition", str(folder / "fedavg-0.1-0.h5"), "--out", str(heat)]) == 0
    assert b"<svg" in heat.read_bytes()[:500]
