"""Property-based tests of job validation: whatever a job file or a `--set` holds, the answer is a valid
JobConfig or a ConfigError naming the key (exit 2, one line, nothing written), and result files stay
under the results root. Derandomized, without an example database, so CI sees the same examples."""
import contextlib
import copy
import datetime
import inspect
import io
import json
import math
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import get_type_hints

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from hpcfl.algorithms import ALGORITHMS
from hpcfl.config import CHOICES, JobConfig, apply_overrides, parse_override, read_job_file
from hpcfl.data.datasets import DATASETS
from hpcfl.data.partition import PARTITIONS
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict, load_job, resolve
from hpcfl.launch import main
from hpcfl.models import MODELS
from hpcfl.runtime.checkpoint import checkpoint_root
from hpcfl.terms import TERMS

JOBS = Path(__file__).resolve().parent.parent / "jobs"
QUICKSTART = JOBS / "quickstart.toml"
BASES = [read_job_file(JOBS / name) for name in ("quickstart.toml", "fedfm/fmnist-cpu.toml",
                                                 "fedclassavg/fmnist-cpu.toml", "fedma/fmnist-cpu.toml")]
SCHEMA = {f.name: {g.name: g.type for g in fields(f.type)} for f in fields(JobConfig)}
KEY_PATHS = [(section, key) for section, keys in SCHEMA.items() for key in keys]
KEY_PATH = re.compile(r"\b(?:run|data|model|train|algorithm|eval)\.\w")   # a dotted key path in a message
INT64 = 2 ** 63

PROFILE = settings(deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# Strings and names that reach past the type checks into the registries and the algorithms' rules.
PLAUSIBLE = sorted({*ALGORITHMS, *TERMS, *MODELS, *DATASETS, *PARTITIONS, *(v for c in CHOICES.values() for v in c),
                    "", ".", "..", "../x", "/abs", "a/b", "x\\y", " x", "x\x00y", "all", "classifier", "shared"})
PARTITION_SETTINGS = sorted({name for scheme in PARTITIONS.values()
                             for name, arg in inspect.signature(scheme).parameters.items()
                             if arg.kind is arg.KEYWORD_ONLY})
SETTINGS = sorted({f.name for table in (*ALGORITHMS.values(), *TERMS.values()) for f in fields(table.Params)}
                  | set(PARTITION_SETTINGS))
# Every key path a job can have, with its declared type: the schema, the partition settings (numbers),
# the algorithms' and the terms' parameters.
KINDS = {**{path: SCHEMA[path[0]][path[1]] for path in KEY_PATHS},
         **{("data", "partition_params", name): float for name in PARTITION_SETTINGS},
         **{("algorithm", "params", name): kind for algorithm in ALGORITHMS.values()
            for name, kind in get_type_hints(algorithm.Params).items()},
         **{("algorithm", "terms", term, name): kind for term, cls in TERMS.items()
            for name, kind in get_type_hints(cls.Params).items()}}

names = st.sampled_from(SETTINGS) | st.text(max_size=8)
ints = st.integers(-2, 60) | st.integers() | st.sampled_from([INT64 - 1, -INT64, INT64, 10 ** 400])
numbers = st.floats(-1.0, 2.0) | st.floats() | st.integers(-2, 60)         # NaN and infinities included
strings = st.sampled_from(PLAUSIBLE) | st.text(max_size=12)
scalars = st.one_of(ints, numbers, st.booleans(), strings, st.dates(), st.times(),
                    st.datetimes(timezones=st.none() | st.just(datetime.UTC)))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
                      max_leaves=6)
# Values of the type a key declares: examples that get past the type checks to ranges, choices and the
# rules between keys.
TYPED = {int: ints, float: numbers, bool: st.booleans(), str: strings, int | str: ints | st.just("auto") | strings,
         list[float]: st.lists(numbers, max_size=3),
         list[str]: st.lists(st.sampled_from(sorted(MODELS)) | strings, max_size=3),
         dict: st.dictionaries(st.sampled_from(SETTINGS), ints | numbers, max_size=2)
         | st.lists(st.sampled_from(sorted(TERMS)), max_size=2)}


