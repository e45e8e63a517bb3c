"""Tables and figures from result files written here with known numbers: seed aggregation and
grouping, final vs best, rounds to a target and the speed-up, personalised accuracy, the forgetting
degree per class, time and bytes, the three renderings, curves and the partition heat map, and a
folder mixing complete, unfinished and corrupt files."""
import warnings

import numpy as np
import pandas as pd
import pytest

from hpcfl.analysis import load, render, rounds_to_target, summary, tidy
from hpcfl.analysis.paired import compare
from hpcfl.analysis.results import MISSING, bytes_exchanged, mixed_keys, shown, truncate
from hpcfl.analysis.tables import forgetting, statistic, time_and_bytes
from hpcfl.analyze import main
from hpcfl.metrics import Recorder

CURVES = {("fedavg", 0.1, 0): [0.2, 0.5, np.nan, 0.6], ("fedavg", 0.1, 1): [0.3, 0.4, np.nan, 0.8],
          ("fedprox", 0.1, 0): [0.5, 0.9, np.nan, 0.7], ("fedprox", 0.1, 1): [0.6, 0.7, np.nan, 0.9],
          ("fedavg", 0.5, 0): [0.1, 0.2, np.nan, 0.3]}


def _write(folder, name, beta, seed, curve, status="completed", val=None, **sections):
    """A run of algorithm `name` with `sections` added to its config ({section: {key: value}})."""
    config = {"run": {"seed": seed, "name": f"{name}-{beta}-{seed}"}, "algorithm": {"name": name},
              "data": {"partition": "dirichlet", "partition_params": {"beta": beta}}}
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    keys = "".join(f"-{k}={v}" for t in sections.values() for k, v in t.items())
    path = folder / f"{name}-{beta}-{seed}{keys}.h5"
    with Recorder.create(path, {"config": config}) as recorder:
        recorder.write_array("partition", np.array([[5, 0, 1], [0, 3, 3]]))
        for round, value in enumerate(curve):
            recorder.append_round(round, {
                "round/test_acc": value, "round/train_loss": 1.0 - value,
                "round/personal_acc_mean": value + 0.1, "round/personal_acc_std": 0.01 * (seed + 1),
                "client_class/forgetting": np.array([[0.2, np.nan], [0.4, 0.1 * seed]]),      # client x class
                "round/phase_s/train": 2.0 + seed,
                "rank/compute_s": np.array([1.0, 3.0]), "rank/wait_s": np.array([0.5, 0.0]),
                "round/bytes_down/model": 1e6, "round/bytes_up/model": 2e6,
                **({} if val is None else {"round/val_acc": val[round]})})
        if status:
            recorder.set_attr("status", status)
    return path


@pytest.fixture
def folder(tmp_path):
    for (algorithm, beta, seed), curve in CURVES.items():
        _write(tmp_path, algorithm, beta, seed, curve)
    return tmp_path


def test_final_and_last_k_are_aggregated_over_seeds_per_group(folder):
    table = summary(load([folder]), ["algorithm.name", "data.partition_params.beta"], last=2)
    rows = {(r["algorithm.name"], r["data.partition_params.beta"]): r for r in table.to_dict("records")}
    fedavg = rows[("fedavg", 0.1)]
    assert fedavg["runs"] == 2
    assert fedavg["final_mean"] == pytest.approx(0.7) and fedavg["final_std"] == pytest.approx(0.1)   # 0.6, 0.8
    # last 2 evaluations (round 3 is not evaluated): (0.5 + 0.6) / 2 = 0.55 and (0.4 + 0.8) / 2 = 0.6
    assert fedavg["last2_mean"] == pytest.approx(0.575) and fedavg["last2_std"] == pytest.approx(0.025)
    fedprox = rows[("fedprox", 0.1)]
    assert fedprox["final_mean"] == pytest.approx(0.8) and fedprox["last2_mean"] == pytest.approx(0.8)  # 0.8, 0.8
    assert fedprox["last2_std"] == pytest.approx(0.0)
    assert rows[("fedavg", 0.5)]["runs"] == 1 and rows[("fedavg", 0.5)]["final_mean"] == pytest.approx(0.3)
    assert not any(c.startswith(("best", "max")) for c in table.columns)    # no column selects on test accuracy
    assert "last10_mean" in summary(load([folder]), ["algorithm.name"]).columns


def test_the_test_accuracy_is_taken_at_the_best_validation_round(tmp_path):
    # round:            0    1    2       3
    test, val = [0.50, 0.70, np.nan, 0.90], [0.60, 0.80, np.nan, 0.75]   # best val: round 1 -> test 0.70
    _write(tmp_path, "fedavg", 0.1, 0, test, val=val)
    _write(tmp_path, "fedavg", 0.1, 1, [0.4, 0.6, 0.2, 0.5], val=[0.3, 0.7, 0.9, 0.7])   # round 2 -> 0.2
    table = summary(load([tmp_path], metrics=("round/test_acc", "round/val_acc")), ["algorithm.name"])
    row = table.iloc[0]
    assert row["best_val_mean"] == pytest.approx(0.45) and row["best_val_std"] == pytest.approx(0.25)
    assert row["final_mean"] == pytest.approx(0.7)
    tie = {"round/test_acc": np.array([0.1, 0.2, 0.3]), "round/val_acc": np.array([0.5, 0.5, 0.4])}
    assert statistic(tie, "best_val", "round/test_acc") == pytest.approx(0.1)     # the first of tied rounds
    assert np.isnan(statistic({"round/test_acc": np.array([0.5])}, "best_val", "round/test_acc"))
    with pytest.raises(ValueError, match="target"):
        statistic(tie, "rounds", "round/test_acc")
    with pytest.raises(ValueError, match="statistic 'best'"):
        statistic(tie, "best", "round/test_acc")


def test_rounds_to_target_and_speedup_over_a_baseline(folder):
    table = rounds_to_target(load([folder]), 0.5, ["algorithm.name"], baseline={"algorithm.name": "fedavg"})
    rows = {r["algorithm.name"]: r for r in table.to_dict("records")}
    # fedavg: seed 0 reaches 0.5 in round 2, seed 1 in round 4 (0.4 < 0.5), beta 0.5 never -> mean 3 over 2
    assert rows["fedavg"]["runs"] == 3 and rows["fedavg"]["reached"] == 2 and rows["fedavg"]["rounds_mean"] == 3.0
    assert rows["fedprox"]["rounds_mean"] == 1.0 and rows["fedprox"]["speedup"] == pytest.approx(3.0)
    assert rows["fedavg"]["speedup"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="baseline"):
        rounds_to_target(load([folder]), 0.5, ["algorithm.name"], baseline={"algorithm.name": "scaffold"})


