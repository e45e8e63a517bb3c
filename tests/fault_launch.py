"""`python -m hpcfl.launch`, except that every client update on MPI rank 2 raises (failure tests)."""
import os
import sys

from hpcfl import launch
from hpcfl.algorithms.fedavg import FedAvg

_update = FedAvg.client_update


def _failing_update(self, phase, round, client, *args):
    if os.environ.get("PMI_RANK") == "2":
        raise RuntimeError(f"injected failure in client {client.id}")
    return _update(self, phase, round, client, *args)


FedAvg.client_update = _failing_update
sys.exit(launch.main())
