"""Per-process memory of the ranks of one node reading the data cache: an entry read into memory
(np.load) against its training pixels mapped (hpcfl.data.cache.read_entry(mapped=True)), in one run.

An entry of --mb MB of uint8 training pixels is written through hpcfl.data.cache (its own writer, a
fingerprint of a dummy source file) into a temporary folder under --dir (default: the system's
temporary folder; the table says whether it is node-local, where hpcfl maps). Then, for each way,
--processes processes start together; each reads the entry, touches every page of the pixels (as a
node's ranks together do when each takes its clients' rows) and waits. While all are alive, the
parent reads each one's VmRSS and RssAnon (/proc/PID/status) and Pss (/proc/PID/smaps_rollup: a
shared page counted 1/n in each of the n processes mapping it). The entry is in the page cache for
both ways (just written), so the read times are warm ones.

    python bench/cache_memory.py [--mb 389] [--processes 3] [--dir DIR] [--smoke]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))

from hpcfl.data import cache  # noqa: E402

CHILD = """
import sys, time
from hpcfl.data.cache import read_entry
start = time.perf_counter()
pixels = read_entry(sys.argv[1], True, mapped=sys.argv[2] == "mapped")["train_x"]
total = sum(int(pixels[i:i + 4096].sum(dtype="uint64")) for i in range(0, len(pixels), 4096))   # every page
print(time.perf_counter() - start, total, flush=True)
sys.stdin.read()                                    # alive until the parent has measured every process
"""


def _kib(path: Path, field: str) -> int:
    return next(int(line.split()[1]) for line in path.read_text().splitlines() if line.startswith(field + ":"))


def measure(entry: Path, way: str, processes: int) -> list[dict]:
    """Start `processes` readers at once; each one's read seconds and memory (MiB) while all are alive."""
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(entry), way], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd=REPOSITORY) for _ in range(processes)]
    try:
        done = [child.stdout.readline().split() for child in children]
        rows = []
        for child, (seconds, _) in zip(children, done, strict=True):
            proc = Path(f"/proc/{child.pid}")
            rows.append({"seconds": float(seconds), "rss": _kib(proc / "status", "VmRSS") / 1024,
                         "anon": _kib(proc / "status", "RssAnon") / 1024,
                         "pss": _kib(proc / "smaps_rollup", "Pss") / 1024})
        if len({total for _, total in done}) != 1:
            raise SystemExit(f"{way}: the processes read different pixels")
        return rows
    finally:
        for child in children:
            child.stdin.close()
            child.wait()


def write_entry(folder: Path, mb: float) -> tuple[Path, int]:
    """A cache entry of `mb` MB of random 3x32x32 pixels, written by hpcfl.data.cache into folder/cache."""
    source = folder / "source.bin"
    source.write_bytes(b"pixels")
    rows = int(mb * 1e6) // (3 * 32 * 32)
    pixels = np.random.default_rng(0).integers(0, 256, (rows, 3, 32, 32), dtype=np.uint8)
    arrays = {"train_x": pixels, "train_y": np.zeros(rows, np.int64),
              "test_x": pixels[:10].copy(), "test_y": np.zeros(10, np.int64)}
    os.environ["HPCFL_CACHE"] = str(folder / "cache")
    cache.cached("bench", [source], lambda train_images: arrays, True)
    return cache.entry_path(folder / "cache", "bench", [source]), rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=389.0, help="MB of training pixels in the entry")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the temporary cache folder goes")
    parser.add_argument("--smoke", action="store_true", help="8 MB: checks that the bench runs")
    args = parser.parse_args(argv)
    mb = 8.0 if args.smoke else args.mb
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        folder = Path(folder)
        entry, rows = write_entry(folder, mb)
        print(f"entry {entry.stat().st_size / 2**20:.0f} MiB ({rows} images of 3x32x32 uint8), cache folder "
              f"node-local (mapped by hpcfl): {cache.node_local(folder)}; {args.processes} processes each way\n")
        print("| way | read s (median) | VmRSS MiB (each, median) | RssAnon MiB | Pss MiB |")
        print("|---|---|---|---|---|")
        medians = {}
        for way in ("read", "mapped"):
            measured = measure(entry, way, args.processes)
            medians[way] = {k: statistics.median(r[k] for r in measured) for k in measured[0]}
            m = medians[way]
            print(f"| {way} | {m['seconds']:.2f} | {m['rss']:.0f} | {m['anon']:.0f} | {m['pss']:.0f} |")
        ratio = {k: medians["mapped"][k] / medians["read"][k] for k in ("rss", "pss")}
        print(f"\nmapped / read, per process: VmRSS {ratio['rss']:.2f}, Pss {ratio['pss']:.2f}")


if __name__ == "__main__":
    main()
