"""A result file's provenance (hpcfl.runtime.provenance.run_attributes), from a resolved job and every
rank's set-up report, without a run."""
from importlib import metadata

import pytest

from hpcfl import _version
from hpcfl.jobs import prepare
from hpcfl.runtime import provenance

REPORTS = [{"rank": 0, "host": "node1", "device": "cpu", "setup_max_rss_bytes": 7, "setup_s": 1.234567},
           {"rank": 1, "host": "node2", "device": "cuda:0 (H200)", "setup_max_rss_bytes": 9,
            "setup_s": 0.5}]


@pytest.fixture
def job(tiny_job):
    return prepare(tiny_job(algorithm="fedprox", extra='\n[algorithm.terms.moon]\nmu = 0.5\n'))


def test_every_ranks_host_device_and_set_up_cost_in_rank_order_and_the_runs_name(job):
    attrs = provenance.run_attributes(job, REPORTS)
    assert attrs["world_size"] == 2
    assert attrs["hostnames"] == ["node1", "node2"] and attrs["devices"] == ["cpu", "cuda:0 (H200)"]
    assert attrs["setup_max_rss_bytes"] == [7, 9] and attrs["setup_s"] == [1.2346, 0.5]
    assert attrs["run"] == job.config.run_name and attrs["study"] == job.config.run.study
    assert attrs["status"] == "running"
    assert attrs["resolved"] is job.tables and attrs["resolved"]["algorithm"]["terms"]["moon"]["mu"] == 0.5
    assert attrs["plugins"] == {}           # built-in names only


def test_versions_of_hpcfl_and_its_stack_with_not_installed_for_a_missing_one(job, monkeypatch):
    real = metadata.version

    def version(name):
        if name == "mpich":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    attrs = provenance.run_attributes(job, REPORTS)
    versions = attrs["versions"]
    assert set(versions) == {"torch", "torchvision", "numpy", "h5py", "mpi4py", "mpich", "hpcfl"}
    assert versions["mpich"] == "not installed" and versions["numpy"] == real("numpy")
    assert versions["hpcfl"] == _version.version() and attrs["git_commit"] == _version.git_commit()


def test_plug_ins_are_named_by_the_key_that_used_them(job, monkeypatch):
    seen = {}
    monkeypatch.setattr(provenance, "plugins", lambda names: seen.update(names) or {"x": 1})
    assert provenance.run_attributes(job, REPORTS)["plugins"] == {"x": 1}
    assert seen == {"data.dataset": ["digits"], "data.partition": ["dirichlet"], "model.name": ["fmnist_cnn"],
                    "algorithm.name": ["fedprox"], "algorithm.terms": ["moon"]}


def test_each_start_of_a_resumed_run_is_a_segment_and_another_commit_is_warned_of(job, hpcfl_log):
    """Resuming checks the configuration and the split, not the code: every start that wrote rounds keeps
    its commit and versions, a start whose rounds are run again drops out, and a file written before
    segments existed has its one start in its top-level attributes."""
    fresh = provenance.run_attributes(job, REPORTS)
    assert fresh["segments"] == [{"first_round": 0, "git_commit": fresh["git_commit"], "versions": fresh["versions"],
                                  "world_size": 2, "hostnames": ["node1", "node2"]}]
    same = provenance.run_attributes(job, REPORTS[:1], fresh, first_round=4)
    assert [s["first_round"] for s in same["segments"]] == [0, 4] and same["segments"][1]["world_size"] == 1
    assert same["world_size"] == 1 and same["hostnames"] == ["node1"] and not hpcfl_log.records
    old = {**fresh, "git_commit": "0123abc", "segments": [{**fresh["segments"][0], "git_commit": "0123abc"},
                                                          {**fresh["segments"][0], "first_round": 6}]}
    again = provenance.run_attributes(job, REPORTS, old, first_round=6)     # the start at round 6: run again
    assert [(s["first_round"], s["git_commit"]) for s in again["segments"]] == [(0, "0123abc"),
                                                                                (6, fresh["git_commit"])]
    warned = hpcfl_log.text
    assert "resuming at round 6 with hpcfl" in warned and "rounds before were run by commit 0123abc" in warned
    before_segments = {k: v for k, v in old.items() if k != "segments"}
    assert provenance.run_attributes(job, REPORTS, before_segments, 2)["segments"][0] == \
        {"first_round": 0, "git_commit": "0123abc", "versions": fresh["versions"], "world_size": 2,
         "hostnames": ["node1", "node2"]}