def test_each_groups_speedup_is_over_the_baseline_that_shares_its_other_keys(tmp_path):
    for (algorithm, beta), curve in {("fedavg", 0.1): [0.1, 0.2, 0.3, 0.6], ("fedavg", 0.5): [0.1, 0.6, 0.6, 0.6],
                                     ("fedprox", 0.1): [0.1, 0.6, 0.6, 0.6],
                                     ("fedprox", 0.5): [0.6, 0.6, 0.6, 0.6]}.items():
        _write(tmp_path, algorithm, beta, 0, curve)
    _write(tmp_path, "fedprox", 0.1, 1, [0.9, 0.9], status=None)        # still running: no figure, counted
    by = ["algorithm.name", "data.partition_params.beta"]
    table = rounds_to_target(load([tmp_path]), 0.5, by, baseline={"algorithm.name": "fedavg"})
    rows = {(r["algorithm.name"], r["data.partition_params.beta"]): r for r in table.to_dict("records")}
    assert {k: r["rounds_mean"] for k, r in rows.items()} == {("fedavg", 0.1): 4, ("fedavg", 0.5): 2,
                                                              ("fedprox", 0.1): 2, ("fedprox", 0.5): 1}
    assert {k: r["speedup"] for k, r in rows.items()} == {("fedavg", 0.1): 1, ("fedavg", 0.5): 1,   # 4/4, 2/2
                                                          ("fedprox", 0.1): 2, ("fedprox", 0.5): 2}  # 4/2, 2/1
    assert rows[("fedprox", 0.1)]["runs"] == 2 and rows[("fedprox", 0.1)]["reached"] == 1
    assert rows[("fedprox", 0.1)]["unfinished"] == 1 and rows[("fedavg", 0.1)]["unfinished"] == 0
    with pytest.raises(ValueError, match="'algorithm.name' is not a grouping key"):
        rounds_to_target(load([tmp_path]), 0.5, by[1:], baseline={"algorithm.name": "fedavg"})
    with pytest.raises(ValueError, match="falling loss"):
        rounds_to_target(load([tmp_path], metrics=("round/train_loss",)), 0.5, by, metric="round/train_loss")


def test_tidy_has_one_row_per_run_round_metric(folder):
    long = tidy(load([folder], metrics=("round/test_acc", "round/train_loss")))
    assert len(long) == 5 * 4 * 2
    row = long[(long["run.seed"] == 1) & (long["algorithm.name"] == "fedprox") & (long["round"] == 3)
               & (long["metric"] == "round/train_loss")]
    assert row["value"].item() == pytest.approx(0.1) and row["index"].item() == -1


