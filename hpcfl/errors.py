"""The one error family of hpcfl: every message states the rule that was broken and the fix."""


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
    """A client's loss or update went NaN/Inf and train.on_nonfinite = 'stop'."""
