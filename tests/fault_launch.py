"""`python -m hpcfl.launch` with one injected fault (failure tests), chosen by HPCFL_FAULT:

- "raise": every client update on MPI rank 2 raises;
- "hang" / "die": MPI rank 2 stops itself (SIGSTOP: alive, never answers) / is killed (SIGKILL) in
  its first client update of round HPCFL_FAULT_ROUND (1-based);
- "nan": client HPCFL_FAULT_CLIENT trains on NaN inputs in round HPCFL_FAULT_ROUND, on whichever
  rank hosts it (the same fault on any number of ranks);
- "hang-setup" / "term-setup": MPI rank 2 stops itself in set-up (SIGSTOP) / the process sends itself
  SIGTERM in set-up (as SLURM's time limit may), as its worker is made;
- "no-job-on-2": MPI rank 2 cannot read the job file (a node that does not see it);
- "results-on-0": rank 0 cannot write the run's attributes into its result file, at the end of set-up
  (after the ranks' collective check: a failure of its own).

The fault goes into the algorithm's `client_update` as each worker is made, whatever the algorithm.
"""
import os
import signal
import sys

from helpers import nan_inputs  # this script's folder, tests/, is on its path

from hpcfl import launch
from hpcfl.errors import ResultsError
from hpcfl.metrics import Recorder
from hpcfl.runtime.worker import Worker

_init = Worker.__init__
FAULT, ROUND = os.environ["HPCFL_FAULT"], int(os.environ.get("HPCFL_FAULT_ROUND", "1")) - 1
ON_RANK_2 = os.environ.get("PMI_RANK") == "2"


def _faulty_update(update, phase, round, client, *args):
    if FAULT == "raise" and ON_RANK_2:
        raise RuntimeError(f"injected failure in client {client.id}")
    if round == ROUND and ON_RANK_2 and FAULT in ("hang", "die"):
        os.kill(os.getpid(), signal.SIGSTOP if FAULT == "hang" else signal.SIGKILL)
    if FAULT == "nan" and round == ROUND and client.id == int(os.environ["HPCFL_FAULT_CLIENT"]):
        with nan_inputs(client):
            return update(phase, round, client, *args)
    return update(phase, round, client, *args)


def _faulty_worker(self, *args, **kwargs):
    """A worker whose algorithm's every client update goes through _faulty_update."""
    if FAULT == "hang-setup" and ON_RANK_2:
        os.kill(os.getpid(), signal.SIGSTOP)
    if FAULT == "term-setup":
        os.kill(os.getpid(), signal.SIGTERM)
    _init(self, *args, **kwargs)
    update = self.algorithm.client_update
    self.algorithm.client_update = lambda *update_args: _faulty_update(update, *update_args)


def _unwritable(self, name, value):
    raise ResultsError(f"cannot write attribute {name!r}: disk quota exceeded")


Worker.__init__ = _faulty_worker
if FAULT == "results-on-0" and os.environ.get("PMI_RANK") == "0":
    Recorder.set_attr = _unwritable
if FAULT == "no-job-on-2" and ON_RANK_2:
    sys.argv[1] += ".not-on-this-node"
sys.exit(launch.main())
