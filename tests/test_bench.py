"""The benchmark scripts run (a name that moved breaks a test, not a reader): each in its smoke mode."""
import json
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def test_batched_bench_compares_both_paths_and_writes_its_table(tmp_path):
    done = subprocess.run([sys.executable, "bench/batched.py", "--smoke", "--out", str(tmp_path)], cwd=REPOSITORY,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "batched.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["fedavg", "fedcme"]
    assert all(r["sequential_s"] > 0 and r["batched_s"] > 0 and r["max_test_acc_drift"] < 1e-3 for r in rows)
    assert "| fedcme |" in (tmp_path / "batched.md").read_text()


def test_cache_memory_bench_measures_both_ways_in_one_run():
    done = subprocess.run([sys.executable, "bench/cache_memory.py", "--smoke"], cwd=REPOSITORY, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| read |" in done.stdout and "| mapped |" in done.stdout and "mapped / read, per process" in done.stdout