def test_tidy_gives_a_row_per_rank_and_per_client_and_class(folder):
    long = tidy(load([folder / "fedavg-0.1-1.h5"], metrics=("rank/compute_s", "client_class/forgetting")))
    ranks = long[long["metric"] == "rank/compute_s"]
    assert len(ranks) == 4 * 2 and list(ranks[ranks["round"] == 2]["index"]) == [0, 1]
    assert list(ranks[ranks["round"] == 2]["value"]) == [1.0, 3.0]
    forgetting = long[(long["metric"] == "client_class/forgetting") & (long["round"] == 0)]
    assert list(forgetting["index"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert np.allclose(forgetting["value"], [0.2, np.nan, 0.4, 0.1], equal_nan=True)


def test_tidy_puts_a_final_figure_at_the_last_round_and_gives_a_fixed_array_no_round(tmp_path):
    """final/* sits at the last committed round (3 of 0..3), beside that round's figures; partition
    (client x class) and example/local_test_sizes (per client) have no round, so a pivot on round
    leaves them out rather than spreading them over rounds 0, 1 as if they were series."""
    import h5py
    path = _write(tmp_path, "fedavg", 0.1, 0, [0.2, 0.5, np.nan, 0.6])
    with h5py.File(path, "a") as f:
        f["final/feature_nmi"], f["example/local_test_sizes"] = 0.75, np.array([4, 6])
        f["example/test_size"] = 10
    long = tidy(load([path], metrics=("round/test_acc", "final/feature_nmi", "partition", "example/local_test_sizes",
                                      "example/test_size")))
    final = long[long["metric"] == "final/feature_nmi"]
    assert list(final["round"]) == [3] and list(final["index"]) == [-1] and list(final["value"]) == [0.75]
    partition = long[long["metric"] == "partition"]
    assert partition["round"].isna().all() and list(partition["value"]) == [5, 0, 1, 0, 3, 3]
    assert list(partition["index"]) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    sizes = long[long["metric"] == "example/local_test_sizes"]
    assert sizes["round"].isna().all() and list(sizes["index"]) == [0, 1] and list(sizes["value"]) == [4, 6]
    test_size = long[long["metric"] == "example/test_size"]
    assert test_size["round"].isna().all() and list(test_size["index"]) == [-1] and list(test_size["value"]) == [10]
    wide = long.pivot_table(index="round", columns="metric", values="value")
    assert list(wide.columns) == ["final/feature_nmi", "round/test_acc"] and list(wide.index) == [0, 1, 3]
    assert wide.loc[3].tolist() == [0.75, 0.6]


def test_latex_escapes_every_special_character():
    table = pd.DataFrame({"run.arm": ["FedFM 10% & {x}", "a\\b #1 $2 ^3 ~4 _5"], "final_mean": [0.5, 0.25],
                          "final_std": [0.1, 0.0]})
    rows = render(table, "latex").splitlines()
    assert rows[2] == r"run.arm & final \\"
    assert rows[4] == r"FedFM 10\% \& \{x\} & 0.5000 $\pm$ 0.1000 \\"
    assert rows[5] == (r"a\textbackslash{}b \#1 \$2 \textasciicircum{}3 \textasciitilde{}4 \_5 & "
                       r"0.2500 $\pm$ 0.0000 \\")


def test_renderings_carry_the_numbers(folder):
    table = summary(load([folder]), ["algorithm.name"])
    md = render(table, "md").splitlines()         # fedprox last 10: (0.5+0.9+0.7)/3, (0.6+0.7+0.9)/3
    assert md[:2] == ["| algorithm.name | runs | final | last10 |", "|---|---|---|---|"]
    assert md[3] == "| fedprox | 2 | 0.8000 ± 0.1000 | 0.7167 ± 0.0167 |"
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
    assert ("scaffold-0.1-0.h5 is running, or was killed (`hpcfl status` tells which): 2 rounds committed"
            in captured.err)
    assert "| scaffold | 1 | 1 | nan ± nan |" in captured.out            # counted, but no figure of a cut series
    assert "| fedprox | 2 | 0 | 0.8000 ± 0.1000 |" in captured.out
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
    _write(folder, "fedprox", 0.1, 2, [0.1, 0.2], status=None)         # still running: counted, not averaged
    assert main(["personal", str(folder), "--by", "algorithm.name", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(",")[0]: line.split(",") for line in lines[1:]}
    assert lines[0] == "algorithm.name,runs,unfinished,personal_mean,std_across_clients"
    assert rows["fedprox"][1:3] == ["3", "1"] and float(rows["fedprox"][3]) == pytest.approx(0.9)


def test_forgetting_degree_per_class(folder):
    table = forgetting(load([folder], metrics=("client_class/forgetting",)), ["algorithm.name"])
    fedprox = table[table["algorithm.name"] == "fedprox"].iloc[0]
    # class 0: 0.2 and 0.4 every round -> 0.3; class 1: NaN and 0.1 * seed -> 0 (seed 0), 0.1 (seed 1) -> 0.05
    assert fedprox["class 0"] == pytest.approx(0.3) and fedprox["class 1"] == pytest.approx(0.05)
    assert fedprox["all classes"] == pytest.approx(0.175)


def test_a_class_without_test_examples_has_no_forgetting_and_leaves_the_all_classes_mean_to_the_others(tmp_path):
    with Recorder.create(tmp_path / "run.h5", {"config": {"run": {"seed": 0}, "algorithm": {"name": "fedka"}}}) as rec:
        rec.append_round(0, {"client_class/forgetting": np.array([[0.2, np.nan, 0.4], [0.4, np.nan, 0.2]])})
        rec.set_attr("status", "completed")
    row = forgetting(load([tmp_path], metrics=("client_class/forgetting",)), ["algorithm.name"]).iloc[0]
    assert np.isnan(row["class 1"]) and row["all classes"] == pytest.approx(0.3)


def test_time_and_bytes(folder):
    table = time_and_bytes(load([folder], metrics=(), prefixes=("round/phase_s/", "rank/", "round/bytes_")),
                           ["algorithm.name"])
    fedprox = table[table["algorithm.name"] == "fedprox"].iloc[0]
    assert fedprox["train s"] == pytest.approx(2.5)                      # seeds 0, 1: 2 and 3 s per round
    assert fedprox["compute_s (all ranks)"] == pytest.approx(4.0)
    assert fedprox["wait_s (all ranks)"] == pytest.approx(0.5)
    assert fedprox["down/model MB"] == pytest.approx(4.0) and fedprox["up/model MB"] == pytest.approx(8.0)


@pytest.mark.parametrize("x", ["round", "bytes"])
def test_curves_and_the_partition_heat_map_are_drawn(folder, tmp_path, x):
    out = tmp_path / f"curves-{x}.png"
    assert main(["curves", str(folder), "--by", "algorithm.name", "--x", x, "--out", str(out)]) == 0
    assert out.stat().st_size > 5000 and out.read_bytes()[:4] == b"\x89PNG"
    heat = tmp_path / "partition.svg"
    assert main(["partition", str(folder / "fedavg-0.1-0.h5"), "--out", str(heat)]) == 0
    assert b"<svg" in heat.read_bytes()[:500]


def _arms(folder, arms: dict, **sections):
    """One run per (arm, seed): `arms` maps algorithm -> its final accuracy per seed."""
    for algorithm, finals in arms.items():
        for seed, final in enumerate(finals):
            _write(folder, algorithm, 0.1, seed, [0.1, final], **sections)


def test_compare_pairs_seeds_and_gives_the_t_interval_and_a_verdict(tmp_path):
    _arms(tmp_path, {"fedavg": [0.50, 0.60, 0.55, 0.70, 0.65],
                     "fedprox": [0.52, 0.63, 0.56, 0.72, 0.68],      # +0.02 +0.03 +0.01 +0.02 +0.03
                     "scaffold": [0.45, 0.56, 0.50, 0.66, 0.61],     # -0.05 -0.04 -0.05 -0.04 -0.04
                     "moon": [0.55, 0.55, 0.60, 0.65, 0.70]})        # +0.05 -0.05 +0.05 -0.05 +0.05
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    rows = {r["algorithm.name"]: r for r in table.to_dict("records")}
    assert set(rows) == {"fedprox", "scaffold", "moon"} and unpaired == []
    fedprox = rows["fedprox"]
    # differences 0.02 0.03 0.01 0.02 0.03: mean 0.022, sample std 0.008367, t(0.975, 4) = 2.776445
    half = 2.776445 * 0.0083666 / np.sqrt(5)
    assert fedprox["n"] == 5 and fedprox["effect_mean"] == pytest.approx(0.022)
    assert fedprox["effect_std"] == pytest.approx(0.0083666, rel=1e-4)
    assert fedprox["ci95_low"] == pytest.approx(0.022 - half, rel=1e-4)
    assert fedprox["ci95_high"] == pytest.approx(0.022 + half, rel=1e-4)
    assert fedprox["verdict"] == "better" and rows["scaffold"]["verdict"] == "worse"
    assert rows["moon"]["verdict"] == "inconclusive" and rows["moon"]["effect_mean"] == pytest.approx(0.01)
    # unpaired, the same fedprox numbers could not be told from fedavg: pairing is what resolves them
    assert np.std([0.50, 0.60, 0.55, 0.70, 0.65], ddof=1) > 5 * fedprox["effect_std"]
    assert table.attrs["legend"].startswith("effect: mean ± sample std (ddof 1) over the pairs of seeds of arm - "
                                            "baseline; ci95:")
    named, _ = compare(load([tmp_path]), {"algorithm.name": "fedavg"}, by=["algorithm.name"])
    assert named.to_dict("records") == table.to_dict("records")        # the baseline key is never a group key


def test_compare_pairs_only_runs_of_the_same_split_and_ignores_keys_that_cannot_change_results(tmp_path):
    _arms(tmp_path, {"fedavg": [0.5, 0.6]}, run={"checkpoint_every": 5})
    _arms(tmp_path, {"fedprox": [0.6, 0.8]}, run={"checkpoint_every": 1, "round_timeout_s": 60.0})
    _write(tmp_path, "fedprox", 0.1, 2, [0.1, 0.9])                             # no fedavg of seed 2
    _write(tmp_path, "fedprox", 0.1, 0, [0.1, 0.1], data={"seed": 7})           # seed 0, another split
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    assert len(table) == 1 and table.iloc[0]["n"] == 2 and table.iloc[0]["effect_mean"] == pytest.approx(0.15)
    assert [p.rsplit("/", 1)[1] for p in unpaired] == ["fedprox-0.1-0-seed=7.h5", "fedprox-0.1-2.h5"]
    _write(tmp_path, "fedavg", 0.1, 1, [0.1, 0.9], data={"seed": 1})            # data.seed 1 = run.seed 1: a twin
    with pytest.raises(ValueError, match="share every compared key and seed"):
        compare(load([tmp_path]), {"algorithm.name": "fedavg"})


def test_a_pair_with_a_run_that_did_not_complete_gives_no_effect_and_is_counted(tmp_path):
    _arms(tmp_path, {"fedavg": [0.5, 0.6, 0.7], "fedka": [0.6, 0.7, 0.8]})
    _write(tmp_path, "fedka", 0.1, 3, [0.1, 0.95], status="failed")             # diverged: stopped early
    _write(tmp_path, "fedavg", 0.1, 3, [0.1, 0.2])
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    row = table.iloc[0]
    assert row["n"] == 3 and row["unfinished"] == 1 and row["effect_mean"] == pytest.approx(0.1) and unpaired == []
    assert row["verdict"] == "better (over 3 of 4 pairs)"                        # the diverged pair not hidden
    summary_rows = {r["algorithm.name"]: r for r in summary(load([tmp_path]), ["algorithm.name"]).to_dict("records")}
    assert summary_rows["fedka"]["unfinished"] == 1 and summary_rows["fedka"]["final_mean"] == pytest.approx(0.7)
    assert summary_rows["fedavg"]["unfinished"] == 0 and summary_rows["fedavg"]["final_mean"] == pytest.approx(0.5)
    complete, _ = compare(load([tmp_path / "fedavg-0.1-0.h5", tmp_path / "fedka-0.1-0.h5"]),
                          {"algorithm.name": "fedavg"})
    assert "unfinished" not in complete.columns                                  # only where it happened


def test_default_grouping_ignores_keys_that_cannot_change_results(tmp_path, capsys):
    _arms(tmp_path, {"fedavg": [0.5, 0.6]}, run={"checkpoint_every": 5, "threads": 2})
    _arms(tmp_path, {"fedprox": [0.6, 0.8]}, run={"checkpoint_every": 1, "device": "cuda"}, data={"seed": 3})
    assert main(["table", str(tmp_path), "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("algorithm.name,runs,") and len(out) == 3


def test_compare_speedup_to_a_target_and_the_renderings(tmp_path, capsys):
    for seed, (base, arm) in enumerate([([0.2, 0.4, 0.6, 0.8], [0.4, 0.8, 0.8, 0.8]),     # 4 vs 2 rounds: 2x
                                        ([0.2, 0.3, 0.8, 0.8], [0.8, 0.8, 0.8, 0.8]),     # 3 vs 1: 3x
                                        ([0.8, 0.8, 0.8, 0.8], [0.2, 0.8, 0.8, 0.8]),     # 1 vs 2: 0.5x
                                        ([0.8, 0.8, 0.8, 0.8], [0.2, 0.2, 0.2, 0.2])]):   # 1 vs never
        _write(tmp_path, "fedavg", 0.1, seed, base)
        _write(tmp_path, "fedka", 0.1, seed, arm)
    table, _ = compare(load([tmp_path]), {"algorithm.name": "fedavg"}, stat="rounds", target=0.75)
    assert table.iloc[0]["effect_mean"] == pytest.approx(11 / 6) and table.iloc[0]["verdict"] == "inconclusive"
    assert table.iloc[0]["n"] == 3 and table.iloc[0]["not_reached"] == 1      # over the pairs that both reached it
    args = ["compare", str(tmp_path), "--baseline", "algorithm.name=fedavg", "--stat", "rounds", "--target", "0.75"]
    assert main(args + ["--format", "md"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0] == "| algorithm.name | n | not_reached | effect | ci95_low | ci95_high | verdict |"
    assert md[2].startswith("| fedka | 3 | 1 | 1.8333 ± ")
    assert main(args + ["--format", "latex"]) == 0
    assert r"algorithm.name & n & not\_reached & effect & ci95\_low" in capsys.readouterr().out
    assert main(args + ["--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("algorithm.name,n,not_reached,effect_mean,effect_std,"
                                                       "ci95_low,ci95_high,verdict")
    assert main(["compare", str(tmp_path), "--baseline", "fedavg"]) == 2
    assert "not KEY=VALUE" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), "--baseline", "algorithm.name=scaffold"]) == 2
    assert "no run has algorithm.name = scaffold" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), "--baseline", "algorithm.name=fedavg", "--stat", "rounds"]) == 2


def test_a_run_without_a_grouping_key_keeps_a_group_of_its_own_and_groups_come_sorted(tmp_path):
    _write(tmp_path, "a", 0.9, 0, [0.3, 0.4])
    _write(tmp_path, "b", 0.1, 0, [0.5, 0.6])
    _write(tmp_path, "c", 0.1, 0, [0.7, 0.8], data={"min_samples": 5})     # the only run with the key
    table = summary(load([tmp_path]), ["data.partition_params.beta", "data.min_samples"])
    assert list(table["data.partition_params.beta"]) == [0.1, 0.1, 0.9]     # sorted, not in file order
    assert table["runs"].sum() == 3 and table["data.min_samples"].isna().sum() == 2
    eleven = {"round/test_acc": np.arange(11.0)}
    assert statistic(eleven, "last", "round/test_acc") == pytest.approx(np.mean(np.arange(1.0, 11.0)))   # k = 10


def test_only_mean_std_pairs_merge_in_rendering_and_an_unknown_format_is_refused():
    import pandas as pd

    table = pd.DataFrame({"a_mean": [0.5], "a_std": [0.1], "b_mean": [0.25], "c_std": [0.125]})
    assert render(table, "md").splitlines()[0] == "| a | b_mean | c_std |"
    assert render(table, "md").splitlines()[2] == "| 0.5000 ± 0.1000 | 0.2500 | 0.1250 |"
    with pytest.raises(ValueError, match="format 'html'"):
        render(table, "html")


def test_paired_intervals_and_verdicts_at_their_boundaries(tmp_path):
    from hpcfl.analysis.paired import interval, verdict

    assert np.isnan(interval(np.array([0.3]))[2]) and interval(np.array([0.3]))[0] == pytest.approx(0.3)
    mean, std, low, high = interval(np.array([0.1, 0.3]))            # n = 2: t(0.975, 1) = 12.7062
    assert (mean, std) == (pytest.approx(0.2), pytest.approx(np.sqrt(0.02)))
    assert low == pytest.approx(0.2 - 12.7062 * 0.1, rel=1e-4) and high == pytest.approx(0.2 + 12.7062 * 0.1, rel=1e-4)
    assert verdict(0.0, 1.0, 0.0, True) == "inconclusive" and verdict(-1.0, 0.0, 0.0, True) == "inconclusive"
    assert verdict(0.1, 1.0, 0.0, True) == "better" and verdict(0.1, 1.0, 0.0, False) == "worse"
    assert verdict(-1.0, -0.1, 0.0, True) == "worse" and verdict(np.nan, np.nan, 0.0, True) == "inconclusive"
    _arms(tmp_path, {"fedavg": [0.5], "fedprox": [0.6]})
    table, _ = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    assert table.iloc[0]["n"] == 1 and table.iloc[0]["verdict"] == "inconclusive"


def test_compare_reads_old_files_a_loss_the_right_way_and_names_runs_without_partner(tmp_path):
    for seed in range(3):                      # the last-10 mean, and train_loss = 1 - value: lower is better
        _write(tmp_path, "fedavg", 0.1, seed, [0.1] + [0.5 + 0.01 * seed] * 11, data={"seed": -1})   # newer files
        _write(tmp_path, "fedprox", 0.1, seed, [0.9] + [0.6 + 0.01 * seed] * 10 + [0.7 + 0.01 * seed])  # no data.seed
    _write(tmp_path, "fedavg", 0.1, 7, [0.1, 0.2])                               # no fedprox of seed 7
    _write(tmp_path, "fedprox", 0.1, 1, [0.1, 0.2], data={"seed": 9}, run={"threads": 2})    # another split
    results = load([tmp_path], metrics=("round/test_acc", "round/train_loss"))
    table, unpaired = compare(results, {"algorithm.name": "fedavg"}, stat="last")
    assert table.iloc[0]["n"] == 3 and table.iloc[0]["effect_mean"] == pytest.approx(0.11)   # (9 x 0.1 + 0.2) / 10
    assert [p.rsplit("/", 1)[1] for p in unpaired] == ["fedavg-0.1-7.h5", "fedprox-0.1-1-seed=9-threads=2.h5"]
    loss, _ = compare(results, {"algorithm.name": "fedavg"}, stat="final", metric="round/train_loss")
    assert loss.iloc[0]["effect_mean"] == pytest.approx(-0.2) and loss.iloc[0]["verdict"] == "better"
    with pytest.raises(ValueError, match="one KEY=VALUE"):
        compare(results, {"algorithm.name": "fedavg", "run.seed": 0})
    with pytest.raises(ValueError, match="'no.key' is not a config key"):
        compare(results, {"no.key": "x"})
    with pytest.raises(ValueError, match="falling loss"):
        compare(results, {"algorithm.name": "fedavg"}, stat="rounds", metric="round/train_loss", target=0.5)


def test_a_consistent_speedup_is_better_than_no_effect_at_one(tmp_path):
    for seed, (base, arm) in enumerate([([0.2, 0.4, 0.6, 0.8], [0.4, 0.8, 0.8, 0.8]),      # 4 / 2
                                        ([0.2, 0.3, 0.7, 0.8], [0.2, 0.8, 0.8, 0.8]),      # 4 / 2
                                        ([0.2, 0.3, 0.8, 0.8], [0.2, 0.8, 0.8, 0.8])]):    # 3 / 2
        _write(tmp_path, "fedavg", 0.1, seed, base)
        _write(tmp_path, "fedka", 0.1, seed, arm)
    table, _ = compare(load([tmp_path]), {"algorithm.name": "fedavg"}, stat="rounds", target=0.75)
    row = table.iloc[0]
    assert row["effect_mean"] == pytest.approx(11 / 6) and 1.0 < row["ci95_low"] < 2.0 < row["ci95_high"]
    assert row["verdict"] == "better"


def test_compare_keeps_runs_whose_grouping_key_is_missing(tmp_path):
    _arms(tmp_path, {"fedavg": [0.5, 0.6], "fedprox": [0.6, 0.8]})                  # no data.min_samples
    _arms(tmp_path, {"fedavg": [0.3, 0.4], "fedprox": [0.4, 0.4]}, data={"min_samples": 5})
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    assert unpaired == [] and list(table["n"]) == [2, 2]
    assert sorted(table["effect_mean"]) == [pytest.approx(0.05), pytest.approx(0.15)]   # each with its own fedavg


def test_compare_pairs_sweep_arms_that_set_several_keys_within_each_grid_value(tmp_path):
    for beta, shift in ((0.1, 0.02), (0.5, -0.03)):
        for seed, base in enumerate([0.5, 0.6, 0.7]):
            _write(tmp_path, "fedavg", beta, seed, [0.1, base], run={"arm": "FedAvg"})
            _write(tmp_path, "fedcme", beta, seed, [0.1, base + shift + 0.001 * seed],
                   run={"arm": "FedCME"}, data={"validation_fraction": 0.1})   # a second key set by the arm
    table, unpaired = compare(load([tmp_path]), {"run.arm": "FedAvg"})
    assert unpaired == [] and list(table.columns[:2]) == ["data.partition_params.beta", "run.arm"]
    assert table.attrs["also_differ"] == ["data.validation_fraction"]          # beta is a group, not the arm's
    rows = {r["data.partition_params.beta"]: r for r in table.to_dict("records")}
    assert rows[0.1]["n"] == 3 and rows[0.1]["effect_mean"] == pytest.approx(0.021)
    assert rows[0.5]["effect_mean"] == pytest.approx(-0.029) and rows[0.5]["verdict"] == "worse"


@pytest.mark.filterwarnings("error")            # a role no client has is NaN, without a warning
def test_forgetting_per_class_role_reads_each_clients_partition(tmp_path):
    """Client 0 holds classes 5 / 0 / 1 (dominant, missing, non-dominant at gamma 1/3), client 1 0 / 3 / 3
    (missing, dominant, dominant); each role's degree is the mean over its (client, class) cells."""
    degree = np.array([[-0.5, 0.9, 0.7], [0.8, -0.2, 0.0]])
    with Recorder.create(tmp_path / "ka.h5", {"config": {"run": {"seed": 0}, "algorithm": {"name": "fedka"}}}) as rec:
        rec.write_array("partition", np.array([[5, 0, 1], [0, 3, 3]]))
        for round in range(2):
            rec.append_round(round, {"client_class/forgetting": degree + (0.1 if round else -0.1)})
        rec.set_attr("status", "completed")
    results = load([tmp_path], metrics=("client_class/forgetting", "partition"))
    row = forgetting(results, ["algorithm.name"]).iloc[0]
    assert row["dominant"] == pytest.approx((-0.5 - 0.2 + 0.0) / 3) and row["non-dominant"] == pytest.approx(0.7)
    assert row["missing"] == pytest.approx(0.85) and row["class 1"] == pytest.approx(0.35)
    # the medians over the same cells: dominant -0.6, -0.4, -0.3, -0.1, -0.1, 0.1 over both rounds
    assert (row["dominant median"], row["non-dominant median"], row["missing median"]) == pytest.approx((-0.2, 0.7,
                                                                                                        0.85))
    strict = forgetting(results, ["algorithm.name"], gamma=0.9).iloc[0]          # no class reaches 90 %
    assert np.isnan(strict["dominant"]) and strict["non-dominant"] == pytest.approx(0.0)
    assert "unfinished" not in forgetting(results, ["algorithm.name"]).columns
    config = {"run": {"seed": 1}, "algorithm": {"name": "fedka"}}
    with Recorder.create(tmp_path / "ka-diverged.h5", {"config": config}) as rec:
        rec.write_array("partition", np.array([[5, 0, 1], [0, 3, 3]]))
        rec.append_round(0, {"client_class/forgetting": np.full((2, 3), 50.0)})   # a diverged run's last round
        rec.set_attr("status", "failed")
    both = forgetting(load([tmp_path], metrics=("client_class/forgetting", "partition")), ["algorithm.name"]).iloc[0]
    assert both["runs"] == 1 and both["unfinished"] == 1 and both["class 1"] == pytest.approx(0.35)


def test_compare_at_equal_rounds_and_at_equal_bytes(tmp_path, capsys):
    """A long cheap baseline against a short costly arm: each run's curve cut at R rounds, or at the
    rounds whose cumulative bytes (3 MB a round here, from _write) stay within B."""
    for seed in (0, 1):
        _write(tmp_path, "fedavg", 0.1, seed, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], run={"arm": "A"})
        _write(tmp_path, "fedma", 0.1, seed, [0.3, 0.5 + 0.01 * seed], run={"arm": "B"})
    results = load([tmp_path], metrics=("round/test_acc",), prefixes=("round/bytes_",))
    at_two = compare(truncate(results, rounds=2), {"run.arm": "A"})[0].iloc[0]
    assert at_two["effect_mean"] == pytest.approx(0.305)                  # 0.5 / 0.51 against 0.2
    at_9mb = compare(truncate(results, max_bytes=9e6), {"run.arm": "A"})[0].iloc[0]
    assert at_9mb["effect_mean"] == pytest.approx(0.205)                  # against 0.3, the baseline's third round
    assert list(truncate(results, max_bytes=9e6).runs["rounds"]) == [3, 3, 2, 2]
    args = ["compare", str(tmp_path), "--baseline", "run.arm=A", "--max-bytes", "9e6", "--format", "csv"]
    assert main(args) == 0 and "0.205" in capsys.readouterr().out


