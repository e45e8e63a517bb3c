"""hpcfl's build backend: setuptools' own, which first writes the commit being built to
hpcfl/_commit.py (not in git). The version is static (pyproject.toml's), so a build needs no git
tags; the commit still travels with an installed copy, so that its result files name the code that
wrote them (hpcfl.runtime.provenance). Outside a git checkout (an sdist) the file it carries stays."""
import subprocess
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 - every hook not wrapped below is setuptools' own

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def record_commit() -> None:
    """hpcfl/_commit.py <- HEAD (with "-dirty" for uncommitted changes to tracked files), when ROOT
    is a git checkout of its own (not a folder inside another repository)."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != ROOT:
        return
    commit = _git("rev-parse", "HEAD")
    if not commit:                                  # a repository with no commit yet
        return
    commit += "-dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    (ROOT / "hpcfl" / "_commit.py").write_text(f'# written by build-backend/hpcfl_build.py; not in git\n'
                                               f'__commit__ = "{commit}"\n')


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    record_commit()
    return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    record_commit()
    return build_meta.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    record_commit()
    return build_meta.build_sdist(sdist_directory, config_settings)
