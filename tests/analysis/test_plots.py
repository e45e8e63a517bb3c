"""Curves: a figure that says what it draws (a human axis label, integer rounds, what the band is),
every group drawn (one whose --by key its runs lack, as `(missing)`, as the table shows it), an error
rather than empty axes, and no global matplotlib state touched by importing the module."""
import re
import subprocess
import sys

import matplotlib
import pytest
from analysis.test_tables import _write

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


def test_importing_the_plots_leaves_the_backend_and_pyplot_alone():
    probe = ("import sys, matplotlib; import hpcfl.analysis.plots; "
             "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={"MPLBACKEND": "svg", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert done.stdout.split() == ["svg", "False"]
