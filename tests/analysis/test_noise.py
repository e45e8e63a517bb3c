"""The paired interval over seeds and test examples (hpcfl.analysis.noise), on result files written
here with per-example bits and hand-computed intervals: the test set's term, the stratified form of
the personalised mean, seeds that agree exactly (the interval must not collapse), the rounds each
statistic reads, files without bits (today's t-interval, said so), and the selection rule of
FedClassAvg's authors (the round of lowest mean client test loss)."""
import numpy as np
import pytest
from scipy import stats

from hpcfl.analysis import load, render, summary
from hpcfl.analysis.noise import NEEDS
from hpcfl.analysis.paired import compare, interval
from hpcfl.analysis.tables import statistic
from hpcfl.analyze import main
from hpcfl.metrics import Recorder

READ = ("round/test_acc", "round/val_acc", "round/personal_acc_mean", "client/local_test_loss", *NEEDS)
T3 = 3.1824463                                          # t(0.975, 3)


def _run(folder, arm, seed, bits, val=None):
    """A run whose global model gets the test examples `bits` (rounds x examples) right; a row None is a
    round without evaluation."""
    size = len(next(row for row in bits if row is not None))
    with Recorder.create(folder / f"{arm}-{seed}.h5", {"config": {"run": {"seed": seed}, "algorithm": {"name": arm}}}) \
            as recorder:
        recorder.write_array("example/test_size", np.int64(size))
        for round, row in enumerate(bits):
            correct = np.zeros(size, np.uint8) if row is None else np.array(row, np.uint8)
            recorder.append_round(round, {"round/test_acc": np.nan if row is None else correct.mean(),
                                          "example/test_correct": np.packbits(correct),
                                          **({} if val is None else {"round/val_acc": val[round]})})
        recorder.set_attr("status", "completed")


def _compare(folder, stat="final", metric="round/test_acc", **options):
    table, unpaired = compare(load([folder], metrics=READ), {"algorithm.name": "fedavg"}, stat, metric, **options)
    assert unpaired == [] and len(table) == 1
    return table.iloc[0]


def test_seeds_that_agree_exactly_keep_the_test_sets_interval(tmp_path):
    """Both seeds gain 0.25 on a 4-example test set, on other examples: the seeds' std is 0 and their
    t-interval would be a point. D = ([0, 1, 0, 0] + [0, 0, 1, 0]) / 2 per example, Var(D) = 1/12
    (ddof 1), v_test = Var / N = 1/48, and with s = 0 the degrees of freedom are N - 1 = 3."""
    _run(tmp_path, "fedavg", 0, [[1, 0, 0, 0]])
    _run(tmp_path, "fedprox", 0, [[1, 1, 0, 0]])
    _run(tmp_path, "fedavg", 1, [[1, 1, 0, 0]])
    _run(tmp_path, "fedprox", 1, [[1, 1, 1, 0]])
    row = _compare(tmp_path)
    assert row["effect_mean"] == pytest.approx(0.25) and row["effect_std"] == 0.0
    assert row["test_se"] == pytest.approx(np.sqrt(1 / 48))
    assert row["ci95_low"] == pytest.approx(0.25 - T3 * np.sqrt(1 / 48), rel=1e-6)
    assert row["ci95_high"] == pytest.approx(0.25 + T3 * np.sqrt(1 / 48), rel=1e-6)
    assert row["verdict"] == "inconclusive"


def test_a_large_test_set_with_agreeing_seeds_gives_the_normal_interval(tmp_path):
    """N = 10,000 examples, the arm right on 100 more than the baseline in both seeds (different ones):
    the half-width is about 1.96 * sqrt(Var_i(d_i) / N), the test set's alone."""
    base = np.zeros(10_000, np.uint8)
    base[:8_000] = 1
    for seed in (0, 1):
        arm = base.copy()
        arm[8_000 + 100 * seed:8_100 + 100 * seed] = 1
        _run(tmp_path, "fedavg", seed, [base])
        _run(tmp_path, "fedprox", seed, [arm])
    row = _compare(tmp_path)
    d = np.zeros(10_000)
    d[8_000:8_200] = 0.5
    half = 1.96 * np.sqrt(np.var(d, ddof=1) / 10_000)
    assert row["effect_mean"] == pytest.approx(0.01) and row["ci95_high"] - 0.01 == pytest.approx(half, rel=1e-3)
    assert row["verdict"] == "better"


