"""The benchmark scripts run (a name that moved breaks a test, not a reader): each in its smoke mode.

Every script in bench/ is run here, tiny, on the CPU, without a network: `--smoke` where the script has
one, `bench/overhead.py` with its own flags on a tiny job, and `bench/gpu.sh` (which needs a GPU) only
checked: its syntax, and that every script it calls exists and takes the flags it passes. The tool and
the bench kept elsewhere (tools/mutation.py, studies/fedclassavg/memory.py) run here too. A smoke run is
mostly start-up (importing torch, in one to three processes), so the selected runs start together, two
at a time, and each test waits for its own.
"""
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
NUMBER = r"-?[\d.]+"

# script -> (its smoke arguments, patterns its output must match)
SMOKE = {
    "bench/aggregation.py": (["--smoke"], [
        r"1\. weighted average, fmnist_cnn: [\d,]+ float64 elements per rank",
        rf"hpcfl aggregate \(sum clients, reduce, divide\) +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}",
        r"2\. FedFM anchors: 10 classes x 128 features",
        rf"3\. FedMA gather, lenet layers, 4 clients.*\n.*\n +conv1 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}"]),
    "bench/analysis.py": (["--smoke"], [rf"tabulated 5 files of 5 rounds in {NUMBER} s"]),
    "bench/baselines.py": (["--smoke"], [
        rf"fedavg +{NUMBER} s/round +{NUMBER} s/client +1\.00x"]),
    "bench/checkpoint.py": (["--smoke"], [
        rf"SCAFFOLD, 10 clients, 1 rank\(s\): checkpoint {NUMBER} MiB, written in {NUMBER} s"]),
    "bench/fedma_matching.py": (["--smoke"], [
        rf"independent: conv1 {NUMBER} s \(\d+\).*classifier {NUMBER} s \(10\); pass total {NUMBER} s",
        rf"related: conv1 {NUMBER} s \(\d+\).*pass total {NUMBER} s"]),
    "bench/idle.py": (["--smoke"], [
        r"mpirun -np 3: 10 of 20 clients per round, 2 rounds",
        rf"server +poll +\d+ +{NUMBER} +{NUMBER} +{NUMBER}%",
        rf"polled waiting in the rounds, CPU % of a core: server {NUMBER} %"]),
    "bench/load.py": (["--smoke"], [
        rf"append_round \(write \+ flush \+ commit\): median {NUMBER} ms",
        r"equal to what was written: True",
        rf"load_table_cnn: {NUMBER} MiB of parameters, output \(4, 10\)"]),
    "bench/memory_format.py": (["--smoke"], [
        rf"fmnist_cnn +training contiguous +{NUMBER} s +channels_last +{NUMBER} s +ratio {NUMBER}"]),
    "bench/scaling.py": (["--smoke"], [
        rf"\n +1 +{NUMBER} +1\.00 +100% \|",
        rf"Model: T_round\(W\) ~ L\(W\) \* {NUMBER} s"]),
    "studies/fedclassavg/memory.py": (["--smoke"], [
        r"classifier bytes per client per round: down [\d,]+, up [\d,]+",
        rf"rank 0: client state +{NUMBER} MiB, peak RSS +{NUMBER} MiB"]),
    "tools/mutation.py": (["--list"], [r"payload +\d+ mutants +tests/test_payload\.py"]),
    "tools/setup_walk.py": ([], [r"functions \d+, files \d+, entries \d+, climbs \d+, re-entries \d+",
                                 r"most re-entered: hpcfl/"]),
}
# bench/ scripts run by their own tests below; bench/runs.py is the helper the others share
OWN_TEST = {"bench/batched.py", "bench/cache_memory.py", "bench/overhead.py", "bench/partitions_flwr.py",
            "bench/gpu.sh", "bench/runs.py"}


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, script, *args], cwd=REPOSITORY, capture_output=True, text=True,
                          timeout=280)
    assert done.returncode == 0, f"{script} {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def smoke(request, tmp_path_factory):
    """script -> the future of its smoke run's stdout, for the scripts the selected tests of this module
    name (their `script` parameter); `smoke["folder"]` is where runs write."""
    folder = tmp_path_factory.mktemp("bench")
    tiny = folder / "tiny.toml"         # the quickstart on `digits`
    tiny.write_text((REPOSITORY / "jobs" / "quickstart.toml").read_text().replace('"fashion_mnist"', '"digits"'))
    args = {script: smoke_args for script, (smoke_args, _) in SMOKE.items()}
    args["bench/overhead.py"] = ["--job", str(tiny), "--rounds", "1", "--repeat", "2", "--training"]
    args["bench/batched.py"] = ["--smoke", "--out", str(folder / "batched")]
    args["bench/cache_memory.py"] = ["--smoke"]
    here = Path(__file__).resolve()
    selected = [item.callspec.params["script"] for item in request.session.items
                if item.path.resolve() == here and "script" in getattr(getattr(item, "callspec", None), "params", {})]
    with ThreadPoolExecutor(2) as pool:
        futures = {s: pool.submit(run, s, *args[s]) for s in dict.fromkeys(selected) if s in args}
        yield {**futures, "folder": folder}
        for future in futures.values():
            future.cancel()


def test_every_bench_script_is_run_by_a_test():
    scripts = {p.relative_to(REPOSITORY).as_posix() for p in (REPOSITORY / "bench").iterdir() if p.is_file()}
    assert scripts == {s for s in [*SMOKE, *OWN_TEST] if s.startswith("bench/")}


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_bench_script_runs_in_its_smoke_mode(script, smoke):
    patterns = SMOKE[script][1]
    out = smoke[script].result()
    missing = [p for p in patterns if not re.search(p, out)]
    assert not missing, f"{script} printed:\n{out}\nwithout {missing}"


