"""A rank's peak resident memory (hpcfl.runtime.memory): in bytes, whole pages, reset at a round's
start on Linux so that the round's own peak shows, and the process's peak where the kernel's
high-water mark cannot be read."""
import resource
import sys

import numpy as np
import pytest

from hpcfl.runtime import memory

MB = 2 ** 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self: Linux")


@linux
def test_the_peak_is_in_bytes_of_whole_pages_and_a_reset_forgets_memory_since_freed():
    memory.reset_peak()
    before = memory.peak_bytes()
    block = np.ones(300 * MB // 8)                     # 300 MiB, every page touched
    held = memory.peak_bytes()
    del block
    memory.reset_peak()
    after = memory.peak_bytes()
    assert held - before >= 290 * MB and held % 4096 == 0 and before > 20 * MB
    assert after < held - 250 * MB                      # the freed block is no longer the peak


def test_without_proc_the_peak_is_the_processs_own_from_getrusage_in_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "_STATUS", tmp_path / "absent")
    monkeypatch.setattr(memory, "_CLEAR", tmp_path / "absent" / "clear_refs")
    memory.reset_peak()                                 # nothing to reset: no error
    peak = memory.peak_bytes()
    assert peak == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # Linux reports KiB
    assert peak > 20 * MB and peak % 4096 == 0