def test_the_seeds_and_the_test_sets_variances_add_with_welch_satterthwaites_degrees_of_freedom(tmp_path):
    """Effects 0.25, 0.5, 0.25: s^2 / n = (1/48) / 3 = 1/144 with 2 df. Per-example differences
    [0, 1, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]: D = [1/3, 1, 0, 0], Var = 2/9, v_test = 1/18 with 3 df.
    v = 1/16; df = v^2 / ((1/144)^2 / 2 + (1/18)^2 / 3) = 3.70992; t(0.975, 3.70992) = 2.86419."""
    for seed, (a, b) in enumerate([([1, 1, 0, 0], [1, 0, 0, 0]), ([1, 1, 0, 0], [0, 0, 0, 0]),
                                   ([1, 1, 0, 0], [1, 0, 0, 0])]):
        _run(tmp_path, "fedavg", seed, [b])
        _run(tmp_path, "fedprox", seed, [a])
    row = _compare(tmp_path)
    assert stats.t.ppf(0.975, 3.70992366) == pytest.approx(2.86419, rel=1e-5)
    assert row["effect_mean"] == pytest.approx(1 / 3) and row["test_se"] == pytest.approx(np.sqrt(1 / 18))
    assert row["ci95_high"] == pytest.approx(1 / 3 + 2.86419 * 0.25, rel=1e-5)
    seeds_only = interval(np.array([0.25, 0.5, 0.25]))
    assert row["ci95_high"] > seeds_only[3] and seeds_only[3] == pytest.approx(1 / 3 + 4.302653 / 12, rel=1e-6)


def test_never_narrower_than_the_seeds_own_interval():
    """Two seeds (1 df) and a test term with many: Welch-Satterthwaite alone would give a narrower
    interval than the seeds' t-interval, reading more noise as more certainty."""
    seeds = interval(np.array([0.25, 0.75]))
    both = interval(np.array([0.25, 0.75]), [(1 / 24, 3)])
    assert both == pytest.approx(seeds) and seeds[3] == pytest.approx(0.5 + 12.706205 * 0.25, rel=1e-6)
    assert interval(np.array([0.3, 0.3]), []) == (pytest.approx(0.3), 0.0, pytest.approx(0.3), pytest.approx(0.3))


def test_last_and_best_val_read_the_bits_of_the_rounds_they_read(tmp_path):
    """Round 2 is not evaluated. last (k = 2) averages rounds 1 and 3; best_val reads round 1 (val
    highest). Seed 0's per-example differences: round 1 [0, 1, 0, 0], round 3 [0, 1, 1, 0]; seed 1's
    the same on examples 2 and 3: [0, 0, 1, 0] and [0, 0, 1, 1]."""
    val = [0.1, 0.9, 0.5, 0.2]
    for seed, shift in ((0, 0), (1, 1)):
        base, arm = ([[1, 0, 0, 0], [1, 0, 0, 0], None, [1, 0, 0, 0]],
                     [[1, 0, 0, 0], [1, 1, 0, 0], None, [1, 1, 1, 0]])
        _run(tmp_path, "fedavg", seed, [None if r is None else np.roll(r, shift) for r in base], val)
        _run(tmp_path, "fedprox", seed, [None if r is None else np.roll(r, shift) for r in arm], val)
    last = _compare(tmp_path, "last", last=2)
    # last: per seed parts [0, 1, 0.5, 0] / 4 and [0, 0, 1, 0.5] / 4, effect 0.375 both; D x 4 = [0, .5, .75, .25]
    assert last["effect_mean"] == pytest.approx(0.375) and last["effect_std"] == 0.0
    assert last["test_se"] == pytest.approx(np.sqrt(np.var([0, 0.5, 0.75, 0.25], ddof=1) / 4))
    best = _compare(tmp_path, "best_val")
    assert best["effect_mean"] == pytest.approx(0.25) and best["test_se"] == pytest.approx(np.sqrt(1 / 48))
    final = _compare(tmp_path, "final")
    # final: [0, 1, 1, 0] and [0, 0, 1, 1]: D = [0, .5, 1, .5], Var = 1/6
    assert final["effect_mean"] == pytest.approx(0.5) and final["test_se"] == pytest.approx(np.sqrt(1 / 24))


