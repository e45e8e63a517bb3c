"""Mutation score: how many small bugs planted in a module its own tests catch.

A mutant is the module with one change: an arithmetic, comparison or boolean operator swapped, a
constant shifted (n -> n + 1, 0.0 -> 1.0, x -> 2x, True <-> False), a `not` or unary minus dropped, or
one statement deleted (a call, an assignment, a raise, an assert). Decorated functions, properties
and dataclass methods are mutated like any other code; docstrings, strings and annotations are not.
Each mutant runs the module's own tests (MPI tests deselected, stopping at the first failure); it
is *killed* when a test fails or the run outlives its time limit, and *survives* otherwise.

    python tools/mutation.py                      # every module below, 2 mutants at a time
    python tools/mutation.py --modules payload algorithms/anchors --jobs 2 --out survivors.txt
    python tools/mutation.py --list               # the modules and their tests

Reading survivors. A survivor is either *equivalent* (the change cannot alter behaviour, e.g.
`x >= 0` -> `x > 0` where x is never 0 by construction, or a constant in a log message) or a *real*
gap: a behaviour no test pins. Fix a real gap with a test that fails on the mutant. List an
equivalent one in tools/mutation_equivalent.txt as `module :: mutation :: source line` (copy the
survivor's line from --out; line numbers are not part of the key, so edits elsewhere keep it); the
score counts it neither way. Score = killed / (mutants - listed equivalents).

Speed: torch, numpy and friends are imported once; each mutant is a fork that imports hpcfl from a
private copy of the tree with the mutated file, then runs pytest in-process. Not part of CI (tens
of minutes); run it before closing an issue that changes these modules.
"""
import argparse
import ast
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = Path(__file__).with_name("mutation_equivalent.txt")