def test_runs_group_and_pair_by_the_parameters_they_ran_with(tmp_path):
    """A run that left algorithm.params.mu to its default and one that wrote the default out pair and
    group together through the recorded `resolved` tables; files without them (from before) read as
    they were written."""
    resolved = {"algorithm": {"params": {"mu": 0.01}, "terms": {}}, "data": {"partition_params": {"beta": 0.1}},
                "model": {"params": {}}}
    for seed, (base, arm, written) in enumerate([(0.5, 0.6, {}), (0.6, 0.8, {"mu": 0.01})]):
        _write(tmp_path, "fedavg", 0.1, seed, [0.1, base])                     # no `resolved`: an old file
        config = {"run": {"seed": seed}, "algorithm": {"name": "fedprox", "params": written},
                  "data": {"partition": "dirichlet", "partition_params": {"beta": 0.1}}}
        with Recorder.create(tmp_path / f"fedprox-{seed}.h5", {"config": config, "resolved": resolved}) as recorder:
            recorder.append_round(0, {"round/test_acc": 0.1})
            recorder.append_round(1, {"round/test_acc": arm})
            recorder.set_attr("status", "completed")
    results = load([tmp_path])
    assert list(results.runs.sort_values("path")["algorithm.params.mu"].fillna(-1)) == [-1, -1, 0.01, 0.01]
    table = summary(results, ["algorithm.name", "algorithm.params.mu"])
    assert list(table["runs"]) == [2, 2]
    (row,) = compare(results, {"algorithm.name": "fedavg"})[0].to_dict("records")
    assert row["n"] == 2 and row["effect_mean"] == pytest.approx(0.15)


