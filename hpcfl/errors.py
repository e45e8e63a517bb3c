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


class RemoteError(HpcflError):
    """Another rank failed; carries its rank, host and traceback."""
