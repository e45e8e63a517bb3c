"""hpcfl's version and commit, read without importing the rest of hpcfl: for `hpcfl.__version__`
and `hpcfl.__commit__`, `hpcfl --version`, and a result file's provenance (hpcfl.runtime.provenance,
which so reads nothing from the package `hpcfl`, whose `run` imports the launcher that records
provenance).

The version is written once, as pyproject.toml's `[project] version`, and read from the package
metadata it becomes: an installed hpcfl's distribution metadata (importlib.metadata), or, run from
a source tree (a checkout on PYTHONPATH or installed in editable mode), the pyproject.toml beside
the package, which is what the tree's code is (as `git_commit` prefers the checkout's HEAD). The
commit an install was built from is the one hpcfl/_commit.py names, written when hpcfl is built
(build-backend/hpcfl_build.py).
"""
import functools
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent          # the hpcfl folder in use


@functools.cache
def version() -> str:
    """The version of the hpcfl in use: its source tree's, else its installed distribution's, else
    'unknown'."""
    tree = PACKAGE.parent / "pyproject.toml"
    if tree.is_file():
        import tomllib

        try:
            project = tomllib.loads(tree.read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == "hpcfl" and isinstance(project.get("version"), str):
            return project["version"]
    from importlib import metadata

    try:
        return metadata.version("hpcfl")
    except metadata.PackageNotFoundError:
        return "unknown"


def built_commit() -> str:
    """The commit hpcfl was built from (hpcfl/_commit.py), or "" for a source tree never built."""
    try:
        from hpcfl._commit import __commit__
    except ImportError:
        return ""
    return __commit__


def git_commit() -> str:
    """The commit of the hpcfl in use: the checkout's HEAD when it runs from one (with "-dirty" for
    uncommitted changes to tracked files), else the commit it was built from (built_commit,
    recorded when it was built), else 'unknown'."""
    built = built_commit() or "unknown"
    here = str(PACKAGE)
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel", "HEAD"],
                              capture_output=True, text=True, timeout=5)
        if (head.returncode != 0
                or Path(head.stdout.split()[0]).resolve() != PACKAGE.resolve().parent):
            return built    # not a checkout of hpcfl (an install inside another repo)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return built
    return head.stdout.split()[1] + ("-dirty" if dirty else "")