def test_a_groups_missing_value_is_shown_as_missing_and_others_as_text():
    assert shown(None) == MISSING and shown(float("nan")) == MISSING
    assert (shown(0.5), shown("fedavg"), shown([1, 2])) == ("0.5", "fedavg", "[1, 2]")


def test_bytes_exchanged_sums_every_payload_and_direction_per_round_then_accumulates():
    metrics = {"round/bytes_up/model": np.array([1.0, 2.0, 3.0]),
               "round/bytes_down/model": np.array([10.0, np.nan, 30.0]),
               "round/bytes_exchange/features": np.array([100.0, 0.0, 0.0]),
               "round/test_acc": np.array([0.5, 0.6, 0.7])}
    assert list(bytes_exchanged(metrics)) == [111.0, 113.0, 146.0]         # a NaN round adds nothing
    assert len(bytes_exchanged({"round/test_acc": np.ones(3)})) == 0


def test_load_keeps_the_named_metrics_and_those_under_the_prefixes_given_in_a_list(tmp_path):
    _write(tmp_path, "fedavg", 0.1, 0, [0.1, 0.2])
    (series,) = load([tmp_path], metrics=("round/test_acc",), prefixes=["round/bytes_"]).series.values()
    assert sorted(series) == ["round/bytes_down/model", "round/bytes_up/model", "round/test_acc"]