# module (relative to hpcfl/) -> its own tests
MODULES = {
    "payload": ["tests/test_payload.py"],
    "transport/local": ["tests/transport/test_local.py"],
    "transport/base": ["tests/transport/test_local.py"],
    "algorithms/anchors": ["tests/algorithms/test_anchors.py"],
    "data/partition": ["tests/data/test_partition.py"],
    "data/splits": ["tests/data/test_partition.py", "tests/algorithms/test_fedka.py"],
    "data/cache": ["tests/data/test_cache.py"],
    "data/base": ["tests/data/test_datasets.py", "tests/data/test_cache.py",
                  "tests/runtime/test_pixel_clients.py"],
    "analysis/tables": ["tests/analysis/test_tables.py", "tests/analysis/test_noise.py"],
    "analysis/paired": ["tests/analysis/test_tables.py", "tests/analysis/test_noise.py"],
    "terms/weights": ["tests/test_terms.py"],
    "terms/contrastive": ["tests/test_terms.py"],
    "terms/logits": ["tests/test_terms.py", "tests/algorithms/test_fedka.py"],
    "terms/matching": ["tests/test_terms.py"],
    "algorithms/fedavg": ["tests/algorithms/test_fedavg.py", "tests/algorithms/test_baselines.py",
                          "tests/algorithms/test_fedka.py"],
    "algorithms/fedavgm": ["tests/algorithms/test_baselines.py", "tests/test_terms.py",
                           "tests/algorithms/test_fedavg.py"],
    "algorithms/fedopt": ["tests/algorithms/test_fedopt.py"],
    "algorithms/scaffold": ["tests/algorithms/test_baselines.py", "tests/algorithms/test_scaffold.py",
                            "tests/algorithms/test_fedavg.py"],
    "algorithms/fednova": ["tests/algorithms/test_baselines.py", "tests/algorithms/test_fedavg.py"],
    "algorithms/feddyn": ["tests/algorithms/test_baselines.py"],
    "algorithms/fedfm_lite": ["tests/algorithms/test_baselines.py", "tests/algorithms/test_anchors.py"],
    "algorithms/fedclassavg": ["tests/algorithms/test_fedclassavg.py"],
    "algorithms/fedcme": ["tests/algorithms/test_fedcme.py"],
    "algorithms/fedma": ["tests/algorithms/test_fedma.py"],
    "algorithms/bbp_map": ["tests/algorithms/test_bbp_map.py", "tests/algorithms/test_fedma.py"],
    "algorithms/neurons": ["tests/algorithms/test_neurons.py", "tests/algorithms/test_fedma.py"],
    "algorithms/fedproto": ["tests/algorithms/test_fedclassavg.py", "tests/algorithms/test_fedavg.py"],
    "algorithms/personal": ["tests/algorithms/test_fedclassavg.py", "tests/algorithms/test_baselines.py",
                            "tests/algorithms/test_fedavg.py"],
    "algorithms/local": ["tests/algorithms/test_baselines.py", "tests/algorithms/test_fedma.py"],
    "plugins": ["tests/test_plugins.py", "tests/test_config.py"],
    "models/cnn": ["tests/models/test_models.py"],
    "algorithms/base": ["tests/algorithms/test_contract.py", "tests/algorithms/test_moving_clients.py",
                        "tests/algorithms/test_fedavg.py", "tests/algorithms/test_baselines.py", "tests/test_terms.py",
                        "tests/test_plugins.py", "tests/runtime/test_pixel_clients.py"],
    "models/tcnn": ["tests/models/test_models.py"],
    "training/__init__": ["tests/training/test_local_trainer.py", "tests/algorithms/test_fedavg.py",
                          "tests/algorithms/test_scaffold.py", "tests/training/test_batched.py", "tests/test_terms.py",
                          "tests/algorithms/test_fedclassavg.py"],
    "training/batched": ["tests/training/test_batched.py"],
    "training/recording": ["tests/training/test_batched.py"],
    "training/graphs": ["tests/training/test_batched.py"],
    "algorithms/anchored": ["tests/algorithms/test_anchors.py", "tests/algorithms/test_baselines.py",
                            "tests/test_terms.py"],
    "terms/base": ["tests/test_terms.py", "tests/algorithms/test_baselines.py"],
    "runtime/placement": ["tests/runtime/test_placement.py", "tests/models/test_memory_format.py"],
    "seeding": ["tests/test_seeding.py"],
    "algorithms/initial": ["tests/algorithms/test_fedavg.py", "tests/algorithms/test_baselines.py"],
    "runtime/forgetting": ["tests/algorithms/test_fedka.py"],
    "analysis/noise": ["tests/analysis/test_noise.py"],
    "analysis/results": ["tests/analysis/test_tables.py"],
    "data/augment": ["tests/data/test_augment.py"],
    "models/common": ["tests/models/test_models.py"],
    "metrics/reader": ["tests/metrics/test_recorder.py"],
    "metrics/recorder": ["tests/metrics/test_recorder.py"],
    "config": ["tests/test_config.py", "tests/test_config_properties.py"],
    "models/fedma": ["tests/models/test_models.py", "tests/algorithms/test_fedma.py"],
    "algorithms/phases": ["tests/algorithms/test_fedcme.py", "tests/algorithms/test_fedma.py"],
    "sweep": ["tests/test_sweep.py"],
    "analysis/plots": ["tests/analysis/test_plots.py", "tests/analysis/test_tables.py"],
    "runtime/worker": ["tests/runtime/test_worker.py", "tests/training/test_batched.py", "tests/test_plugins.py"],
    "terms/__init__": ["tests/test_terms.py"],
    "runtime/checkpoint": ["tests/runtime/test_checkpoint.py"],
    "runtime/resume": ["tests/runtime/test_checkpoint.py"],
    "runtime/report": ["tests/runtime/test_report.py"],
    "runtime/server": ["tests/runtime/test_server.py"],
    "runtime/lock": ["tests/runtime/test_lock.py"],
    "jobs": ["tests/test_config.py"],
    "models/evaluation": ["tests/models/test_evaluation.py"],
    "models/__init__": ["tests/models/test_models.py", "tests/models/test_memory_format.py",
                        "tests/models/test_evaluation.py", "tests/test_plugins.py"],
    "params": ["tests/models/test_models.py", "tests/test_config.py", "tests/test_plugins.py"],
    "data/idx": ["tests/data/test_idx.py", "tests/data/test_datasets.py"],
    "data/client": ["tests/data/test_client.py"],
    "logs": ["tests/test_logs.py"],
    "data/cifar": ["tests/data/test_datasets.py"],
    "data/folders": ["tests/data/test_datasets.py"],
    "data/leaf": ["tests/data/test_datasets.py"],
    "data/datasets": ["tests/data/test_datasets.py", "tests/test_plugins.py"],
    "analysis/export": ["tests/analysis/test_export.py"],
    "metrics/feature_space": ["tests/metrics/test_feature_space.py"],
    "models/vision": ["tests/models/test_models.py"],
    "models/alexnet": ["tests/models/test_models.py"],
    "runtime/memory": ["tests/runtime/test_memory.py"],
    "runtime/provenance": ["tests/runtime/test_provenance.py"],
}

SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
         ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
         ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
         ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.And: ast.Or, ast.Or: ast.And}
DELETABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise, ast.Assert, ast.Delete)


