"""Curves: a figure that says what it draws (a human axis label, integer rounds, what the band is),
every group drawn (one whose --by key its runs lack, as `(missing)`, as the table shows it), an error
rather than empty axes, and no global matplotlib state touched by importing the module."""
import re
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from analysis.test_tables import _write

from hpcfl.analysis import load
from hpcfl.analysis.plots import curve_figure, heatmap_figure
from hpcfl.analyze import main


@pytest.fixture
def mixed(tmp_path):
    """fedavg without train.mu (its config lacks the key), fedprox with it; two rounds."""
    _write(tmp_path, "fedavg", 0.1, 0, [0.2, 0.5])
    for seed in (0, 1):
        _write(tmp_path, "fedprox", 0.1, seed, [0.3, 0.6 + 0.1 * seed], train={"mu": 0.01})
    return tmp_path


def _svg_text(path) -> list[str]:
    return [re.sub(r"&#[^;]+;|&\w+;", " ", t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text())]


def test_a_curve_is_labelled_in_words_on_integer_rounds_with_its_band_explained(mixed, tmp_path, capsys):
    out = tmp_path / "curves.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):          # text as <text>, readable here
        assert main(["curves", str(mixed), "--by", "train.mu", "--out", str(out)]) == 0
    text = _svg_text(out)
    assert "test accuracy" in text and "round" in text
    assert any("band = ± 1 std" in t and "round/test_acc" in t for t in text)
    ticks = [t for t in text if re.fullmatch(r"[\d.]+", t.strip())]
    assert "1" in ticks and "2" in ticks and not [t for t in ticks if t in ("1.0", "1.2", "1.25", "1.5")]
    assert "(missing) (1 run)" in text and "0.01 (2 runs)" in text and "train.mu" in text


def test_the_table_shows_a_key_some_runs_lack_as_the_curves_do(mixed, capsys):
    assert main(["table", str(mixed), "--by", "train.mu"]) == 0
    assert "| (missing) | 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("args, missing", [(["--metric", "round/nothing"], "round/nothing"),
                                           (["--x", "bytes"], "round/bytes_")])
def test_nothing_to_draw_is_an_error_naming_what_is_missing(tmp_path, capsys, args, missing):
    run = tmp_path / "runs"
    run.mkdir()
    path = _write(run, "fedavg", 0.1, 0, [0.2, 0.5])
    if missing.startswith("round/bytes_"):                       # a run that recorded no bytes
        import h5py
        with h5py.File(path, "a") as f:
            for group in ("bytes_down", "bytes_up"):
                del f["round"][group]
    out = tmp_path / "curves.png"
    assert main(["curves", str(run), *args, "--out", str(out)]) == 2
    assert missing in capsys.readouterr().err and not out.exists()