def toml(value) -> str:
    """A Python value as TOML source (the tests write job files and --set values with it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):       # JSON's escapes are TOML's; TOML also wants DEL escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml, value)) + "]"
    return "{" + ", ".join(f"{toml(k)} = {toml(v)}" for k, v in value.items()) + "}"


def has_nan(value) -> bool:
    """NaN is not equal to itself, so a value holding one cannot be compared after a round trip."""
    if isinstance(value, (list, dict)):
        return any(map(has_nan, value.values() if isinstance(value, dict) else value))
    return isinstance(value, float) and math.isnan(value)


def paths_in(raw: dict, prefix=()) -> list[tuple]:
    """Every key path of a TOML document, tables and values alike."""
    found = []
    for key, value in raw.items():
        found.append((*prefix, key))
        if isinstance(value, dict):
            found += paths_in(value, (*prefix, key))
    return found


def get(raw: dict, path: tuple):
    for key in path:
        raw = raw[key]
    return raw


def put(raw: dict, path: tuple, value) -> None:
    """Set the value at `path`, making tables on the way (a value in the way becomes a table)."""
    for key in path[:-1]:
        if not isinstance(raw.get(key), dict):
            raw[key] = {}
        raw = raw[key]
    raw[path[-1]] = value


def own_params(raw: dict) -> dict:
    """The declared types of the parameters of the job's algorithm (none if it has no valid one)."""
    table = raw.get("algorithm")
    name = table.get("name") if isinstance(table, dict) else None
    return get_type_hints(ALGORITHMS[name].Params) if isinstance(name, str) and name in ALGORITHMS else {}


def kind_of(raw: dict, path: tuple):
    """The type a job declares for a key path (an algorithm parameter's: the job's algorithm's), or None."""
    return own_params(raw).get(path[2]) if path[:2] == ("algorithm", "params") and path[2:] else KINDS.get(path)


@st.composite
def mutated_jobs(draw):
    """A shipped job with 1-2 keys set to arbitrary values, deleted or added: (TOML tables, touched paths).
    Three in four touch a key the job may have, half of those with a value of its type."""
    raw, touched = copy.deepcopy(draw(st.sampled_from(BASES))), []
    for _ in range(draw(st.integers(1, 2))):
        existing, own = paths_in(raw), own_params(raw)
        tables = [(), *(p for p in existing if isinstance(get(raw, p), dict))]
        known = [p for p in KINDS if p[:2] != ("algorithm", "params") or p[2:] == () or p[2] in own]
        path = draw(st.sampled_from(sorted(known)) if draw(st.integers(0, 3))
                    else st.sampled_from(existing + tables).flatmap(lambda p: names.map(lambda n: (*p, n))))
        if draw(st.integers(0, 4)) == 0 and path in existing:
            del get(raw, path[:-1])[path[-1]]
        else:
            kind = kind_of(raw, path)
            put(raw, path, draw(TYPED[kind] if kind and draw(st.booleans()) else values))
        touched.append(path)
    return raw, touched


def names_a_key(message: str, touched) -> bool:
    """Whether an error message names a key: by its dotted path (train.lr, algorithm.params.mu), or one
    that was changed by its name in its table ("unknown key(s) ['x'] in [run]", "[run] must be a table")."""
    return bool(KEY_PATH.search(message)) or any(
        f"[{'.'.join(path)}]" in message
        or any(repr(path[i]) in message and (i == 0 or f"[{'.'.join(path[:i])}]" in message)
               for i in range(len(path)))      # the first unknown part, in its table
        for path in touched if path)


