"""What a round reports: each client's metrics and each rank's figures, summed onto the server in
one reduce, then written to the result file and the console.

Client metrics travel as the columns CLIENT_METRICS of a clients x metrics matrix (a client's row
is filled by the rank that trained it, zeros elsewhere), rank figures as the columns RANK_METRICS
of a ranks x figures matrix; both go up in the round's one `report` reduce.
"""
import logging

import numpy as np

from hpcfl.runtime.memory import peak_bytes
from hpcfl.transport import Traffic

LOG = logging.getLogger(__name__)

CLIENT_METRICS = ("train_loss", "steps", "val_acc", "local_test_acc", "local_test_loss", "test_acc", "nonfinite",
                  "num_samples")
CLIENT_COLUMN = {name: j for j, name in enumerate(CLIENT_METRICS)}      # a client metric's column in the rows
RANK_METRICS = ("compute_s", "wait_s", "wire_sent_bytes", "wire_received_bytes", "client_state_bytes",
                "max_rss_bytes")


def client_blocks(job) -> dict[str, np.ndarray]:
    """This round's per-client blocks beside the metric rows, zero-filled, each filled by the rank that
    trains the client: those the job's evaluation extensions ask for (eval.forgetting's `class_acc`,
    client x class accuracies of the trained model) and `local_test_correct` (client x its own test
    examples' correctness, padded to the largest set; with data.local_test_ratio), so that personalised
    accuracy can be analysed example by example."""
    n = job.config.data.num_clients
    blocks = {name: np.zeros((n, width))
              for extension in job.extensions for name, width in extension.blocks(job).items()}
    if job.local_test_sizes is not None:
        blocks["local_test_correct"] = np.zeros((n, int(job.local_test_sizes.max(initial=0))))
    return blocks


