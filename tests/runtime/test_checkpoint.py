"""Checkpoint files and the resume decisions on their own (end to end: tests/runtime/test_resume.py): what
each rank writes, the manifest that seals them, pruning, what a damaged or foreign checkpoint gets,
where a run resumes, and when every rank checkpoints and stops."""
import hashlib
import json
import re
import shutil
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hpcfl.errors import ResultsError
from hpcfl.runtime.checkpoint import FORMAT, MANIFEST, checkpoint_root, latest, load, load_clients, save
from hpcfl.transport import LocalTransport


class _Rank:
    """Rank `rank` of `size`, whose `share` returns what the ranks that called it so far gave (`board`):
    call the server last and it sees every rank's files."""

    def __init__(self, rank, size, board):
        self.rank, self.size, self.board = rank, size, board
        self.is_server = rank == 0

    def share(self, info):
        self.board.append(info)
        return list(self.board)


def _client(value):
    return {"algorithm": {"scaffold": {"c": torch.full((3,), float(value))}}, "terms": {}}


def _warnings():
    said = []
    return said, said.append


def test_a_one_rank_checkpoint_holds_every_part_sealed_by_its_manifest(tmp_path):
    server = {"model": {"w": torch.ones(2, requires_grad=True)}, "fedavgm": {"v": torch.zeros(2)}}
    rng = torch.get_rng_state()
    save(tmp_path, 5, LocalTransport({}), server, {"widths": [3, 4]}, {0: _client(0), 1: _client(1)}, keep=2)
    assert [d.name for d in tmp_path.iterdir()] == ["round-000005"]
    directory = tmp_path / "round-000005"
    assert sorted(p.name for p in directory.iterdir()) == ["MANIFEST.json", "clients-rank0.pt", "server.pt",
                                                           "shared.pt"]                        # no .tmp left
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest == {"rounds_done": 5, "world_size": 1, "format": 2,            # states by owner
                        "files": {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
                                  for name in ("server.pt", "shared.pt", "clients-rank0.pt")}}
    assert latest(tmp_path, None) == (5, directory)
    kept = load(directory, "server.pt")
    assert kept.keys() == server.keys() and not kept["model"]["w"].requires_grad
    torch.testing.assert_close(kept["model"]["w"], torch.ones(2))
    assert load(directory, "shared.pt") == {"widths": [3, 4]}
    states, rngs = load_clients(directory, manifest["files"], {1, 7}, rank=0)
    assert list(states) == [1] and states[1]["algorithm"]["scaffold"]["c"].tolist() == [1.0] * 3
    assert list(rngs) == [0] and torch.equal(rngs[0], rng)


def test_each_rank_writes_its_own_part_and_the_server_seals_them_all(tmp_path):
    """On 3 ranks the server writes the server's and the shared state, each worker its clients' file;
    the server's manifest lists all four; another topology reads every worker's file."""
    board = []
    for rank, clients in ((2, {1: _client(1), 3: _client(3)}), (1, {0: _client(0), 2: _client(2)}), (0, {})):
        save(tmp_path, 2, _Rank(rank, 3, board), {"model": {"w": torch.zeros(1)}} if rank == 0 else None,
             {"s": 1}, clients, keep=1)
        assert (tmp_path / "round-000002").exists() == (rank == 0)             # sealed by the server only
    directory = tmp_path / "round-000002"
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["world_size"] == 3
    assert sorted(manifest["files"]) == ["clients-rank1.pt", "clients-rank2.pt", "server.pt", "shared.pt"]
    assert latest(tmp_path, None) == (2, directory)
    files = manifest["files"]
    states, rngs = load_clients(directory, files, {0, 1, 2, 3})                # another topology: every file
    assert {c: s["algorithm"]["scaffold"]["c"][0].item() for c, s in states.items()} == {0: 0, 1: 1, 2: 2, 3: 3}
    assert sorted(rngs) == [1, 2]
    states, rngs = load_clients(directory, files, {1, 3}, rank=2)              # the same: its own file
    assert sorted(states) == [1, 3] and list(rngs) == [2]
    states, rngs = load_clients(directory, files, {0, 1, 2, 3}, rank=2)        # placement changed: the others too
    assert sorted(states) == [0, 1, 2, 3] and list(rngs) == [2, 1]
    torch.save({"clients": {0: _client(9)}, "rng": torch.get_rng_state()}, directory / "clients-rank0.pt")
    states, _ = load_clients(directory, files, {0})                            # left by an earlier attempt: unread
    assert states[0]["algorithm"]["scaffold"]["c"][0].item() == 0


