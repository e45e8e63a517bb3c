"""The one error family of hpcfl: every message states the rule that was broken and the fix."""
import textwrap
from enum import IntEnum


class HpcflError(Exception):
    """Base of every error hpcfl raises on purpose."""


class ConfigError(HpcflError):
    """A job file or command-line override is wrong; raised before any rank trains."""


class DataError(HpcflError):
    """A data root, data file or partition setting cannot give the requested data."""


class PayloadError(HpcflError):
    """Tensors do not match the declared payload layout."""


class ResultsError(HpcflError):
    """A result file cannot be created, or a file read back is not a valid hpcfl result."""


class PeerTimeout(HpcflError):
    """A rank stayed silent in a collective for longer than run.round_timeout_s (hung or dead)."""


class TrainingFault(HpcflError):
    """A client's loss or model went NaN/Inf and the run cannot go on: raised where that client
    trains (FedMA cannot match a non-finite model's neurons), so the run aborts on every rank."""


class StoppedOnFault(TrainingFault):
    """train.on_nonfinite = 'stop' ended the run after recording the round of a non-finite update:
    raised on every rank alike, an orderly end."""


class Exit(IntEnum):
    """The exit status of every hpcfl command, defined here once (--help and the docs render it)."""
    DONE = 0          # done, or the run was already complete
    FAILED = 1        # a failure during training
    BAD_INPUT = 2     # bad input, reported before any rank trains
    RESUME = 3        # stopped at a checkpoint: run the same command again to resume


EXIT_MEANING = {
    Exit.DONE: "done (or the run was already complete)",
    Exit.FAILED: "a failure during training: an exception, a rank silent for run.round_timeout_s (every rank is "
                 "then stopped, so the job never hangs), or a NaN/Inf update with train.on_nonfinite = 'stop'",
    Exit.BAD_INPUT: "bad input (job file, override, data, result path, a result file another run is writing), "
                    "reported before any rank trains; for `hpcfl status`, a result file that cannot be read or is of "
                    "another configuration than its sweep point's",
    Exit.RESUME: "stopped at a checkpoint after SIGUSR1/SIGTERM or a first Ctrl-C (SIGINT; a second aborts at "
                 "once): run the same command again to resume (the SLURM scripts requeue after USR1)",
}


def exit_help(*codes: Exit) -> str:
    """The exit statuses a command uses (all: a run's) as its --help's epilog prints them."""
    lines = [textwrap.fill(text, 100, initial_indent=f"  {int(code)}  ", subsequent_indent="     ")
             for code, text in EXIT_MEANING.items() if code in (codes or Exit)]
    ranks = ["After an orderly end only rank 0 exits non-zero (mpiexec reports the bitwise OR of the ranks' "
             "codes)."] if not codes else []
    return "\n".join(["exit status:", *lines, *ranks])