def test_a_metric_not_recorded_per_round_has_no_curve(tmp_path, capsys):
    """final/feature_nmi is written once, after the last round: a curve would draw it at round 1."""
    import h5py
    path = _write(tmp_path, "fedavg", 0.1, 0, [0.2, 0.5])
    with h5py.File(path, "a") as f:
        f["final/feature_nmi"] = 0.75
    out = tmp_path / "curves.png"
    assert main(["curves", str(path), "--metric", "final/feature_nmi", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "final/feature_nmi is not recorded per round" in err and "analyze table --metric final/" in err
    assert not out.exists()
    with pytest.raises(ValueError, match="partition is not recorded per round"):
        curve_figure(load([path], metrics=("partition",)), [], "partition")


def test_importing_the_plots_leaves_the_backend_and_pyplot_alone():
    probe = ("import sys, matplotlib; import hpcfl.analysis.plots; "
             "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={"MPLBACKEND": "svg", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert done.stdout.split() == ["svg", "False"]


def test_a_groups_line_is_the_mean_its_band_one_std_either_side_at_each_round_or_megabyte(tmp_path):
    """fedavg's two runs: 0.2 / 0.4, 0.4 / 0.6, no evaluation, 0.6 / 0.8: mean 0.3, 0.5, 0.7 at rounds 1,
    2, 4 with std 0.1 (ddof 0); 3 MB a round (_write's bytes), so 3, 6 and 12 MB. fedprox's one run
    ends at round 2: no band."""
    for seed in (0, 1):
        _write(tmp_path, "fedavg", 0.1, seed, [0.2 + 0.2 * seed, 0.4 + 0.2 * seed, np.nan, 0.6 + 0.2 * seed])
    _write(tmp_path, "fedprox", 0.1, 0, [0.5, 0.7])
    results = load([tmp_path], prefixes=("round/bytes_",))
    for x, xs in (("round", [1, 2, 4]), ("bytes", [3, 6, 12])):
        (ax,) = [a for a in curve_figure(results, ["algorithm.name"], x=x).axes]
        assert [line.get_label() for line in ax.lines] == ["fedavg (2 runs)", "fedprox (1 run)"]
        np.testing.assert_allclose(ax.lines[0].get_xydata(), np.column_stack([xs, [0.3, 0.5, 0.7]]))
        np.testing.assert_allclose(ax.lines[1].get_xydata(), [[xs[0], 0.5], [xs[1], 0.7]])
        band = {tuple(np.round(v, 9)) for v in ax.collections[0].get_paths()[0].vertices}
        assert {(xs[0], 0.2), (xs[0], 0.4), (xs[2], 0.6), (xs[2], 0.8)} <= band
        assert {y for _, y in ax.collections[1].get_paths()[0].vertices} == {0.5, 0.7}     # one run: std 0
    assert ax.get_xlabel() == "MB exchanged (every payload and direction, cumulative)"      # client to client too
    (ax,) = curve_figure(results, ["algorithm.name", "data.partition_params.beta"]).axes
    assert [line.get_label() for line in ax.lines] == ["fedavg, 0.1 (2 runs)", "fedprox, 0.1 (1 run)"]


def test_groups_are_drawn_in_the_order_of_their_values_not_of_their_files(tmp_path):
    _write(tmp_path, "fedavg", 0.5, 0, [0.2, 0.4])                 # the first file, the larger beta
    _write(tmp_path, "fedprox", 0.1, 0, [0.3, 0.5])
    (ax,) = curve_figure(load([tmp_path]), ["data.partition_params.beta"]).axes
    assert [line.get_label() for line in ax.lines] == ["0.1 (1 run)", "0.5 (1 run)"]


def test_the_heat_map_shows_each_clients_samples_per_class_on_integer_ticks():
    counts = np.array([[5, 0, 1], [0, 3, 3]])
    fig = heatmap_figure(counts, title="run 7")
    ax, bar = fig.axes
    np.testing.assert_array_equal(ax.images[0].get_array(), counts)
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title(), bar.get_ylabel()) == ("class", "client", "run 7",
                                                                                    "samples")
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        assert len(ticks) > 1 and all(float(t).is_integer() for t in ticks)


def test_a_run_still_running_draws_no_line_and_cuts_no_group_short(tmp_path, capsys):
    for seed in (0, 1):
        _write(tmp_path, "fedavg", 0.1, seed, [0.2, 0.4, 0.6])
    _write(tmp_path, "fedavg", 0.1, 2, [0.9], status=None)               # one round in, still running
    (ax,) = curve_figure(load([tmp_path]), ["algorithm.name"]).axes
    assert [line.get_label() for line in ax.lines] == ["fedavg (2 runs)"]
    np.testing.assert_allclose(ax.lines[0].get_xydata(), [[1, 0.2], [2, 0.4], [3, 0.6]])
    running = tmp_path / "running"
    running.mkdir()
    _write(running, "fedavg", 0.1, 0, [0.9], status=None)
    assert main(["curves", str(running), "--out", str(tmp_path / "c.png")]) == 2
    assert "none of the 0 completed runs (of 1)" in capsys.readouterr().err


def test_a_figure_goes_into_a_new_folder_and_a_suffix_matplotlib_cannot_write_is_an_error(tmp_path, capsys):
    path = _write(tmp_path, "fedavg", 0.1, 0, [0.2, 0.5])
    assert main(["partition", str(path), "--out", str(tmp_path / "figs" / "beta0.1" / "p.png")]) == 0
    assert (tmp_path / "figs" / "beta0.1" / "p.png").read_bytes().startswith(b"\x89PNG")
    assert main(["curves", str(path), "--out", str(tmp_path / "more" / "c.svg")]) == 0
    assert (tmp_path / "more" / "c.svg").exists()
    for command, source in (("partition", path), ("curves", path)):
        assert main([command, str(source), "--out", str(tmp_path / "p.jpeg2")]) == 2
        assert "no figure as '.jpeg2'; name it .png, .svg or .pdf" in capsys.readouterr().err
    blocked = tmp_path / "blocked"
    blocked.write_text("a file")
    assert main(["partition", str(path), "--out", str(blocked / "p.png")]) == 2
    assert "hpcfl: error:" in capsys.readouterr().err


def test_a_file_without_a_partition_is_named_in_the_error(tmp_path, capsys):
    import h5py
    path = _write(tmp_path, "fedavg", 0.1, 0, [0.2, 0.5])
    with h5py.File(path, "a") as f:
        del f["partition"]
    assert main(["partition", str(path), "--out", str(tmp_path / "p.png")]) == 2
    assert f"{path} records no partition" in capsys.readouterr().err