def test_only_the_newest_keep_checkpoints_stay_and_a_rerun_round_replaces_its_own(tmp_path):
    stale = tmp_path / "round-000009.partial"             # left by a rank killed while writing
    stale.mkdir(parents=True)
    for rounds in (1, 2, 3):
        save(tmp_path, rounds, LocalTransport({}), {}, {"at": rounds}, {}, keep=2)
    assert sorted(d.name for d in tmp_path.iterdir()) == ["round-000002", "round-000003"]
    save(tmp_path, 3, LocalTransport({}), {}, {"at": "again"}, {}, keep=2)
    assert sorted(d.name for d in tmp_path.iterdir()) == ["round-000002", "round-000003"]
    assert load(tmp_path / "round-000003", "shared.pt") == {"at": "again"}


def test_a_checkpoint_further_on_than_the_one_saved_is_stale_and_never_crowds_it_out(tmp_path):
    """After a damaged round-3 checkpoint the run resumed from round 1; its round-2 checkpoint is the one
    to keep, not the damaged one that sorts after it."""
    for rounds in (1, 3):
        save(tmp_path, rounds, LocalTransport({}), {}, {"at": rounds}, {}, keep=2)
    (tmp_path / "round-000003" / "shared.pt").write_bytes(b"damaged")
    (tmp_path / "round-000009.bak").mkdir()                     # a user's copy: not a checkpoint, left alone
    save(tmp_path, 2, LocalTransport({}), {}, {"at": 2}, {}, keep=1)
    assert sorted(d.name for d in tmp_path.iterdir()) == ["round-000002", "round-000009.bak"]
    assert latest(tmp_path, None) == (2, tmp_path / "round-000002")
    assert json.loads((tmp_path / "round-000002" / MANIFEST).read_text())["rounds_done"] == 2


def test_an_old_checkpoint_that_cannot_be_removed_does_not_fail_the_new_one(tmp_path, monkeypatch):
    import os
    rmdir = os.rmdir

    def refused(path, *args, **kwargs):
        if "round-000001" in str(path):
            raise PermissionError(path)
        return rmdir(path, *args, **kwargs)

    save(tmp_path, 1, LocalTransport({}), {}, {}, {}, keep=1)
    monkeypatch.setattr(os, "rmdir", refused)
    save(tmp_path, 2, LocalTransport({}), {}, {}, {}, keep=1)
    assert latest(tmp_path, None) == (2, tmp_path / "round-000002")


def test_a_damaged_newest_checkpoint_is_passed_over_with_a_warning(tmp_path):
    for rounds in (1, 2, 3):
        save(tmp_path, rounds, LocalTransport({}), {}, {"at": rounds}, {0: _client(rounds)}, keep=3)
    (tmp_path / "round-000007.partial").mkdir()                               # unsealed: never used
    (tmp_path / "round-000008").write_text("")                               # not a folder
    data = bytearray((tmp_path / "round-000003" / "clients-rank0.pt").read_bytes())
    data[-1] ^= 1
    (tmp_path / "round-000003" / "clients-rank0.pt").write_bytes(bytes(data))
    (tmp_path / "round-000002" / MANIFEST).unlink()
    said, warn = _warnings()
    assert latest(tmp_path, warn) == (1, tmp_path / "round-000001")
    assert said == [f"checkpoint {tmp_path / 'round-000003'} is damaged (clients-rank0.pt does not match its "
                    "checksum); using the one before it",
                    f"checkpoint {tmp_path / 'round-000002'} is damaged (unreadable ([Errno 2] No such file or "
                    f"directory: '{tmp_path / 'round-000002' / MANIFEST}')); using the one before it"]
    (tmp_path / "round-000001" / "shared.pt").unlink()                        # a listed file missing
    said.clear()
    assert latest(tmp_path, warn) is None and len(said) == 3 and "unreadable" in said[-1]
    assert latest(tmp_path / "nothing", warn) is None