def test_a_result_file_with_a_keys_old_name_reads_under_the_new_name_without_a_warning(tmp_path):
    """Old files are history, not a user's job to fix: no FutureWarning at every analysis."""
    config = {"run": {"seed": 0}, "algorithm": {"name": "fedavg", "regularizers": {"prox": {"mu": 0.1}}}}
    with Recorder.create(tmp_path / "old.h5", {"config": config}) as recorder:
        recorder.append_round(0, {"round/test_acc": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = load([tmp_path]).runs
    assert runs.loc[0, "algorithm.terms.prox.mu"] == 0.1 and "algorithm.regularizers.prox.mu" not in runs


@pytest.mark.parametrize("args", [["table", "--last", "0"], ["table", "--max-bytes", "0"],
                                  ["compare", "--baseline", "algorithm.name=fedavg", "--last", "-2"],
                                  ["target", "--target", "0.5", "--rounds", "-1"]])
def test_counts_of_rounds_and_bytes_must_be_above_zero(folder, capsys, args):
    """--last 0 would average every round (x[-0:]) and --rounds -1 drop each run's last one."""
    with pytest.raises(SystemExit) as stop:
        main([args[0], str(folder), *args[1:]])
    assert stop.value.code == 2 and "must be above 0" in capsys.readouterr().err


def test_a_client_metrics_round_mean_is_over_the_clients_measured_that_round():
    from hpcfl.analysis.tables import round_means

    values = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [2.0, 4.0, np.nan], [0.5, 0.5, 0.5],
                       [np.nan, 0.7, np.nan]])
    np.testing.assert_array_equal(round_means({"client/x": values}, "client/x"), [2.0, np.nan, 3.0, 0.5, 0.7])
    per_round = np.array([0.1, 0.2])
    assert round_means({"round/x": per_round}, "round/x") is per_round and round_means({}, "round/x") is None


def test_a_selection_picks_among_the_rounds_its_metric_has_and_says_what_it_selects_on():
    from hpcfl.analysis.tables import chosen_rounds, selection_rule

    series = {"round/test_acc": np.array([0.1, 0.2, 0.3, 0.4, 0.9]),       # the key stops after round 3
              "client/local_test_loss": np.array([[0.9, 0.7], [np.nan, np.nan], [0.6, 0.8], [0.2, np.nan]])}
    rule = ("client/local_test_loss", "min")
    assert chosen_rounds(series, "selected", "round/test_acc", select=rule).tolist() == [3]    # 0.2, not round 1
    series["client/local_test_loss"][3] = np.nan                                             # then 0.7 (round 2)
    assert chosen_rounds(series, "selected", "round/test_acc", select=rule).tolist() == [2]
    assert chosen_rounds(series, "selected", "round/test_acc", select=("client/local_test_loss", "max")).tolist() == [0]
    assert selection_rule(rule) == ("selected: at the round of the min of client/local_test_loss: a selection on "
                                    "test data, optimistic")
    assert selection_rule(("round/val_acc", "max")) == "selected: at the round of the max of round/val_acc"
    with pytest.raises(ValueError, match="needs the round's rule"):
        statistic(series, "selected", "round/test_acc")
    twelve = {"round/test_acc": np.arange(12.0)}
    assert chosen_rounds(twelve, "last", "round/test_acc").tolist() == list(range(2, 12))       # 10 by default


def test_a_selection_on_the_personalised_accuracy_is_labelled_as_one_on_test_data(folder, capsys):
    """round/personal_acc_mean/std are over the clients' local test sets: selecting on them selects on test
    data as round/test_acc does, though "test" is not in their names; the legend and the note both say so."""
    from hpcfl.analysis.tables import selection_rule

    said = {}
    for on in ("round/test_acc", "round/personal_acc_mean", "round/personal_acc_std"):
        assert selection_rule((on, "max")).endswith(f"max of {on}: a selection on test data, optimistic")
        assert main(["table", str(folder), "--by", "algorithm.name", "--select-on", on]) == 0
        captured = capsys.readouterr()
        said[on] = (captured.out.count(f"{on}: a selection on test data, optimistic"),
                    captured.err.count(f"chosen on {on}, a metric of test data: selection on test data"))
    assert said == dict.fromkeys(said, (1, 1))


