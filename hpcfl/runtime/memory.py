"""Each rank's peak resident memory in a round. On Linux the kernel's high-water mark is reset as the
round starts, so `rank/max_rss_bytes` shows what the round needs, not set-up's peak (importing torch
alone takes 0.5 GiB). Elsewhere it is the process's peak so far (getrusage)."""
import resource
from pathlib import Path

_CLEAR, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def reset_peak() -> None:
    try:
        _CLEAR.write_text("5")              # "5": reset the peak resident set size (Linux >= 4.0)
    except OSError:
        pass


def peak_bytes() -> int:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024        # Linux reports KiB
