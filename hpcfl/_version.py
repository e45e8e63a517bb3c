"""hpcfl's version and the commit it was built from, read without importing the rest of hpcfl: for
`hpcfl.__version__` and `hpcfl.__commit__`, `hpcfl --version`, and a result file's provenance
(hpcfl.runtime.provenance, which so reads nothing from the package `hpcfl`, whose `run` imports the
launcher that records provenance).

The version is written once, as pyproject.toml's `[project] version`, and read from the package
metadata it becomes: an installed hpcfl's distribution metadata (importlib.metadata), or, run from
a source tree (a checkout on PYTHONPATH or installed in editable mode), the pyproject.toml beside the
package, which is what the tree's code is (as git_commit prefers the checkout's HEAD). The commit is
the one hpcfl/_commit.py names, written when hpcfl is built (build-backend/hpcfl_build.py).
"""
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent          # the hpcfl folder in use


@functools.cache
def version() -> str:
    """The version of the hpcfl in use: its source tree's, else its installed distribution's, else 'unknown'."""
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
