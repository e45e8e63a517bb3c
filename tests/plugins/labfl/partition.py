"""Two partition schemes outside hpcfl (docs/how-to/write-a-partition.md shows them): McMahan et al.'s
pathological shards, and a split read from a file, as another tool (flwr-datasets) wrote it."""
import numpy as np

from hpcfl import DataError


def shards(labels, num_clients, rng, *, per_client: int = 2):
    """McMahan et al. (AISTATS 2017), section 3: the samples sorted by label, cut into
    num_clients * per_client shards of equal size, each client dealt per_client of them at random."""
    if per_client < 1 or num_clients * per_client > len(labels):
        raise DataError(f"data.partition_params.per_client = {per_client}: must be >= 1, with "
                         f"num_clients x per_client <= {len(labels)} samples")
    pieces = np.array_split(np.argsort(labels, kind="stable"), num_clients * per_client)
    order = rng.permutation(len(pieces)).reshape(num_clients, per_client)
    return [np.concatenate([pieces[s] for s in row]) for row in order]


def from_file(labels, num_clients, rng, *, path: str):
    """Client c holds the samples listed under `client_<c>` in the .npz file `path` (indices into the
    training set in hpcfl's order); `rng` is not used: the file is the split."""
    with np.load(path) as table:
        return [table[f"client_{c}"] for c in range(num_clients)]
