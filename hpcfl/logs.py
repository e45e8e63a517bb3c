"""hpcfl's log: the standard library's `logging`, under the logger "hpcfl", every line stamped with
the time, the rank and the host:

    2026-11-24 17:05:01 rank 0 node017 INFO round    3/60  test_acc 0.7701 ...  8.76 s  elapsed 0:00:27  eta 0:08:31

Rank 0 logs at INFO (set-up, one line per round, checkpoints, the end), the other ranks at WARNING
(their warnings and failures); `--log-level` sets every rank's. INFO and below go to stdout, warnings
and errors to stderr, so a SLURM output file holds both in order. `--log-dir DIR` also writes each
rank's lines to DIR/<run>-rank<r>.log (<run>-<SLURM job>-rank<r>.log in a SLURM job). Nothing is
redrawn with '\\r': output files stay readable.
"""
import logging
import os
import socket
import sys
from pathlib import Path

LOG = logging.getLogger("hpcfl")
FORMAT = "%(asctime)s rank %(rank)s %(host)s %(levelname)s %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Console(logging.StreamHandler):
    """sys.stdout or sys.stderr as they are when a line is logged (pytest and notebooks replace them)."""

    def __init__(self, name: str):
        super().__init__()
        self.which = name

    @property
    def stream(self):
        return getattr(sys, self.which)

    @stream.setter
    def stream(self, value):        # StreamHandler.__init__ sets one; the property stands instead
        pass


class _Where(logging.Filter):
    """Stamps each record with this process's rank and host."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank, self.host = rank, socket.gethostname()

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank, record.host = self.rank, self.host
        return True


def configure(rank: int = 0, level: str | None = None, log_dir: str | Path | None = None, run: str = "hpcfl") -> None:
    """Set up the "hpcfl" logger for this rank (again: its handlers are replaced)."""
    for handler in list(LOG.handlers):
        LOG.removeHandler(handler)
        handler.close()
    LOG.setLevel(level or ("INFO" if rank == 0 else "WARNING"))
    LOG.propagate = False
    formatter, where = logging.Formatter(FORMAT, "%Y-%m-%d %H:%M:%S"), _Where(rank)
    quiet = _Console("stdout")
    quiet.addFilter(lambda record: record.levelno < logging.WARNING)
    loud = _Console("stderr")
    loud.setLevel(logging.WARNING)
    handlers = [quiet, loud]
    if log_dir:
        job = os.environ.get("SLURM_JOB_ID")
        path = Path(log_dir) / f"{run}{f'-{job}' if job else ''}-rank{rank}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(where)
        LOG.addHandler(handler)


def duration(seconds: float) -> str:
    """0:08:31: hours, minutes, seconds."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