def test_a_manifest_that_is_not_a_manifest_makes_its_checkpoint_damaged(tmp_path):
    save(tmp_path, 1, LocalTransport({}), {}, {}, {}, keep=1)
    for text in ("{not json", '{"rounds_done": 1}', '{"files": 3}'):
        (tmp_path / "round-000001" / MANIFEST).write_text(text)
        said, warn = _warnings()
        assert latest(tmp_path, warn) is None and "unreadable" in said[0]


class _Payload:
    def __reduce__(self):
        return print, ("ran",)


def test_a_file_holding_more_than_tensors_is_refused_naming_it_and_the_fix(tmp_path, capsys):
    torch.save({"w": _Payload()}, tmp_path / "server.pt")
    with pytest.raises(ResultsError, match=r"(?s)server.pt holds more than tensors and is not loaded .*move the "
                                           r"checkpoint folder away") as err:
        load(tmp_path, "server.pt")
    assert err.value.__cause__ is None and "ran" not in capsys.readouterr().out


def test_the_checkpoints_sit_beside_the_result_file():
    assert checkpoint_root("results/study/run.h5").as_posix() == "results/study/run.ckpt"


# The resume decisions (hpcfl.runtime.resume) on their own.

def _config(tmp_path, lr=0.01, data=None, **run):
    from hpcfl.config import read_job
    return read_job({"run": {"results_root": str(tmp_path / "results"), "rounds": 4, **run}, "train": {"lr": lr},
                     "data": data or {}})


@pytest.fixture
def unlocked():
    from hpcfl.runtime.lock import release
    yield
    release()


def _result_file(config, recorded=None, rounds=2, **attrs):
    from hpcfl.metrics import Recorder
    recorder = Recorder.create(config.result_path, {"config": recorded or json.loads(config.to_json()), **attrs})
    for round in range(rounds):
        recorder.append_round(round, {"round/test_acc": 0.5})
    recorder.close()


def test_a_run_resumes_only_on_as_many_ranks_as_wrote_its_per_rank_figures(tmp_path, unlocked):
    """rank/... keep one column per rank: another count would fail the first resumed round's write."""
    from hpcfl.metrics import Recorder
    from hpcfl.runtime.resume import resume_point
    config = _config(tmp_path)
    recorder = Recorder.create(config.result_path, {"config": json.loads(config.to_json())})
    for round in range(2):
        recorder.append_round(round, {"round/test_acc": 0.5, "rank/compute_s": np.ones(3)})
    recorder.close()
    assert resume_point(SimpleNamespace(config=config), ranks=3) == (True, 0, None)
    for ranks in (1, 2):
        with pytest.raises(ResultsError, match=rf"was written by 3 rank\(s\) and this run has {ranks}: .* resume it "
                                               r"on 3 rank\(s\)"):
            resume_point(SimpleNamespace(config=config), ranks=ranks)