@pytest.mark.parametrize("script", ["bench/overhead.py"])
def test_overhead_bench_compares_training_with_the_floor_on_a_tiny_job(script, smoke):
    """bench/overhead.py keeps its flags as they are: a tiny job (the quickstart on `digits`), one round,
    the training comparison alone, two pairs."""
    out = smoke[script].result()
    assert re.search(rf"training \(rounds only, one process\) +hpcfl +{NUMBER} s +floor +{NUMBER} s +ratio {NUMBER} "
                     rf"+paired: mean {NUMBER}, 95 % interval", out), out
    assert out.count("floor rounds_s=") == 2


@pytest.mark.parametrize("script", ["bench/batched.py"])
def test_batched_bench_compares_both_paths_and_writes_its_table(script, smoke):
    smoke[script].result()
    out = smoke["folder"] / "batched"
    rows = json.loads((out / "batched.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["fedavg", "fedcme"]
    assert all(r["sequential_s"] > 0 and r["batched_s"] > 0 and r["batched_drift"] < 1e-3 for r in rows)
    assert "| fedcme |" in (out / "batched.md").read_text()


@pytest.mark.parametrize("script", ["bench/cache_memory.py"])
def test_cache_memory_bench_measures_both_ways_in_one_run(script, smoke):
    out = smoke[script].result()
    assert "| read |" in out and "| mapped |" in out and "mapped / read, per process" in out


def test_partitions_bench_compares_both_tools_and_both_round_trips():
    pytest.importorskip("flwr_datasets", reason="bench/partitions_flwr.py needs flwr-datasets (not an hpcfl "
                        "dependency)")
    out = run("bench/partitions_flwr.py", "--smoke")
    assert "| hpcfl / flwr-datasets | clients |" in out and "Round trips:" in out and "DIFFERENT" not in out


def test_the_gpu_script_parses_and_calls_scripts_that_take_its_flags():
    """bench/gpu.sh needs a GPU: here its syntax, and each `$py SCRIPT --flag ...` it runs names a script
    that exists and declares every flag."""
    subprocess.run(["sh", "-n", "bench/gpu.sh"], cwd=REPOSITORY, check=True)
    text = (REPOSITORY / "bench" / "gpu.sh").read_text().replace("\\\n", " ")
    calls = [shlex.split(line.split("2>&1")[0])[1:] for line in text.splitlines() if line.startswith("$py ")]
    assert len(calls) >= 5
    for script, *args in calls:
        source = (REPOSITORY / script).read_text()
        flags = [a for a in args if a.startswith("--")]
        assert flags and all(f'"{flag}"' in source for flag in flags), (script, flags)


def test_the_setup_walk_counts_entries_climbs_and_re_entries_by_hand():
    spec = importlib.util.spec_from_file_location("setup_walk", REPOSITORY / "tools" / "setup_walk.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    steps = [("call", "launch.py", "main"), ("call", "jobs.py", "load"), ("call", "config.py", "parse"),
             ("climb", "jobs.py", ""), ("call", "jobs.py", "check"),          # same file: no move
             ("climb", "launch.py", ""), ("call", "config.py", "name"), ("call", "config.py", "more"),
             ("climb", "launch.py", ""), ("call", "jobs.py", "resolve")]
    counts = tool.walk(steps)
    assert {k: counts[k] for k in ("functions", "files", "entries", "climbs", "re-entries")} == {
        "functions": 7, "files": 3, "entries": 5, "climbs": 3, "re-entries": 2}
    assert counts["most re-entered"] == [("config.py", 1), ("jobs.py", 1)]


def test_the_setup_walk_climbs_back_only_to_what_the_reader_read_and_glances_at_short_functions(tmp_path):
    """A known function (read before) that calls back into the reader's file is no place to climb to;
    a function of at most `glance` lines is taken in from its call, not read."""
    spec = importlib.util.spec_from_file_location("setup_walk", REPOSITORY / "tools" / "setup_walk.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    (tmp_path / "hpcfl").mkdir()
    (tmp_path / "hpcfl" / "b.py").write_text("def apply(f):\n    f()\n    return 1\n")
    (tmp_path / "hpcfl" / "a.py").write_text(
        "import b\n"
        "def main():\n    b.apply(one)\n    b.apply(two)\n    tiny()\n    three()\n    stop()\n"
        "def one():\n    return 1\n" "def two():\n    return 2\n" "def three():\n    return 3\n"
        "def tiny(): return 0\n" "def stop(): return 0\n")
    sys.path.insert(0, str(tmp_path / "hpcfl"))
    try:
        a = importlib.import_module("a")
        steps = tool.trace(a.main, tmp_path, ("hpcfl/a.py", "stop"), glance=1)
    finally:
        sys.path.remove(str(tmp_path / "hpcfl"))
        sys.modules.pop("a", None), sys.modules.pop("b", None)
    assert steps == [("call", "hpcfl/a.py", "main"), ("call", "hpcfl/b.py", "apply"),
                     ("call", "hpcfl/a.py", "one"), ("climb", "hpcfl/b.py", ""), ("climb", "hpcfl/a.py", ""),
                     ("call", "hpcfl/a.py", "two"), ("call", "hpcfl/a.py", "three")]
    assert tool.walk(steps)["re-entries"] == 1      # `one`, from b; `two` and `three` are read in a