def test_ungrouped_tables_and_a_missing_key_rendered_as_missing(folder):
    results = load([folder], metrics=("client_class/forgetting",),
                   prefixes=("round/phase_s/", "rank/", "round/bytes_"))
    assert len(forgetting(results, [])) == 1 and len(time_and_bytes(results, [])) == 1    # one group of every run
    table = summary(load([folder]), ["algorithm.name"])
    assert table.attrs["legend"] == "round/test_acc: mean ± population std (ddof 0) over each group's completed runs"
    _write(folder, "fedavg", 0.1, 7, [0.5, 0.5], train={"mu": 0.1})     # the only run with train.mu
    lines = render(summary(load([folder]), ["train.mu"]), "md").splitlines()
    assert lines[2].startswith("| 0.1000 | 1 |") and lines[3].startswith("| (missing) | 5 |")


def test_a_parameter_only_the_arm_has_is_compared_with_the_whole_baseline_in_each_of_its_groups(tmp_path):
    """FedProx's mu swept against FedAvg, which has no mu: each mu pairs with the FedAvg runs of its seeds."""
    _arms(tmp_path, {"fedavg": [0.50, 0.60, 0.70]})
    for mu, shift in ((0.01, 0.02), (0.1, -0.04)):
        for seed, base in enumerate([0.50, 0.60, 0.70]):
            _write(tmp_path, "fedprox", 0.1, seed, [0.1, base + shift + 0.01 * seed], algorithm={"params": {"mu": mu}})
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    rows = {r["algorithm.params.mu"]: r for r in table.to_dict("records")}
    assert unpaired == [] and sorted(rows) == [0.01, 0.1] and [r["n"] for r in rows.values()] == [3, 3]
    assert rows[0.01]["effect_mean"] == pytest.approx(0.03) and rows[0.1]["effect_mean"] == pytest.approx(-0.03)
    assert table.attrs["also_differ"] == []
    speedups = rounds_to_target(load([tmp_path]), 0.55, ["algorithm.name", "algorithm.params.mu"],
                                {"algorithm.name": "fedavg"})
    assert speedups["speedup"].tolist() == [1.0, 1.0, 1.0]          # every run that reaches 0.55 does so in round 2


def test_runs_without_the_baseline_key_are_an_arm_and_keys_set_per_arm_are_named(tmp_path, capsys):
    for seed, (plain, half, most) in enumerate([(0.5, 0.52, 0.55), (0.6, 0.61, 0.64), (0.7, 0.73, 0.76)]):
        _write(tmp_path, "fedavg", 0.1, seed, [0.1, plain])                          # no server_momentum
        _write(tmp_path, "fedavgm", 0.1, seed, [0.1, half], algorithm={"params": {"server_momentum": 0.5}})
        _write(tmp_path, "fedavgm", 0.1, seed, [0.1, most], algorithm={"params": {"server_momentum": 0.9}})
    table, unpaired = compare(load([tmp_path]), {"algorithm.params.server_momentum": "0.5"})
    rows = {r["algorithm.params.server_momentum"]: r for r in table.to_dict("records")}
    assert unpaired == [] and sorted(rows) == [MISSING, "0.9"]                   # FedAvg's runs are not dropped
    assert rows[MISSING]["effect_mean"] == pytest.approx(-0.02) and rows["0.9"]["effect_mean"] == pytest.approx(0.03)
    with pytest.raises(ValueError, match=r"no run has algorithm.params.server_momentum = 0.7; values: "
                                         r"\['\(missing\)', '0.5', '0.9'\]"):
        compare(load([tmp_path]), {"algorithm.params.server_momentum": "0.7"})
    other = tmp_path / "other"
    other.mkdir()
    _arms(other, {"fedavg": [0.5, 0.6]})
    for seed, final in enumerate([0.55, 0.66]):
        _write(other, "fedavgm", 0.5, seed, [0.1, final])                            # another beta, per arm
    table, _ = compare(load([other]), {"algorithm.name": "fedavg"})
    assert table.attrs["also_differ"] == ["data.partition_params.beta"] and table.iloc[0]["n"] == 2
    assert main(["compare", str(other), "--baseline", "algorithm.name=fedavg"]) == 0
    assert ("note: the arms also differ in ['data.partition_params.beta'] (each the same within an arm): the effects "
            "are of each arm with its values, not of algorithm.name alone") in capsys.readouterr().err


def _client_run(folder, name, seed, rows, final=None, status="completed"):
    config = {"run": {"seed": seed, "name": name}, "algorithm": {"name": name.split("-")[0]}}
    with Recorder.create(folder / f"{name}.h5", {"config": config}) as recorder:
        for round, row in enumerate(rows):
            recorder.append_round(round, {"client/local_test_acc": np.array(row), "round/val_acc": 0.1 * round})
        if final is not None:
            recorder.write_array("final/feature_nmi", np.float64(final))
        recorder.set_attr("status", status)


def test_a_client_metric_is_read_by_its_cohort_mean_and_a_final_figure_only_as_final(tmp_path, capsys):
    for seed in range(2):                              # the cohort's mean by round: 0.3, 0.5, then 0.6 + 0.1 seed
        _client_run(tmp_path, f"local_only-{seed}", seed,
                    [[0.2, 0.4, np.nan], [np.nan, 0.5, np.nan], [0.6 + 0.1 * seed, np.nan, 0.6 + 0.1 * seed]],
                    final=0.7 + 0.1 * seed)
        _client_run(tmp_path, f"ensemble-{seed}", seed, [[0.2, 0.2, 0.2]] * 3, final=0.5)
    results = load([tmp_path], metrics=("client/local_test_acc", "round/val_acc", "final/feature_nmi"))
    table = summary(results, ["algorithm.name"], metric="client/local_test_acc", last=2)
    row = table.set_index("algorithm.name").loc["local_only"]
    assert row["final_mean"] == pytest.approx(0.65) and row["last2_mean"] == pytest.approx((0.5 + 0.65) / 2)
    assert row["best_val_mean"] == pytest.approx(0.65)                       # round 2 has the highest val_acc
    paired, _ = compare(results, {"algorithm.name": "ensemble"}, metric="client/local_test_acc")
    assert paired.iloc[0]["effect_mean"] == pytest.approx(0.45) and paired.iloc[0]["n"] == 2
    nmi = summary(results, ["algorithm.name"], metric="final/feature_nmi").set_index("algorithm.name")
    assert nmi.loc["local_only", "final_mean"] == pytest.approx(0.75)
    assert "best_val_mean" not in nmi and "last10_mean" not in nmi            # written once: no round to select
    cut = truncate(results, rounds=2)
    assert np.isnan(cut.series[str(tmp_path / "local_only-0.h5")]["final/feature_nmi"]).all()   # of the whole run
    assert truncate(results, rounds=3).series[str(tmp_path / "local_only-0.h5")]["final/feature_nmi"] == 0.7
    assert main(["table", str(tmp_path), "--metric", "client/local_test_accuracy"]) == 2
    assert ("--metric client/local_test_accuracy is recorded in none of these runs (a typo?"
            in capsys.readouterr().err)


def test_a_comparison_without_pairs_gives_no_test_error(tmp_path):
    for seed in range(2):
        _write(tmp_path, "fedavg", 0.1, seed, [0.1, 0.5])
        _write(tmp_path, "fedprox", 0.1, seed + 5, [0.1, 0.6])                    # other seeds: no pair
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    assert table.iloc[0]["n"] == 0 and len(unpaired) == 4
    assert "test_se" not in table or np.isnan(table.iloc[0]["test_se"])