def _personal(folder, arm, seed, sizes, bits, losses=None):
    """A run whose clients' local models get their local test examples `bits` (rounds x clients x
    the client's examples; a client's None: not sampled that round) right."""
    with Recorder.create(folder / f"{arm}-{seed}.h5", {"config": {"run": {"seed": seed}, "algorithm": {"name": arm}}}) \
            as recorder:
        recorder.write_array("example/local_test_sizes", np.array(sizes, np.int64))
        for round, clients in enumerate(bits):
            acc = np.array([np.nan if c is None else np.mean(c) for c in clients])
            flat = np.concatenate([np.zeros(n) if c is None else c for c, n in zip(clients, sizes, strict=True)])
            recorder.append_round(round, {"client/local_test_acc": acc, "round/personal_acc_mean": np.nanmean(acc),
                                          "example/local_test_correct": np.packbits(flat.astype(np.uint8)),
                                          **({} if losses is None else {"client/local_test_loss": losses[round]})})
        recorder.set_attr("status", "completed")


def test_the_personalised_mean_weighs_each_clients_examples_by_its_share_and_each_split_apart(tmp_path):
    """Three clients of 2, 4 and 2 local test examples; client 2 is not sampled, so the cohort has 2
    and each example of client c weighs 1 / (2 n_c): 1/4 for client 0, 1/8 for client 1. Each seed
    splits its own data (data.seed = run.seed), so its local test examples are its own: each split's
    term counts (1 pair / 2 pairs)^2. Seed 0's differences: client 0 [0, 1] -> parts [0, 1/4],
    2 Var = 1/16; seed 1's: client 1 [0, 1, 1, 0] -> parts [0, 1/8, 1/8, 0], 4 Var = 1/48.
    v_test = (1/16 + 1/48) / 4 = 1/48; df = v^2 / ((1/64)^2 / 1 + (1/192)^2 / 3) = 12/7."""
    sizes = [2, 4, 2]
    _personal(tmp_path, "fedavg", 0, sizes, [[[1, 0], [1, 1, 0, 0], None]])
    _personal(tmp_path, "fedprox", 0, sizes, [[[1, 1], [1, 1, 0, 0], None]])
    _personal(tmp_path, "fedavg", 1, sizes, [[[1, 0], [1, 0, 0, 0], None]])
    _personal(tmp_path, "fedprox", 1, sizes, [[[1, 0], [1, 1, 1, 0], None]])
    row = _compare(tmp_path, metric="round/personal_acc_mean")
    assert row["effect_mean"] == pytest.approx(0.25) and row["effect_std"] == 0.0
    assert row["test_se"] == pytest.approx(np.sqrt(1 / 48))
    half = stats.t.ppf(0.975, 12 / 7) * np.sqrt(1 / 48)
    assert row["ci95_high"] == pytest.approx(0.25 + half) and half == pytest.approx(0.731575, rel=1e-5)


def test_splits_drawn_apart_add_their_variances_rather_than_averaging_their_examples(tmp_path):
    """Both seeds gain on the second example of client 0, but each seed split its own data, so these
    are two different examples: per split 2 Var([0, 1/4]) = 1/16, weighted (1/2)^2 each, v_test = 1/32
    with df = 2 (two terms of 1 df). Averaging them as one example would give 1/16."""
    for seed in (0, 1):
        _personal(tmp_path, "fedavg", seed, [2, 4], [[[1, 0], [1, 0, 0, 0]]])
        _personal(tmp_path, "fedprox", seed, [2, 4], [[[1, 1], [1, 0, 0, 0]]])
    row = _compare(tmp_path, metric="round/personal_acc_mean")
    assert row["effect_mean"] == pytest.approx(0.25) and row["test_se"] == pytest.approx(np.sqrt(1 / 32))
    assert row["ci95_high"] == pytest.approx(0.25 + 4.302653 * np.sqrt(1 / 32), rel=1e-6)


def test_a_one_example_client_adds_no_variance_term_over_several_rounds(tmp_path):
    """Clients of 1, 3 and 2 local test examples, all sampled in both rounds that `last` reads (2
    rounds, 3 clients: the cohort's size is taken per round). Seed 0 gains client 0's one example in
    both rounds (part 1/3) and client 1's second in round 1 (round-mean part 1/2 x 1/9); seed 1 its
    third. Effect 1/3 + 1/18 = 7/18 in both seeds. Client 0's stratum of one example has no variance
    to estimate and adds no term; client 1's D = [0, 1/18, 0] gives 3 Var = 1/324, client 2's 0: each
    split weighs (1/2)^2, so v_test = 2 / 1296 = 1/648."""
    sizes, base = [1, 3, 2], [[0], [1, 0, 0], [1, 0]]
    for seed, gained in ((0, [1, 1, 0]), (1, [1, 0, 1])):
        _personal(tmp_path, "fedavg", seed, sizes, [base, base])
        _personal(tmp_path, "fedprox", seed, sizes, [[[1], [1, 0, 0], [1, 0]], [[1], gained, [1, 0]]])
    row = _compare(tmp_path, "last", metric="round/personal_acc_mean", last=2)
    assert row["effect_mean"] == pytest.approx(7 / 18) and row["effect_std"] == pytest.approx(0.0, abs=1e-12)
    assert row["test_se"] == pytest.approx(np.sqrt(1 / 648))


