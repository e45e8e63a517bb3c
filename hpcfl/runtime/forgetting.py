"""FedKA's forgetting degree (eq. 1), an evaluation a job turns on with eval.forgetting (FedKA's jobs
do; any algorithm with a global model may): each round, the class-wise test accuracy of the global
model the round starts from and of every trained local model, and per sampled client and class
(acc_global - acc_local) / (acc_global + xi).

The round loop knows it only as an evaluation extension (`job.extensions`): `blocks` asks the workers
for a per-client block of class accuracies beside the metric rows (hpcfl.runtime.report), `round_starts`
tests the starting model on the server, and `report` turns the reduced blocks into the round's metrics.
"""
import numpy as np

from hpcfl.runtime.report import CLIENT_COLUMN, split_report

XI = 1e-3            # xi of FedKA eq. (1), which keeps a class the global model never gets finite


class Forgetting:
    def __init__(self):
        self.start_acc = None

    def blocks(self, job) -> dict[str, int]:
        """The per-client blocks the workers fill, by width: each trained model's class accuracies."""
        return {"class_acc": job.num_classes}

    def round_starts(self, job, evaluation: dict) -> None:
        """On the server: the class accuracies of the model this round starts from, which the last
        round's evaluation measured when it had one, else tested now."""
        if job.server:
            tested = evaluation.get("class/test_acc")
            self.start_acc = tested if tested is not None else job.server.evaluate()["class_acc"]

    def report(self, job, cohort: list[int], flat: np.ndarray) -> dict:
        """The round's forgetting metrics from the reduced report. A client whose update was non-finite
        had no model tested: NaN, not the ~1 its zero row would give."""
        rows, blocks, _ = split_report(job, flat)
        tested = [c for c in cohort if not rows[c, CLIENT_COLUMN["nonfinite"]] > 0]     # 1 or NaN (not set)
        local = np.full((job.config.data.num_clients, job.num_classes), np.nan)
        local[tested] = blocks["class_acc"][tested]
        return {"class/start_acc": self.start_acc, "client_class/test_acc": local,
                "client_class/forgetting": (self.start_acc - local) / (self.start_acc + XI)}