def test_a_file_named_twice_is_read_once_where_first_named(folder):
    """A folder and a file in it, or the folder again: each run counts once, or it would weigh twice in
    its group's mean and be its own twin in compare."""
    from hpcfl.analysis import find_files

    first = folder / "fedprox-0.1-1.h5"
    files = find_files([first, folder, folder / "." / "fedavg-0.5-0.h5", folder])
    assert len(files) == 5 and files[0] == first and len({f.resolve() for f in files}) == 5
    results = load([folder, first])
    table = summary(results, ["algorithm.name", "data.partition_params.beta"])
    assert list(table["runs"]) == [2, 1, 2]
    assert compare(results, {"algorithm.name": "fedavg"})[0]["n"].tolist() == [2]


def test_a_config_value_that_four_decimals_would_round_is_shown_in_full(tmp_path):
    for seed, lr in enumerate([1e-5, 4e-5, 0.1]):
        _write(tmp_path, "fedavg", 0.1, seed, [0.5, 0.6], train={"lr": lr})
    lines = render(summary(load([tmp_path]), ["train.lr"]), "md").splitlines()
    assert [line.split(" | ")[0] for line in lines[2:5]] == ["| 1e-05", "| 4e-05", "| 0.1000"]


def test_a_group_of_one_run_shows_no_spread(folder):
    table = summary(load([folder]), ["algorithm.name", "data.partition_params.beta"])
    single = table[table["data.partition_params.beta"] == 0.5].iloc[0]
    assert single["runs"] == 1 and single["final_mean"] == pytest.approx(0.3) and np.isnan(single["final_std"])
    assert "| fedavg | 0.5000 | 1 | 0.3000 | 0.2000 |" in render(table).splitlines()


def test_a_figure_that_some_runs_lack_shows_how_many_runs_it_is_over(tmp_path):
    _write(tmp_path, "fedavg", 0.1, 0, [0.5, 0.7], val=[0.6, 0.5])
    for seed in (1, 2):
        _write(tmp_path, "fedavg", 0.1, seed, [0.4, 0.6])                          # no validation
    table = summary(load([tmp_path], metrics=("round/test_acc", "round/val_acc")), ["algorithm.name"])
    assert list(table.columns) == ["algorithm.name", "runs", "final_mean", "final_std", "last10_mean", "last10_std",
                                   "best_val_mean", "best_val_std", "best_val_n"]
    assert table.iloc[0][["runs", "best_val_n"]].tolist() == [3, 1]
    assert render(table).splitlines()[2] == "| fedavg | 3 | 0.6333 ± 0.0471 | 0.5333 ± 0.0471 | 0.5000 | 1 |"
    assert "_n: the runs behind a figure that some completed runs lack" in table.attrs["legend"]
    _write(tmp_path, "fedavg", 0.1, 3, [0.4], val=[0.6], status="failed")          # unfinished: in no figure
    table = summary(load([tmp_path], metrics=("round/test_acc", "round/val_acc")), ["algorithm.name"])
    assert table.iloc[0][["runs", "unfinished", "best_val_n"]].tolist() == [4, 1, 1] and "final_n" not in table


@pytest.mark.parametrize("command", ["table", "personal", "time", "target"])
def test_a_grouped_command_names_the_keys_that_vary_within_its_groups(folder, capsys, command):
    extra = ["--target", "0.5"] if command == "target" else []
    assert main([command, str(folder), "--by", "algorithm.name", *extra]) == 0
    assert ("note: the runs of a group also differ in ['data.partition_params.beta']: its figures are over their "
            "values together; add them to --by to tell them apart") in capsys.readouterr().err
    assert main([command, str(folder), *extra]) == 0                 # the default grouping: nothing mixed
    assert "also differ" not in capsys.readouterr().err


def test_a_key_is_mixed_only_where_it_differs_inside_a_group_a_missing_value_and_a_missing_group_key_too():
    runs = pd.DataFrame({"algorithm.name": ["fedavg", "fedavg", "fedprox", "fedprox", None, None],
                         "train.lr": [0.1, 0.1, 0.2, 0.2, 0.1, 0.1],                 # constant in each group
                         "train.mu": [None, 0.5, 0.5, 0.5, 0.5, 0.5],                # missing in one run of fedavg
                         "data.beta": [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],                # differs in the group of None
                         "run.seed": [0, 1, 0, 1, 0, 1]})
    assert mixed_keys(runs, ["algorithm.name"]) == ["train.mu", "data.beta"]
    assert mixed_keys(runs, ["algorithm.name", "train.mu", "data.beta"]) == []
    assert mixed_keys(runs, []) == ["algorithm.name", "train.lr", "train.mu", "data.beta"]     # one group: all


@pytest.mark.parametrize(("command", "needed", "setting"),
                         [("personal", "round/personal_acc_mean", "data.local_test_ratio > 0"),
                          ("forgetting", "client_class/forgetting", "eval.forgetting = true")])
def test_personal_and_forgetting_refuse_runs_that_recorded_none_of_their_figures(tmp_path, capsys, command, needed,
                                                                                 setting):
    _client_run(tmp_path, "fedavg-0", 0, [[0.5, 0.6]] * 2)
    assert main([command, str(tmp_path)]) == 2
    assert (f"hpcfl: error: {needed}, which {command} reads, is recorded in none of these runs (runs record it "
            f"with {setting})") in capsys.readouterr().err


def test_the_bytes_per_run_are_over_completed_runs_and_the_others_are_counted(folder):
    _write(folder, "fedprox", 0.1, 2, [0.5, 0.6], status="failed")             # stopped after 2 of 4 rounds
    table = time_and_bytes(load([folder], metrics=(), prefixes=("round/phase_s/", "rank/", "round/bytes_")),
                           ["algorithm.name"])
    fedprox = table[table["algorithm.name"] == "fedprox"].iloc[0]
    assert fedprox["runs"] == 3 and fedprox["unfinished"] == 1
    assert fedprox["down/model MB"] == pytest.approx(4.0) and fedprox["up/model MB"] == pytest.approx(8.0)
    assert fedprox["train s"] == pytest.approx(3.0)                      # 2, 3 and 4 s: every run's rounds


def test_runs_whose_data_lies_elsewhere_group_and_pair_together(tmp_path, capsys):
    _arms(tmp_path, {"fedavg": [0.5, 0.6]}, data={"root": "/scratch/data"})
    _arms(tmp_path, {"fedprox": [0.6, 0.8]}, data={"root": "/home/me/data"})
    assert main(["table", str(tmp_path), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("algorithm.name,runs,")
    table, unpaired = compare(load([tmp_path]), {"algorithm.name": "fedavg"})
    assert unpaired == [] and table.iloc[0]["n"] == 2 and table.attrs["also_differ"] == []


def test_rounds_beyond_a_completed_runs_length_are_noted(folder, capsys):
    assert main(["table", str(folder), "--rounds", "9"]) == 0
    assert ("note: --rounds 9 is more than 5 completed run(s) ran (the shortest: 4 rounds): they are read whole, "
            "not at equal rounds") in capsys.readouterr().err
    assert main(["table", str(folder), "--rounds", "4"]) == 0
    assert "--rounds" not in capsys.readouterr().err
