"""hpcfl's log lines: stamped with time, rank and host; INFO to stdout and warnings to stderr; rank 0
at INFO and the others at WARNING unless told; a file per rank with --log-dir; durations as h:mm:ss."""
import logging
import re
import socket

import pytest

from hpcfl.logs import LEVELS, LOG, configure, duration

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture(autouse=True)
def _restored():
    """Each test configures the "hpcfl" logger; give it back as it was."""
    handlers, level, propagate = list(LOG.handlers), LOG.level, LOG.propagate
    yield
    for handler in list(LOG.handlers):
        LOG.removeHandler(handler)
        handler.close()
    for handler in handlers:
        LOG.addHandler(handler)
    LOG.setLevel(level)
    LOG.propagate = propagate


def _say(capsys):
    log = logging.getLogger("hpcfl.somewhere")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    return capsys.readouterr()


def test_rank_0_says_info_on_stdout_and_warnings_on_stderr_each_line_stamped(capsys):
    configure()                                               # rank 0 by default
    configure()                                              # again: its handlers are replaced, not added
    out, err = _say(capsys)
    host = re.escape(socket.gethostname())
    assert re.fullmatch(f"{STAMP} rank 0 {host} INFO i\n", out), out
    assert re.fullmatch(f"{STAMP} rank 0 {host} WARNING w\n{STAMP} rank 0 {host} ERROR e\n", err), err
    assert not LOG.propagate


def test_other_ranks_say_only_warnings_unless_a_level_is_given(capsys):
    configure(2)
    out, err = _say(capsys)
    assert out == "" and err.count(" rank 2 ") == 2
    configure(2, level="DEBUG")
    out, err = _say(capsys)
    assert [line.split()[-2:] for line in out.splitlines()] == [["DEBUG", "d"], ["INFO", "i"]]
    for level in LEVELS:                                      # what --log-level offers
        configure(2, level=level)
        said = "".join(_say(capsys))
        assert [line.split()[-1] for line in said.splitlines()] == ["d", "i", "w", "e"][LEVELS.index(level):]


def test_log_dir_holds_each_ranks_lines_named_by_run_and_slurm_job(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    configure(1, level="INFO", log_dir=tmp_path / "logs" / "study", run="fedavg-iid-seed0")
    _say(capsys)
    [file] = [h for h in LOG.handlers if isinstance(h, logging.FileHandler)]
    lines = (tmp_path / "logs" / "study" / "fedavg-iid-seed0-rank1.log").read_text().splitlines()
    assert [line.split()[-2:] for line in lines] == [["INFO", "i"], ["WARNING", "w"], ["ERROR", "e"]]
    assert all(" rank 1 " in line for line in lines)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    configure(0, log_dir=tmp_path / "logs", run="r")
    assert file.stream is None                                # the replaced file handler was closed
    _say(capsys)
    assert (tmp_path / "logs" / "r-4242-rank0.log").read_text().count("\n") == 3


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (59.4, "0:00:59"), (59.5, "0:01:00"),
                                           (3661, "1:01:01"), (90061, "25:01:01")])
def test_durations_read_hours_minutes_seconds(seconds, text):
    assert duration(seconds) == text
