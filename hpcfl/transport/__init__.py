"""How payloads travel: `LocalTransport` (one process) and `MpiTransport` (buffer-based MPI)."""
from hpcfl.transport.base import Traffic, Transport
from hpcfl.transport.local import LocalTransport

__all__ = ["Transport", "Traffic", "LocalTransport"]