def test_the_resume_point_is_nothing_a_checkpoint_or_a_refusal(tmp_path, unlocked):
    from hpcfl.runtime.lock import lock_path
    from hpcfl.runtime.resume import RunCompleted, resume_point
    config = _config(tmp_path)
    job = SimpleNamespace(config=config)
    assert resume_point(job) == (False, 0, None) and lock_path(config.result_path).exists()    # claimed
    _result_file(config)
    assert resume_point(job) == (True, 0, None)                                # begun, no checkpoint yet
    root = checkpoint_root(config.result_path)
    for rounds in (1, 2):
        save(root, rounds, LocalTransport({}), {}, {}, {}, keep=2)
    assert resume_point(job) == (True, 2, root / "round-000002")
    save(root, 3, LocalTransport({}), {}, {}, {}, keep=3)               # after the file's last round
    with pytest.raises(ResultsError, match=r"holds 2 rounds but its checkpoint is after round 3; the result file is "
                                           "older than the checkpoint"):
        resume_point(job)
    shutil.rmtree(root / "round-000003")
    changed = _config(tmp_path, checkpoint_every=3, threads=2)                # keys that may change on resume
    assert resume_point(SimpleNamespace(config=changed)) == (True, 2, root / "round-000002")
    moved = _config(tmp_path, data={"root": str(tmp_path / "moved")})          # the data copied elsewhere
    assert resume_point(SimpleNamespace(config=moved)) == (True, 2, root / "round-000002")
    with pytest.raises(ResultsError, match="from a run with another configuration; choose another run.name"):
        resume_point(SimpleNamespace(config=_config(tmp_path, lr=0.1)))
    config.result_path.unlink()
    recorded = json.loads(config.to_json())
    recorded["algorithm"]["regularizers"] = recorded["algorithm"].pop("terms")   # as hpcfl 0.1 named them
    _result_file(config, recorded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                         # the file's old name: no warning
        assert resume_point(job) == (True, 2, root / "round-000002")
    config.result_path.unlink()
    _result_file(config, status="completed")
    with pytest.raises(RunCompleted, match="is already complete; nothing to do"):
        resume_point(job)
    config.result_path.write_bytes(b"not hdf5")
    with pytest.raises(ResultsError, match=r"cannot be read as HDF5 .*; to start the run again, move it and "
                                           r"\S+\.ckpt away$"):
        resume_point(job)
    config.result_path.unlink()            # moved away alone: its checkpoints would mix with a new run's
    with pytest.raises(ResultsError, match=r"checkpoint folder \S+\.ckpt is left from an earlier run whose result "
                                           r"file \S+\.h5 is gone; move the folder away or delete it"):
        resume_point(job)



def test_a_result_file_left_unreadable_or_behind_its_checkpoint_is_put_back_from_the_checkpoint(tmp_path, unlocked,
                                                                                                hpcfl_log):
    """A node crash can lose the result file's last writes (unreadable, or fewer rounds than the newest
    checkpoint): resuming puts back the copy the checkpoint took, keeping the file beside it; the copy
    is in the manifest, so a damaged copy makes the checkpoint damaged."""
    from hpcfl.analysis.results import find_files
    from hpcfl.metrics import Recorder, read_run
    from hpcfl.runtime.resume import resume_point
    config = _config(tmp_path)
    path, job, root = config.result_path, SimpleNamespace(config=config), checkpoint_root(config.result_path)
    _result_file(config, rounds=2)
    save(root, 2, LocalTransport({}), {}, {}, {}, keep=2, result_file=path)
    copy = path.read_bytes()
    assert (root / "round-000002" / "results.h5.copy").read_bytes() == copy
    assert find_files([tmp_path]) == [path]                     # the copy is no run of the analysis or status
    Recorder.reopen(path, 1).close()                                           # its second round lost
    assert resume_point(job) == (True, 2, root / "round-000002")
    assert path.read_bytes() == copy and read_run(path).rounds == 2
    assert read_run(path.with_name(path.name + ".damaged")).rounds == 1
    assert "holds 1 rounds but its checkpoint is after round 2: put back the result file of checkpoint " \
           "round-000002" in hpcfl_log.text
    path.write_bytes(copy[:len(copy) // 2])                                    # torn
    assert resume_point(job) == (True, 2, root / "round-000002") and path.read_bytes() == copy
    assert path.with_name(path.name + ".damaged-2").read_bytes() == copy[:len(copy) // 2]   # the first kept too
    (root / "round-000002" / "results.h5.copy").write_bytes(b"damaged")
    path.write_bytes(b"torn")
    with pytest.raises(ResultsError, match="cannot be read as HDF5"):
        resume_point(job)


def test_a_resume_names_the_first_three_keys_that_differ_and_refuses_another_split(tmp_path):
    from hpcfl.metrics import Recorder
    from hpcfl.runtime.resume import mismatch, same_split
    config = _config(tmp_path)
    recorded = json.loads(config.to_json())
    assert mismatch(recorded, config) == ""
    assert mismatch(recorded, _config(tmp_path, lr=0.1, rounds=5)) == \
        "run.rounds: 4 in the file, 5 here; train.lr: 0.01 in the file, 0.1 here"
    four = _config(tmp_path, lr=0.1, rounds=5, seed=3, data={"num_clients": 27})
    assert mismatch(recorded, four) == ("data.num_clients: 20 in the file, 27 here; run.rounds: 4 in the file, 5 here; "
                                        "run.seed: 0 in the file, 3 here; and 1 more")
    three = _config(tmp_path, lr=0.1, rounds=5, seed=3)
    assert mismatch(recorded, three).endswith("train.lr: 0.01 in the file, 0.1 here")
    counts = np.array([[2, 1], [0, 3]])
    Recorder.create(config.result_path, {}, {"partition": counts}).close()
    same_split(config.result_path, counts.copy())                                # the same split: resumed
    with pytest.raises(ResultsError, match="was written with another split of the data"):
        same_split(config.result_path, counts[::-1])
    Recorder.create(tmp_path / "old.h5", {}).close()
    same_split(tmp_path / "old.h5", counts)                                      # a file without it: not checked


def test_a_result_path_that_a_link_leads_out_of_the_results_root_is_refused(tmp_path, unlocked):
    from hpcfl.runtime.resume import resume_point
    config = _config(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "default").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ResultsError, match=r"resolves to .*elsewhere.*, outside run.results_root .*remove the link"):
        resume_point(SimpleNamespace(config=config))
    assert not list((tmp_path / "elsewhere").iterdir())                        # not even a lock


def test_every_rank_decides_alike_when_to_checkpoint_and_when_to_stop(tmp_path):
    """Of 4 rounds with run.checkpoint_every = 2: a checkpoint after round 2, none after the last; a
    signal stops after this round with a checkpoint (after the last there is nothing to stop); a
    training fault stops without one."""
    from hpcfl.runtime.resume import STOP, control
    job = SimpleNamespace(transport=LocalTransport({}), config=_config(tmp_path, checkpoint_every=2))
    assert [control(job, r) for r in range(4)] == [(False, False, False), (True, False, False),
                                                   (False, False, False), (False, False, False)]
    assert control(job, 0, fault=True) == (False, False, True)
    STOP.set()
    try:
        assert control(job, 0) == (True, True, False) and control(job, 3) == (False, False, False)
        assert control(job, 1, fault=True) == (False, True, True)
    finally:
        STOP.clear()
    job.config = _config(tmp_path, checkpoint_every=0)
    assert [control(job, r)[0] for r in range(4)] == [False] * 4
    job.config = _config(tmp_path, checkpoint_every=1)
    assert [control(job, r)[0] for r in range(4)] == [True, True, True, False]


def test_a_worker_rank_follows_the_servers_decision():
    from hpcfl.runtime.resume import STOP, control
    sent = {}

    def reduce_sum(name, array):
        sent[name] = array.tolist()
        return array

    STOP.set()
    try:
        worker = SimpleNamespace(rank=1, is_server=False, reduce_sum=reduce_sum,
                                 broadcast=lambda name, decision: None if decision is not None else [1, 0, 1])
        job = SimpleNamespace(transport=worker, config=SimpleNamespace(run=None))   # a worker reads none of it
        assert control(job, 0) == (True, False, True) and sent == {"control": [1.0]}
    finally:
        STOP.clear()


class _Keeps:
    def keep(self, kept):
        self.kept = kept


def _restorable(transport, hosted=(0, 1)):
    carried = []
    return SimpleNamespace(algorithm=SimpleNamespace(load_carried_state=carried.append), carried=carried,
                           server=SimpleNamespace(device="cpu", state=None) if transport.is_server else None,
                           worker=SimpleNamespace(clients={c: _Keeps() for c in hosted}), transport=transport,
                           start_round=0)


def test_restore_gives_every_part_back_and_the_same_topology_its_generator(tmp_path, hpcfl_log):
    torch.manual_seed(1)
    rng = torch.get_rng_state()
    save(tmp_path, 3, LocalTransport({}), {"model": {"w": torch.ones(2)}}, {"widths": [5]},
         {0: _client(4), 1: _client(5)}, keep=1)
    from hpcfl.runtime.resume import restore
    torch.manual_seed(2)
    job = _restorable(LocalTransport({}))
    restore(job, tmp_path / "round-000003", 3)
    assert hpcfl_log.messages == [f"resuming after round 3 from {tmp_path / 'round-000003'}"]
    assert job.start_round == 3 and job.carried == [{"widths": [5]}] and torch.equal(torch.get_rng_state(), rng)
    torch.testing.assert_close(job.server.state["model"]["w"], torch.ones(2))
    assert {c: k.kept["algorithm"]["scaffold"]["c"][0].item() for c, k in job.worker.clients.items()} == {0: 4, 1: 5}
    torch.manual_seed(2)
    other = _restorable(_Rank(1, 2, []), hosted=(1,))                     # 2 ranks now: the clients, not the rng
    restore(other, tmp_path / "round-000003", 3)
    assert other.worker.clients[1].kept["algorithm"]["scaffold"]["c"][0].item() == 5 and other.server is None
    assert not torch.equal(torch.get_rng_state(), rng)


def test_restore_refuses_a_checkpoint_without_its_clients_or_in_another_format(tmp_path):
    from hpcfl.runtime.resume import restore
    save(tmp_path, 1, LocalTransport({}), {}, {}, {0: _client(0)}, keep=1)
    directory = tmp_path / "round-000001"
    with pytest.raises(ResultsError, match=r"has no state for clients \[1, 7\]: it belongs to another run"):
        restore(_restorable(LocalTransport({}), hosted=(0, 1, 7)), directory, 1)
    manifest = json.loads((directory / MANIFEST).read_text())
    del manifest["format"]                                                    # as hpcfl 0.1 wrote it
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ResultsError, match=f"in format 1, as earlier hpcfl did .* reads format {FORMAT}: resume it "
                                           "with the hpcfl that wrote it"):
        restore(_restorable(LocalTransport({})), directory, 1)


def test_every_rank_writes_its_part_of_a_checkpoint_of_the_job(tmp_path, hpcfl_log):
    from hpcfl.runtime.resume import write_checkpoint
    client = SimpleNamespace(kept=lambda: _client(3))
    job = SimpleNamespace(config=_config(tmp_path, checkpoint_keep=2), transport=LocalTransport({}),
                          server=SimpleNamespace(state={"model": {"w": torch.ones(1)}}),
                          worker=SimpleNamespace(clients={4: client}),
                          algorithm=SimpleNamespace(carried_state=lambda: {"widths": [2]}), recorder=object())
    _result_file(job.config)
    write_checkpoint(job, 2)
    directory = checkpoint_root(job.config.result_path) / "round-000002"
    assert latest(directory.parent, None) == (2, directory)
    assert load(directory, "shared.pt") == {"widths": [2]} and load(directory, "server.pt")["model"]["w"].item() == 1
    files = json.loads((directory / MANIFEST).read_text())["files"]
    assert load_clients(directory, files, {4})[0][4]["algorithm"]["scaffold"]["c"].tolist() == [3.0] * 3
    assert (directory / "results.h5.copy").read_bytes() == job.config.result_path.read_bytes()
    assert "results.h5.copy" in files
    assert re.fullmatch(r"checkpoint after round 2 written in \d+\.\d\d s", hpcfl_log.messages[0])
    job.server, job.worker, job.recorder = None, None, None          # a rank with neither writes an empty client file
    save_board = []
    job.transport = _Rank(1, 2, save_board)
    write_checkpoint(job, 3)
    assert save_board == [{"clients-rank1.pt": hashlib.sha256((directory.parent / "round-000003.partial" /
                                                              "clients-rank1.pt").read_bytes()).hexdigest()}]
    assert load(directory.parent / "round-000003.partial", "clients-rank1.pt")["clients"] == {}
