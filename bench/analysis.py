"""Time to tabulate a sweep's result files: `python -m hpcfl.analyze` on N files of R rounds (default
500 x 200, 20 clients each, like a sweep of 5 algorithms x 10 settings x 10 seeds). One file is
written by the Recorder and copied with each run's own configuration.

    python bench/analysis.py [--files 500] [--rounds 200]
    python bench/analysis.py --smoke      # 5 files of 5 rounds: checks that the bench runs (CI)
"""
import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from hpcfl.analyze import main as analyze
from hpcfl.metrics import Recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="5 files of 5 rounds: checks that the bench runs")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.rounds = 5, 5
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        template = folder / "template.h5"
        with Recorder.create(template, {"config": {}}) as recorder:
            for r in range(args.rounds):
                recorder.append_round(r, {"round/test_acc": rng.random(), "round/train_loss": rng.random(),
                                          "client/train_loss": rng.random(20), "class/test_acc": rng.random(10)})
            recorder.set_attr("status", "completed")
        for i in range(args.files):
            config = {"algorithm": {"name": f"alg{i % 5}"}, "data": {"partition_params": {"beta": i // 5 % 10}},
                      "run": {"seed": i // 50, "name": f"run{i}"}}
            path = folder / "study" / f"run{i}.h5"
            path.parent.mkdir(exist_ok=True)
            shutil.copy(template, path)
            with h5py.File(path, "r+") as file:
                file.attrs["config"] = json.dumps(config)
        template.unlink()
        start = time.perf_counter()
        analyze(["table", str(folder / "study"), "--format", "csv"])
        print(f"tabulated {args.files} files of {args.rounds} rounds in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