def test_files_without_bits_keep_the_seeds_t_interval_and_say_so(tmp_path, capsys):
    for seed, (a, b) in enumerate([(0.6, 0.5), (0.8, 0.6), (0.7, 0.65)]):
        for arm, value in (("fedavg", b), ("fedprox", a)):
            config = {"run": {"seed": seed}, "algorithm": {"name": arm}}
            with Recorder.create(tmp_path / f"{arm}-{seed}.h5", {"config": config}) as recorder:
                recorder.append_round(0, {"round/test_acc": value})
                recorder.set_attr("status", "completed")
    row = _compare(tmp_path)
    assert row["test_se"] == "not recorded"
    assert (row["effect_mean"], row["effect_std"], row["ci95_low"], row["ci95_high"]) == pytest.approx(
        interval(np.array([0.1, 0.2, 0.05])))
    assert main(["compare", str(tmp_path), "--baseline", "algorithm.name=fedavg"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| algorithm.name | n | effect | test_se | ci95_low | ci95_high | verdict |"
    assert "| not recorded |" in out[2] and out[3] == "" and out[4].startswith("effect: mean ± sample std (ddof 1)")
    assert "test_se" not in compare(load([tmp_path]), {"algorithm.name": "fedavg"}, metric="round/val_acc")[0]


def test_the_authors_rule_reads_the_round_of_lowest_mean_client_test_loss(tmp_path, capsys):
    """Cohort mean of client/local_test_loss (unsampled clients NaN): round 0 0.5, round 1 0.3, round 2
    0.4: the selected round is 1, whatever the last round or the validation says."""
    losses = [[0.4, 0.6], [0.2, np.nan], [0.4, 0.4]]
    bits = [[[1, 0], [0, 0]], [[1, 1], None], [[1, 0], [1, 0]]]
    _personal(tmp_path, "fedclassavg", 0, [2, 2], bits, losses)
    series = load([tmp_path], metrics=READ).series
    (run,) = series.values()
    select = ("client/local_test_loss", "min")
    assert statistic(run, "selected", "round/personal_acc_mean", select=select) == pytest.approx(1.0)
    assert statistic(run, "final", "round/personal_acc_mean") == pytest.approx(0.5)
    assert statistic(run, "selected", "round/personal_acc_mean",
                     select=("client/local_test_loss", "max")) == pytest.approx(0.25)     # round 0: 0.5 > 0.4
    with pytest.raises(ValueError, match="--select-on"):
        statistic(run, "selected", "round/personal_acc_mean")
    table = summary(load([tmp_path], metrics=READ), ["algorithm.name"],
                    "round/personal_acc_mean", select=select)
    assert table.iloc[0]["selected_mean"] == pytest.approx(1.0)
    assert ("selected: at the round of the min of client/local_test_loss: a selection on test data, optimistic"
            in render(table))
    assert main(["compare", str(tmp_path), "--baseline", "algorithm.name=fedclassavg", "--stat", "selected",
                 "--metric", "round/personal_acc_mean"]) == 2
    assert "--select-on" in capsys.readouterr().err
    assert main(["table", str(tmp_path), "--metric", "round/personal_acc_mean",
                 "--select-on", "client/local_test_loss"]) == 0
    captured = capsys.readouterr()
    assert "| all | 1 | 0.5000 | 0.5833 | 1.0000 |" in captured.out          # one run: no spread
    assert captured.err.count("selection on test data") == 1


def test_seeds_that_agree_with_a_test_set_term_of_no_variance_give_a_zero_width_interval():
    """Nothing varies: no degrees of freedom to compute (0 / 0), and the interval is the point."""
    assert interval(np.array([0.25, 0.25, 0.25]), [(0.0, 5)]) == (0.25, 0.0, 0.25, 0.25)