@dataclass(frozen=True)
class Mutant:
    module: str
    index: int            # the index-th mutation site of the module, in walk order
    line: int
    what: str             # e.g. "Add -> Sub", "delete Assign", "2 -> 3"
    source_line: str

    @property
    def key(self) -> str:
        return f"{self.module} :: {self.what} :: {self.source_line}"


def _shift(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return 1.0 if value == 0 else value * 2
    return None


class _Sites(ast.NodeTransformer):
    """Walks a module; counts mutation sites and, when `target` is given, applies that one. The walk
    order is the same with and without a target, so a site's index names one mutant."""

    def __init__(self, target: int | None = None):
        self.target, self.count, self.found = target, 0, []

    def _site(self, node, what: str, apply):
        index = self.count
        self.count += 1
        self.found.append((index, getattr(node, "lineno", 0), what))
        return apply() if index == self.target else node

    def generic_visit(self, node):
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "type_comment"):      # annotations are not code to mutate
                continue
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, self._body(value))
            elif isinstance(value, list):
                setattr(node, name, [self.visit(v) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, name, self.visit(value))
        return node

    def visit_If(self, node):
        if ast.unparse(node.test) == "__name__ == '__main__'":
            return node
        return self.generic_visit(node)

    def _body(self, body):
        out = []
        for i, stmt in enumerate(body):
            if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str):                 # a docstring
                out.append(stmt)
                continue
            declaration = isinstance(stmt, ast.AnnAssign) and stmt.value is None      # a field's type only
            if isinstance(stmt, DELETABLE) and not _is_all(stmt) and not declaration:
                replaced = self._site(stmt, f"delete {type(stmt).__name__}",
                                      lambda s=stmt: ast.copy_location(ast.Pass(), s))
                if replaced is not stmt:
                    out.append(replaced)
                    continue
            out.append(self.visit(stmt))
        return out

    def visit_BinOp(self, node):
        node = self.generic_visit(node)
        new = SWAPS.get(type(node.op))
        if new is None:
            return node
        return self._site(node, f"{type(node.op).__name__} -> {new.__name__}",
                          lambda: ast.copy_location(ast.BinOp(node.left, new(), node.right), node))

    def visit_AugAssign(self, node):
        node = self.generic_visit(node)
        new = SWAPS.get(type(node.op))
        if new is None:
            return node
        return self._site(node, f"{type(node.op).__name__}= -> {new.__name__}=",
                          lambda: ast.copy_location(ast.AugAssign(node.target, new(), node.value), node))

    def visit_Compare(self, node):
        node = self.generic_visit(node)
        for k, op in enumerate(node.ops):
            new = SWAPS.get(type(op))
            if new is not None:
                def apply(k=k, new=new, node=node):
                    ops = list(node.ops)
                    ops[k] = new()
                    return ast.copy_location(ast.Compare(node.left, ops, node.comparators), node)
                node = self._site(node, f"{type(op).__name__} -> {new.__name__}", apply)
        return node

    def visit_BoolOp(self, node):
        node = self.generic_visit(node)
        new = SWAPS[type(node.op)]
        return self._site(node, f"{type(node.op).__name__} -> {new.__name__}",
                          lambda: ast.copy_location(ast.BoolOp(new(), node.values), node))

    def visit_UnaryOp(self, node):
        node = self.generic_visit(node)
        if isinstance(node.op, (ast.Not, ast.USub)):
            return self._site(node, f"drop {type(node.op).__name__}", lambda: node.operand)
        return node

    def visit_Constant(self, node):
        shifted = _shift(node.value)
        if shifted is None:
            return node
        return self._site(node, f"{node.value!r} -> {shifted!r}",
                          lambda: ast.copy_location(ast.Constant(shifted), node))

    def visit_JoinedStr(self, node):       # f-strings: messages, not behaviour
        return node


def _is_all(stmt) -> bool:
    return isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)


def mutants(module: str) -> tuple[str, list[Mutant]]:
    source = (ROOT / "hpcfl" / f"{module}.py").read_text()
    sites = _Sites()
    sites.visit(ast.parse(source))
    lines = source.splitlines()
    return source, [Mutant(module, i, line, what, lines[line - 1].strip() if line else "")
                    for i, line, what in sites.found]


def mutated_source(source: str, index: int) -> str:
    tree = _Sites(index).visit(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(tree))


def _copy_tree(into: Path) -> Path:
    target = into / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", "results", ".venv", ".git")
    for name in ("hpcfl", "tests", "jobs", "docs"):         # docs: tests run its snippets
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", target)
    return target