def fits(value, kind) -> bool:
    """Whether `value` has the type a job-file key declares (int widens to float)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is float:
        return number
    if kind is int:
        return number and isinstance(value, int)
    if kind is dict:
        return isinstance(value, dict) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if kind == list[float]:
        return isinstance(value, list) and all(fits(v, float) for v in value)
    if kind == list[str]:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == int | str:
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    return isinstance(value, kind)


def assert_accepted_job_is_sound(job: JobConfig) -> None:
    """What the rest of hpcfl relies on: the configuration survives its JSON round trip (result files
    store it and resuming compares it), and the result file lies two levels under the results root."""
    assert job_from_dict(json.loads(job.to_json())) == job
    root = Path(job.run.results_root)
    assert job.result_path.parent.parent == root and job.result_path.resolve().is_relative_to(root.resolve())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("properties")


@settings(PROFILE, max_examples=500)
@given(mutated_jobs())
@example(({"train": {"lr": math.nan}}, [("train", "lr")]))
@example(({"run": {"seed": 10 ** 400}}, [("run", "seed")]))
@example(({"train": {"lr": 10 ** 400}}, [("train", "lr")]))
@example(({"data": {"partition": "dirichlet", "partition_params": {"beta": datetime.date(2020, 1, 1)}}},
          [("data", "partition_params", "beta")]))
def test_any_job_tables_give_a_job_or_a_config_error_naming_the_key(mutation):
    raw, touched = mutation
    try:
        job = job_from_dict(raw)
    except ConfigError as err:
        assert names_a_key(str(err), touched), err
    else:
        assert_accepted_job_is_sound(job)


@settings(PROFILE, max_examples=400)
@given(base=st.sampled_from(BASES), path=st.sampled_from(sorted(KINDS)), value=values)
@example(base=BASES[0], path=("train", "betas"), value=[False, 0.5])
@example(base=BASES[0], path=("data", "partition_params", "beta"), value=datetime.time(1, 2))
def test_a_value_of_the_wrong_type_is_refused_naming_its_key_path(base, path, value):
    kind = kind_of(base, path)
    assume(kind is not None and not fits(value, kind))
    raw = copy.deepcopy(base)
    put(raw, path, value)
    with pytest.raises(ConfigError, match=re.escape(".".join(path))):
        job_from_dict(raw)


corruptions = st.tuples(st.integers(0, 500), st.integers(0, 40), st.text(max_size=6))


@st.composite
def job_file_bytes(draw):
    """Random bytes and text, or the quickstart job with a few spans replaced by random text."""
    text = QUICKSTART.read_text()
    for start, length, insert in draw(st.lists(corruptions, min_size=1, max_size=3)):
        start %= len(text) + 1
        text = text[:start] + insert + text[start + length:]
    return draw(st.one_of(st.binary(max_size=80), st.text(max_size=80).map(str.encode), st.just(text.encode())))


@settings(PROFILE, max_examples=300)
@given(job_file_bytes())
@example(b"v = " + b"9" * 5000)                        # beyond Python's int-from-text limit
@example(b"v = " + b"[" * 5000 + b"]" * 5000)          # deeper than the parser's recursion
@example(b"\xff\xfe[run]")                             # not UTF-8
@example(b"[sweep]\nx = 1")
def test_any_job_file_gives_a_job_or_a_config_error(workdir, content):
    path = workdir / "job.toml"
    path.write_bytes(content)
    try:
        job = load_job(path)
    except ConfigError as err:
        try:
            tables = tomllib.loads(content.decode())
        except (ValueError, RecursionError):               # unparseable: the message names the file
            assert str(path) in str(err)
        else:
            if "sweep" in tables:
                assert str(path) in str(err)
            else:                                          # parseable: the same error as the tables give
                with pytest.raises(ConfigError) as same:
                    job_from_dict(tables)
                assert str(same.value) == str(err)
    else:
        assert_accepted_job_is_sound(job)


def test_a_job_file_that_cannot_be_read_is_a_config_error(workdir):
    with pytest.raises(ConfigError, match=re.escape(str(workdir))):
        load_job(workdir)                                   # a directory


override_keys = st.one_of(st.sampled_from([".".join(p) for p in KEY_PATHS]), st.text(max_size=12),
                          st.tuples(st.sampled_from(["data.partition_params", "algorithm.params", "run.name",
                                                     "algorithm.terms.prox"]), names).map(".".join))
override_values = st.one_of(values.map(toml), st.text(max_size=12), st.sampled_from(PLAUSIBLE))
overrides = st.lists(st.one_of(st.tuples(override_keys, override_values).map("=".join), st.text(max_size=12)),
                     min_size=1, max_size=3)


@settings(PROFILE, max_examples=300)
@given(base=st.sampled_from(BASES), texts=overrides)
@example(base=BASES[0], texts=["train.lr=0.1\nrun.rounds=1"])
@example(base=BASES[0], texts=[".="])                      # empty key parts
@example(base=BASES[0], texts=["0.0="])                    # an unknown table, named as the unknown key
@example(base=BASES[0], texts=["run.name=" + "x" * 5000])
@example(base=BASES[0], texts=["run.rounds=" + "9" * 5000])
def test_any_overrides_give_a_job_or_a_config_error_naming_the_key(base, texts):
    try:
        job = job_from_dict(apply_overrides(base, texts))
    except ConfigError as err:
        keys = [tuple(t.partition("=")[0].strip().split(".")) for t in texts]
        assert names_a_key(str(err), keys) or any(repr(t) in str(err) for t in texts), err
    else:
        assert_accepted_job_is_sound(job)


@settings(PROFILE, max_examples=200)
@given(path=st.lists(st.sampled_from(SETTINGS), min_size=1, max_size=3),
       value=values.filter(lambda v: not has_nan(v)))
def test_an_override_value_is_read_as_toml(path, value):
    assert parse_override(f"{'.'.join(path)}={toml(value)}") == (path, value)


@settings(PROFILE, max_examples=200)
@given(st.text(max_size=20))
@example("0.1\nrounds = 3")
@example("0.1 # a comment")
@example("nan")
def test_an_override_that_is_not_one_toml_value_is_a_string(raw):
    _, value = parse_override(f"train.lr={raw}")
    if value == raw:
        return
    parsed = tomllib.loads(f"v = {raw}")["v"]
    assert value == parsed or (has_nan(value) and repr(value) == repr(parsed))       # nan != nan


def run_main(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@settings(PROFILE, max_examples=150)
@given(mutation=mutated_jobs(), texts=st.just([]) | overrides)
@example(mutation=({"train": {"lr": 10 ** 400}}, [("train", "lr")]), texts=["run.name=a\nb"])
def test_the_launcher_exits_2_on_one_line_and_writes_nothing(workdir, mutation, texts):
    raw, _ = mutation
    job_file, root = workdir / "launch.toml", workdir / "results"
    job_file.write_text("".join(f"{toml(k)} = {toml(v)}\n" for k, v in raw.items()))
    sets = [f"--set={t}" for t in texts]           # one argument each, even when it starts with '-'
    try:
        job = load_job(job_file, [*texts, f'run.results_root="{root}"'])
    except ConfigError as err:
        code, out, message = run_main(job_file, *sets, "--results-root", root)
        assert (code, out, message) == (2, "", f"hpcfl: error: {err}\n") and message.count("\n") == 1
    else:
        code, out, message = run_main(job_file, *sets, "--results-root", root, "--check")
        resolved = json.loads(json.dumps(resolve(job).tables))
        assert (code, message) == (0, "") and json.loads(out) == {**json.loads(job.to_json()), "resolved": resolved}
    assert not root.exists()


def test_the_command_line_exits_2_on_one_line_naming_the_key(tmp_path):
    """One case of each kind that used to escape as another exception, run side by side: each process
    spends seconds importing torch."""
    broken = tmp_path / "broken.toml"
    broken.write_bytes(b"[run]\nrounds = " + b"9" * 5000)
    cases = [([QUICKSTART, "--set", 'run.study="a\\u0000b"'], "run.study"),
             ([QUICKSTART, "--set", "run.name=" + "x" * 300], "run.name"),
             ([broken], str(broken))]
    roots = [tmp_path / f"results{i}" for i in range(len(cases))]
    processes = [subprocess.Popen([sys.executable, "-m", "hpcfl.launch", *map(str, args), "--results-root", str(root)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for (args, _), root in zip(cases, roots, strict=True)]
    for (args, key), root, process in zip(cases, roots, processes, strict=True):
        out, err = process.communicate(timeout=240)
        assert (process.returncode, out) == (2, ""), (args, err)
        assert err.startswith("hpcfl: error: ") and err.count("\n") == 1 and key in err, (args, err)
        assert not root.exists()


plain_or_not = st.one_of(st.text(max_size=20), st.text(min_size=190, max_size=260), st.sampled_from(PLAUSIBLE))


@settings(PROFILE, max_examples=200)
@given(key=st.sampled_from(["study", "name"]), name=plain_or_not)
@example(key="name", name="é" * 101)                   # 202 bytes in UTF-8
@example(key="study", name="\ud800")                    # a lone surrogate cannot be encoded
@example(key="name", name="a\nb")
@example(key="study", name="")
def test_run_names_are_plain_names_or_refused(workdir, key, name):
    root = workdir / "names"
    try:
        job = job_from_dict({"run": {key: name, "results_root": str(root)}})
    except ConfigError as err:
        assert f"run.{key}" in str(err)
        return
    assert_accepted_job_is_sound(job)
    path = job.result_path               # the OS takes it and the names written beside it (checkpoints, lock)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for sibling in (path, checkpoint_root(path), path.with_name(path.name + ".lock.4194304")):
            sibling.touch()
        assert sorted(p.name for p in root.iterdir()) == [job.run.study]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("link", ["study", "result"])
def test_a_symbolic_link_out_of_the_results_root_is_refused_in_process(tmp_path, link):
    root, outside = tmp_path / "results", tmp_path / "outside"
    outside.mkdir()
    (root / "quickstart").mkdir(parents=True)
    if link == "study":
        (root / "quickstart").rmdir()
        (root / "quickstart").symlink_to(outside)
    else:
        (root / "quickstart" / "r.h5").symlink_to(outside / "r.h5")
    code, _, message = run_main(QUICKSTART, "--set", "run.name=r", "--results-root", root)
    assert code == 2 and "outside run.results_root" in message and message.count("\n") == 1
    assert not list(outside.iterdir())
