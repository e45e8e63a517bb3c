"""What a built wheel carries: the SLURM scripts and example jobs (`hpcfl init` copies them out,
`hpcfl sweep --submit` uses them), executable where they are scripts; the licence; a release
version needing no git tag; the commit it was built from."""
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hpcfl
from hpcfl.init import TEMPLATES, templates

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                    "-w", str(out)], check=True, timeout=300, capture_output=True)
    return zipfile.ZipFile(next(out.glob("hpcfl-*.whl")))


def test_the_wheel_ships_the_slurm_scripts_and_every_example_job(wheel):
    names = set(wheel.namelist())
    shipped = {f"hpcfl/templates/{p.relative_to(TEMPLATES)}" for p in templates()}
    assert {"hpcfl/templates/slurm/sweep.sbatch", "hpcfl/templates/jobs/quickstart.toml"} <= shipped <= names
    mode = wheel.getinfo("hpcfl/templates/slurm/step.sh").external_attr >> 16
    assert mode & 0o111                                       # sbatch scripts exec it


def test_the_wheel_has_the_licence_the_version_and_the_commit(wheel):
    names = wheel.namelist()
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert re.search(rf"^Version: {re.escape(hpcfl.__version__)}$", metadata, re.M)
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:                                  # built from a checkout: it names the commit
        assert head.stdout.strip() in wheel.read("hpcfl/_commit.py").decode()