def split_report(job, flat: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """The reduced report as (client x CLIENT_METRICS, the client blocks by name (`client_blocks`),
    rank x RANK_METRICS)."""
    n = job.config.data.num_clients
    widths = {name: block.shape[1] for name, block in client_blocks(job).items()}
    width = len(CLIENT_METRICS) + sum(widths.values())
    clients = flat[:n * width].reshape(n, width)
    ranks = flat[n * width:].reshape(job.transport.size, len(RANK_METRICS))
    blocks, at = {}, len(CLIENT_METRICS)
    for name, w in widths.items():
        blocks[name], at = clients[:, at:at + w], at + w
    return clients[:, :len(CLIENT_METRICS)], blocks, ranks


def gather_report(job, rows: np.ndarray, blocks: dict[str, np.ndarray], hosted: list[int],
                  stats: Traffic) -> np.ndarray | None:
    """Sum clients' metric rows, their blocks (`client_blocks`) and each rank's RANK_METRICS (`stats`: its
    round's traffic) onto the server."""
    transport = job.transport
    for cid in hosted:                  # the rank that trained a client this round gives its size
        rows[cid, CLIENT_COLUMN["num_samples"]] = job.worker.clients[cid].num_samples
    ranks = np.zeros((transport.size, len(RANK_METRICS)))
    compute = sum(part.compute_s for part in (job.worker, job.server) if part)
    state = job.worker.client_state_bytes() if job.worker else 0
    peak = peak_bytes()
    ranks[transport.rank] = (compute, stats.wait_s, sum(stats.sent.values()), sum(stats.received.values()), state,
                             peak)
    for part in (job.worker, job.server):
        if part:
            part.compute_s = 0.0
    clients = np.concatenate([rows, *blocks.values()], axis=1)
    flat = transport.reduce_sum("report", np.concatenate([clients.ravel(), ranks.ravel()]))
    return flat


def local_test_bits(job, correct: np.ndarray, cohort: list[int]) -> np.ndarray:
    """The cohort's trained models' correctness on their clients' own test examples, every client's
    examples in client order (an unsampled client's as zeros: its client/local_test_acc is NaN), packed."""
    sampled = np.zeros(len(correct), dtype=bool)
    sampled[cohort] = True
    bits = [row[:size] * sampled[c] for c, (row, size) in enumerate(zip(correct, job.local_test_sizes, strict=True))]
    return np.packbits(np.concatenate(bits) > 0.5)


def _finite(values: np.ndarray) -> np.ndarray:
    """The entries that are numbers: a dropped or unsampled client's NaN is no one's score."""
    return values[np.isfinite(values)]


def record(job, round, hosts, flat, evaluation, phase_s, moved, round_s, progress: str = "") -> None:
    cfg, n, cohort = job.config, job.config.data.num_clients, list(hosts)
    rows, blocks, ranks = split_report(job, flat)
    sampled = np.zeros(n, dtype=bool)
    sampled[cohort] = True
    values = {"client/rank": np.full(n, np.nan)}
    values["client/rank"][cohort] = [hosts[c] for c in cohort]
    for j, key in enumerate(CLIENT_METRICS[:-1]):
        if key in job.client_metrics:
            values[f"client/{key}"] = np.where(sampled, rows[:, j], np.nan)
    if "client/local_test_acc" in values:                  # personalised accuracy across the cohort's
        personal = _finite(values["client/local_test_acc"][cohort])  # models (a dropped client's is NaN)
        values["round/personal_acc_mean"], values["round/personal_acc_std"] = (
            (personal.mean(), personal.std()) if len(personal) else (np.nan, np.nan))
    if "local_test_correct" in blocks:
        values["example/local_test_correct"] = local_test_bits(job, blocks["local_test_correct"], cohort)
    if "client/val_acc" in values and not job.algorithm.traits.global_model and cfg.evaluates(round):
        held = _finite(values["client/val_acc"][cohort])           # the clients' own models (none if all dropped)
        values["round/val_acc"] = float(held.mean()) if len(held) else np.nan
    samples, loss, steps = (rows[:, CLIENT_COLUMN[key]] for key in ("num_samples", "train_loss", "steps"))
    if "client/train_loss" in values:     # no step, no loss (a BatchNorm model's client of one sample): not 0
        values["client/train_loss"][sampled & (steps == 0)] = np.nan
    # a dropped client is left out, and one that took no step
    # (a plug-in that reports no steps, NaN, still counts)
    trained = [c for c in cohort if not steps[c] == 0 and not rows[c, CLIENT_COLUMN["nonfinite"]] > 0]
    values["round/train_loss"] = (float(np.sum(loss[trained] * samples[trained]) / np.sum(samples[trained]))
                                  if trained else np.nan)
    values.update(evaluation)
    for direction, by_name in moved.items():
        values.update({f"round/bytes_{direction}/{k}": float(v) for k, v in by_name.items()})
    values.update({f"round/phase_s/{k}": v for k, v in phase_s.items()})
    for j, key in enumerate(RANK_METRICS):
        values[f"rank/{key}"] = ranks[:, j]
    values["round/time_s"] = round_s
    compute = values["rank/compute_s"][int(len(ranks) > 1):]     # the workers' (or the one rank's)
    values["round/imbalance_s"] = float(compute.max() - compute.mean())     # what the average worker waits
    job.recorder.append_round(round, values)
    acc, personal = values.get("round/test_acc"), values.get("round/personal_acc_mean")
    text = "" if acc is None else f"test_acc {acc:.4f}  test_loss {values['round/test_loss']:.4f}  "
    text += "" if personal is None else f"personal_acc {personal:.4f}  "
    text += f"val_acc {values['round/val_acc']:.4f}  " if "round/val_acc" in values else ""
    LOG.info(f"round {round + 1:>4}/{cfg.run.rounds}  {text}train_loss {values['round/train_loss']:.4f}  "
             f"{round_s:6.2f} s  {progress}".rstrip())
    state = values["rank/client_state_bytes"]
    if round == cfg.run.rounds - 1 and state.any():
        LOG.info("per-client state held on the workers' CPUs: " +
                 ", ".join(f"rank {r} {b / 2**20:.1f} MiB" for r, b in enumerate(state) if b))
