"""The import layers the design rests on, read from the source (every import statement, function-level
ones included): algorithms never touch MPI, the runtime and the transport never name a concrete
algorithm (they go through the registry, the contract and the anchor wrapper), and the offline
analysis never pulls in the runtime or the transport; the job's parsing (hpcfl.config) imports
nothing of hpcfl but its errors, and the algorithm contract no local-training implementation."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hpcfl"
CONTRACT = {"hpcfl.algorithms", "hpcfl.algorithms.base", "hpcfl.algorithms.phases", "hpcfl.algorithms.anchored"}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).glob("*.py"))


@pytest.mark.parametrize("path", modules("algorithms"), ids=lambda p: p.name)
def test_algorithms_never_import_mpi(path):
    assert not {m for m in imports(path) if m.split(".")[0] == "mpi4py" or m.startswith("hpcfl.transport")}


@pytest.mark.parametrize("path", modules("runtime") + modules("transport"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_runtime_and_transport_never_name_a_concrete_algorithm(path):
    assert not {m for m in imports(path) if m.startswith("hpcfl.algorithms") and m not in CONTRACT}


@pytest.mark.parametrize("path", modules("analysis") + [PACKAGE / "analyze.py"], ids=lambda p: p.name)
def test_the_analysis_never_imports_the_runtime_or_the_transport(path):
    assert not {m for m in imports(path) if m.startswith(("hpcfl.runtime", "hpcfl.transport", "hpcfl.launch"))}


def test_the_rules_see_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mpi4py import MPI\n    import hpcfl.runtime.job\n")
    assert imports(probe) == {"mpi4py", "hpcfl.runtime.job"}


def test_config_imports_nothing_of_hpcfl_but_its_errors():
    assert {m for m in imports(PACKAGE / "config.py") if m.startswith("hpcfl")} == {"hpcfl.errors"}


def test_the_contract_imports_no_implementation_and_local_training_no_algorithm():
    implementations = ("hpcfl.training", "hpcfl.runtime", "hpcfl.algorithms.")
    for contract in ("base.py", "phases.py"):
        found = imports(PACKAGE / "algorithms" / contract) - {"hpcfl.algorithms.phases"}
        assert not {m for m in found if m.startswith(implementations)}, contract
    assert not {m for m in imports(PACKAGE / "training" / "batched.py") if m.startswith("hpcfl.algorithms")}


def test_the_client_record_and_local_training_sit_below_the_algorithms():
    assert not {m for m in imports(PACKAGE / "data" / "client.py") if m.startswith("hpcfl")}
    for path in modules("training"):
        assert not {m for m in imports(path) if m.startswith("hpcfl.algorithms")}, path.name