def _run_tests(tree: Path, tests: list[str]) -> None:
    """In a forked child: import hpcfl from `tree` and run the tests; exits with pytest's status."""
    os.chdir(tree)
    sys.path.insert(0, str(tree))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import pytest
    code = pytest.main(["-x", "-q", "-m", "not mpi", "-p", "no:cacheprovider", "-p", "no:randomly", *tests])
    os._exit(int(code))


def run(selected: list[str], jobs: int, timeout_factor: float, out: Path | None) -> int:
    import numpy, torch, scipy.optimize, h5py, pandas, sklearn  # noqa: F401,E401,I001  (once, before forking)
    torch.set_num_threads(1)
    assert not any(m == "hpcfl" or m.startswith("hpcfl.") for m in sys.modules), "hpcfl must load in the children"
    equivalent = {line.strip() for line in EQUIVALENT.read_text().splitlines()
                  if line.strip() and not line.startswith("#")} if EQUIVALENT.exists() else set()
    scratch = Path(tempfile.mkdtemp(prefix="hpcfl-mutation-"))
    trees = [_copy_tree(scratch / f"slot{k}") for k in range(jobs)]
    report, survivors = [], []
    try:
        for module in selected:
            tests = MODULES[module]
            tests = [t for t in tests if (ROOT / t).exists()]
            source, found = mutants(module)
            baseline = _time_clean(trees[0], tests)
            limit = timeout_factor * baseline + 10
            results = _run_all(found, source, module, tests, trees, limit)
            alive = [m for m in found if not results[m.index]]
            known = [m for m in alive if m.key in equivalent]
            real = [m for m in alive if m.key not in equivalent]
            survivors += real
            counted = len(found) - len(known)
            score = (counted - len(real)) / counted if counted else 1.0
            report.append((module, len(found), len(found) - len(alive), len(known), len(real), score))
            print(f"{module:28s} {len(found):5d} mutants  {len(found) - len(alive):5d} killed  "
                  f"{len(known):3d} equivalent  {len(real):3d} survived  score {score:6.1%}  "
                  f"(tests {baseline:.1f} s)", flush=True)
            if out:                   # as each module ends, so a long run's first survivors can be read
                out.write_text("".join(f"{m.key}    # line {m.line}\n" for m in survivors))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n| module | mutants | killed | equivalent | survived | score |\n|---|---|---|---|---|---|")
    for module, n, killed, known, real, score in report:
        print(f"| {module} | {n} | {killed} | {known} | {real} | {score:.1%} |")
    if out:
        print(f"\n{len(survivors)} survivors -> {out}")
    else:
        print("\nsurvivors:\n" + "\n".join(f"{m.key}    # line {m.line}" for m in survivors))
    return 0


def _time_clean(tree: Path, tests: list[str]) -> float:
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _run_tests(tree, tests)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the unmutated tree fails {tests}: fix the tests first")
    return time.perf_counter() - start


def _run_all(found: list[Mutant], source: str, module: str, tests: list[str], trees: list[Path],
             limit: float) -> dict[int, bool]:
    """Mutant index -> killed, running up to len(trees) mutants at once."""
    pending, running, killed = list(found), {}, {}
    free = list(range(len(trees)))
    while pending or running:
        while pending and free:
            mutant, slot = pending.pop(0), free.pop()
            target = trees[slot] / "hpcfl" / f"{module}.py"
            target.write_text(mutated_source(source, mutant.index))
            pid = os.fork()
            if pid == 0:
                _run_tests(trees[slot], tests)
            running[pid] = (mutant, slot, time.perf_counter())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for other, (_, _, start) in list(running.items()):
                if time.perf_counter() - start > limit:
                    os.kill(other, signal.SIGKILL)          # a hang counts as killed
            time.sleep(0.05)
            continue
        mutant, slot, _ = running.pop(pid)
        killed[mutant.index] = os.waitstatus_to_exitcode(status) != 0
        (trees[slot] / "hpcfl" / f"{module}.py").write_text(source)
        free.append(slot)
    return killed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", nargs="+", choices=sorted(MODULES), default=sorted(MODULES))
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (one core each)")
    parser.add_argument("--timeout-factor", type=float, default=3.0,
                        help="a mutant's limit: this x the clean run + 10 s")
    parser.add_argument("--out", type=Path, default=None, help="write the survivors here")
    parser.add_argument("--list", action="store_true", help="print the modules, their tests and mutant counts")
    args = parser.parse_args(argv)
    if args.list:
        for module in args.modules:
            print(f"{module:28s} {len(mutants(module)[1]):5d} mutants  {' '.join(MODULES[module])}")
        return 0
    return run(args.modules, args.jobs, args.timeout_factor, args.out)


if __name__ == "__main__":
    sys.exit(main())
