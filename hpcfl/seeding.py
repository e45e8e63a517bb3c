"""Random generators derived from (seed, purpose, *keys) — never from the rank.

Every random choice in a run (cohort schedule, partition, model init, a client's batches in a round)
draws from its own generator keyed by what it is for, so a job gives the same numbers whether its
clients live on one process or on many.

NumPy's SeedSequence pads its entropy to four words with zeros, so a trailing zero key within those
words names the stream without it: (seed, "init", 0) is (seed, "init") (keys past the fourth word
are not padded, and callers add a trailing `part` key only when it is not 0). Streams that must
differ take purposes of their own (the one such pair, "init" for the global model and ("init",
client) for `init = "independent"`, is harmless: client 0's own initialisation is then the global
model's, which round 0 does not send).
Changing the derivation would change every stream, and so every result.
"""
import zlib

import numpy as np
import torch


def _entropy(seed: int, purpose: str, keys: tuple[int, ...]) -> list[int]:
    return [int(seed), zlib.crc32(purpose.encode()), *(int(k) for k in keys)]


def numpy_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A NumPy generator for `purpose` (e.g. "cohort", "partition") and integer keys (round, client)."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, purpose, keys)))


def torch_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit torch seed for `purpose` and keys; the same derivation as `numpy_rng`."""
    state = np.random.SeedSequence(_entropy(seed, purpose, keys)).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def torch_generator(seed: int, purpose: str, *keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator on `device` seeded from (seed, purpose, *keys)."""
    return torch.Generator(device=device).manual_seed(torch_seed(seed, purpose, *keys))


def cohort_schedule(seed: int, rounds: int, num_clients: int, per_round: int) -> np.ndarray:
    """rounds x per_round sorted client ids, from one generator drawn up front: every rank (and an
    algorithm that plans with the cohort, such as FedCME's matching) knows every round's cohort."""
    rng = numpy_rng(seed, "cohort")
    return np.stack([np.sort(rng.choice(num_clients, per_round, replace=False)) for _ in range(rounds)])
