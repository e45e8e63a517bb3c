"""Per-run HDF5 results: rank 0 writes them with Recorder, anyone reads them with read_run."""
from hpcfl.metrics.reader import RunData, read_run
from hpcfl.metrics.recorder import SCHEMA_VERSION, Recorder, compact

__all__ = ["Recorder", "RunData", "compact", "read_run", "SCHEMA_VERSION"]
