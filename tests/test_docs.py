"""The documentation site builds without a broken link, and its generated reference covers the code."""
import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpcfl.algorithms import ALGORITHMS
from hpcfl.config import JobConfig
from hpcfl.data.datasets import DATASETS
from hpcfl.data.partition import PARTITIONS
from hpcfl.models import MODELS
from hpcfl.reference import field_docs, render, toml
from hpcfl.terms import TERMS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Documented:
    plain: int = 1                  # one line
    long: str = "x"                 # a comment that goes on
                                    # over two lines
    undocumented: float = 0.5
    listed: list[int] = field(default_factory=lambda: [1, 2])   # after a field()


@dataclass(frozen=True)
class Inheriting(Documented):
    own: bool = False               # the subclass's own


def test_a_field_is_documented_by_its_comment_and_the_comment_lines_below_it():
    assert field_docs(Inheriting) == {"plain": "one line", "long": "a comment that goes on over two lines",
                                      "undocumented": "", "listed": "after a field()", "own": "the subclass's own"}


@pytest.mark.parametrize("value, written", [(True, "true"), ("auto", '"auto"'), ([0.9, 0.999], "[0.9, 0.999]"),
                                            ({}, "{}"), ({"beta": 0.5}, "{ beta = 0.5 }"), (1800.0, "1800.0")])
def test_defaults_are_shown_as_a_job_file_writes_them(value, written):
    assert toml(value) == written


def test_every_job_file_key_is_documented_with_its_default():
    page = render("job-keys")
    for section in dataclasses.fields(JobConfig):
        docs = field_docs(section.default_factory)
        for key in dataclasses.fields(section.default_factory):
            assert docs[key.name], f"{section.name}.{key.name} has no comment in hpcfl/config.py"
            assert f"| `{section.name}.{key.name}` |" in page
    assert '| `run.placement` | str | `"auto"` |' in page and "| `train.betas` | list[float] | `[0.9, 0.999]` |" in page


@pytest.mark.parametrize("page", ["reference/job-file.md", "how-to/resume-after-preemption.md"])
def test_the_pages_on_resuming_name_every_key_that_may_change(page):
    from hpcfl.config import NON_RESULT_KEYS

    text = " ".join((DOCS / page).read_text().split())
    assert [key for key in (*NON_RESULT_KEYS, "train.on_nonfinite") if f"`{key}`" not in text] == []


def test_every_built_in_parameter_is_documented():
    for registry in (ALGORITHMS, TERMS):
        for name in registry:
            params = registry[name].Params
            missing = [f.name for f in dataclasses.fields(params) if not field_docs(params)[f.name]]
            assert not missing, f"{registry.key} {name}: parameters without a comment: {missing}"


def test_the_reference_names_every_built_in():
    generated = {"algorithms": ALGORITHMS, "terms": TERMS}
    for page, registry in generated.items():
        assert [line[3:] for line in render(page).splitlines() if line.startswith("## ")] == list(registry)
    assert all(f"| `{name}` |" in render("partitions") for name in PARTITIONS)
    assert "`DirichletPartitioner(self_balancing=True)`, not its default" in render("partitions")
    assert all(f"| `{name}` |" in render("models") for name in MODELS)
    # the hand-written tables beside the generated ones must not fall behind either
    written = {"algorithms.md": ALGORITHMS, "datasets.md": DATASETS, "models.md": MODELS}
    for page, registry in written.items():
        text = (DOCS / "reference" / page).read_text()
        assert not [name for name in registry if f"`{name}`" not in text], page


def test_the_command_line_reference_holds_every_commands_help():
    page = render("cli")
    for usage in ("usage: hpcfl run", "usage: hpcfl sweep", "usage: hpcfl status", "usage: hpcfl analyze export",
                  "--max-concurrent", "exit status:"):
        assert usage in page


def test_the_docs_build_with_every_link_resolved(tmp_path):
    """mkdocs --strict fails on a warning: a broken link or anchor, a page missing from the nav, a
    reference marker that does not render."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    built = (tmp_path / "reference" / "job-file" / "index.html").read_text()
    assert "run.round_timeout_s" in built and "<!-- reference" not in built


def test_the_python_api_reference_gives_each_name_its_signature():
    page = render("python-api")
    assert "hpcfl.run(job, overrides=(), data_root=None, quiet=False)" in page
    assert "hpcfl.load_job(path: str | Path, overrides: list[str] = (), allow_sweep: bool = False) -> JobConfig" in page
    assert "class hpcfl.SwapPhase(name: str, exchange: Layout)\n" in page and "hpcfl.WEIGHT: str = '#weight'" in page
