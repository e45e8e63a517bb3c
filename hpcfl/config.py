"""TOML job file -> frozen, validated dataclasses.

Everything that can be checked without data is checked here, before any rank trains: unknown
sections and keys, types, choices, and the algorithm's own parameters. Every error names the key
path and the valid choices. `--set a.b=value` overrides use TOML value syntax (`0.05`, `"adam"`,
`[1, 2]`); a bare word is taken as a string.
"""
import copy
import dataclasses
import json
import math
import tomllib
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from hpcfl.errors import ConfigError


@dataclass(frozen=True)
class RunConfig:
    """`[run]`: what the run is called, its seed and length, where its results go, and how it runs."""
    study: str = "default"          # results go to <results_root>/<study>/<name>.h5 (a plain name: no / or \,
                                    # no leading ., at most 200 bytes)
    name: str = ""                  # the run's name; "": <algorithm>-<partition>-seed<seed>
    arm: str = ""                   # the compared method this run belongs to (a sweep's [sweep.arms] sets it);
                                    # analyze compare --baseline run.arm=NAME pairs arms that differ in several keys
    seed: int = 0                   # the training seed: the initial model, the cohorts and each client's batches
                                    # derive from it, and the split too unless data.seed is set
    rounds: int = 10                # communication rounds
    results_root: str = "results"   # where result files go (--results-root overrides it)
    device: str = "auto"            # auto: a GPU if there is one, else the CPU with a warning; cpu; cuda: fails at
                                    # set-up without a GPU. A worker takes GPU (node-local rank % GPUs)
    threads: int = 1                # torch intra-op threads per rank, <= 1024 (1: fastest for small CNNs on a CPU)
    memory_format: str = "auto"     # how convolution weights lie in memory: channels_last; contiguous (NCHW);
                                    # auto: channels_last on the CPU (19-34 % less training time for the small CNNs,
                                    # bench/memory_format.py), contiguous on a GPU. Same numbers to float rounding
    checkpoint_every: int = 10      # rounds between checkpoints (0: only when signalled, SIGUSR1/SIGTERM/SIGINT)
    checkpoint_keep: int = 2        # the newest checkpoints kept next to the result file (removed once the run
                                    # completes)
    round_timeout_s: float = 1800.0 # a rank silent this long in a collective (hung, dead) ends the job, naming the
                                    # round and the rank; 0: wait forever. It must exceed the longest legitimate
                                    # wait, usually one round's local training
    placement: str = "auto"         # fixed: each client trains on one worker for the whole run (data balanced over
                                    # workers); per_round: each round's cohort is dealt to the workers afresh,
                                    # largest client first to the least-loaded worker (clients without state only;
                                    # every worker then holds every client's data); auto: per_round where the
                                    # clients keep no state between rounds, else fixed


@dataclass(frozen=True)
class DataConfig:
    """`[data]`: the data set, how it is split among the clients, and what each client holds out."""
    dataset: str = "fashion_mnist"  # fashion_mnist, digits, mnist, emnist_letters, cifar10, cifar100, cinic10,
                                    # tiny_imagenet, shakespeare, synthetic, or a plug-in "package.module:load"
    root: str = ""                  # the data root (--data-root overrides it); "": $HPCFL_DATA, else
                                    # /usr/share/datasets
    num_clients: int = 20           # clients in the federation
    partition: str = "iid"          # how the training set is split among the clients (see Partitions)
    partition_params: dict = field(default_factory=dict)   # the scheme's parameters, e.g. { beta = 0.5 }
    min_samples: int = 10           # every client gets at least this many samples (schemes with random sizes
                                    # redraw until it holds), counted before data.validation_fraction holds
                                    # out its share of them
    train_samples: int = 0          # > 0: the clients share out a random subset of this many training samples with
                                    # the training set's class mix, drawn with the split's seed (a CPU-sized study
                                    # scales the data, not the regime); 0: all
    validation_fraction: float = 0.0   # hold out this share of each client's data (FedFM: 0.2); records
                                    # client/val_acc and round/val_acc, on which the analysis selects rounds
                                    # (never on test accuracy)
    local_test_ratio: float = 0.0   # a per-client test set drawn from the test set with the client's label mix,
                                    # ratio x the client's training size (FedClassAvg: 0.3); records
                                    # client/local_test_acc and round/personal_acc_mean / _std
    seed: int = -1                  # the split's seed: the partition, each client's validation and local test
                                    # samples, FedKA's shared set; -1: run.seed. A fixed data.seed keeps one split
                                    # across training seeds


@dataclass(frozen=True)
class ModelConfig:
    """`[model]`: the network every client trains, or one per client with `architectures`."""
    name: str = "fmnist_cnn"        # a model (see Models), or a plug-in "package.module:Model"
    architectures: list[str] = field(default_factory=list)   # heterogeneous clients: client k gets
                                    # architectures[k % len]; their feature widths must agree; only the personalised
                                    # algorithms take it (fedclassavg, fedproto, local_only, ensemble); empty: every
                                    # client gets `name`
    batchnorm: str = "average"      # average: BatchNorm weights and running statistics are averaged like every
                                    # tensor; local: each client keeps its own BatchNorm layers (FedBN) while the
                                    # server's average serves the global model
    params: dict = field(default_factory=dict)   # the model's options: a key applies to every architecture (and must
                                    # be an option of each); a table under an architecture's name to that one only,
                                    # e.g. { preactivation = true, resnet18 = { feature_layer = 512 } }


@dataclass(frozen=True)
class TrainConfig:
    """`[train]`: the cohort and each client's local training."""
    clients_per_round: int = 10     # cohort size, sampled uniformly without replacement
    local_epochs: int = 1           # local passes over the client's data per round
    batch_size: int = 32            # local minibatch size
    optimizer: str = "sgd"          # sgd | adam (a fresh optimizer per client and round)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])   # Adam's (FedClassAvg's code: [0.5, 0.999])
    lr: float = 0.05                # the local learning rate
    momentum: float = 0.0           # SGD's heavy-ball momentum
    weight_decay: float = 0.0       # L2 weight decay, in the optimizer
    augment: str = "none"           # none | crop_flip: random crop after 4 pixels of black padding + horizontal
                                    # flip (torchvision's RandomCrop(padding=4)) | crop_flip_reflect: the padding
                                    # mirrors the border (FedMA's authors' loader); batched on the device, seeded
                                    # per (round, client)
    on_nonfinite: str = "stop"      # a client whose loss or update is NaN/Inf is left out of the aggregate and
                                    # recorded (client/nonfinite); stop: end the run after that round (exit 1);
                                    # drop: go on, the client keeping its state of before the phase (the
                                    # round, for an algorithm of one training phase); fedma: stop only
    batched_clients: int | str = "auto"     # train up to this many of a worker's sampled clients as one batched
                                    # computation, each step equal to one after another to float rounding
                                    # (runs drift apart as any two fp32 paths do, BatchNorm models soonest: compare
                                    # runs of one mode; docs: Determinism): every algorithm but fedma, no dropout;
                                    # 0: one after another; auto: on a GPU groups of up to 16 where the job
                                    # allows it, on a CPU (slower there) one after another
    cuda_graphs: bool = False       # clients trained together on a GPU: capture each kind of step (forward, loss
                                    # terms, backward, optimizer) as a CUDA graph, replayed as one launch; equal
                                    # to the eager steps to float rounding; off until measured (docs: GPU)
    precision: str = "fp32"         # fp32 | bf16: local training's forward pass and loss terms under bfloat16
                                    # autocast (matmuls and convolutions in bf16), weights, gradients, optimizer
                                    # and evaluation in fp32; changes the numbers (a result key)


@dataclass(frozen=True)
class AlgorithmConfig:
    """`[algorithm]`: the federated algorithm, its parameters, and local loss terms added to it."""
    name: str = "fedavg"            # an algorithm (see Algorithms), or a plug-in "package.module:Class"
    params: dict = field(default_factory=dict)  # the algorithm's own parameters (see Algorithms)
    terms: dict = field(default_factory=dict)   # local loss terms added to any algorithm: ["prox", "moon"], or tables
                                    # with parameters, { prox = { mu = 0.01 } } (see Loss terms); its name in 0.1,
                                    # algorithm.regularizers, is still read, with a warning, until the next release


# keys renamed in this release -> their new names; the old ones are accepted until the next release
RENAMED = {"algorithm.regularizers": "algorithm.terms"}


@dataclass(frozen=True)
class EvalConfig:
    """`[eval]`: when the server's model is tested, and what else is measured."""
    every: int = 1                  # evaluate the global model after rounds k, 2k, ... (and after the last)
    batch_size: int = 1000          # evaluation batch size
    forgetting: bool = False        # every round, the class-wise test accuracy of the round's starting global model
                                    # and of every trained local model, and FedKA's forgetting degree (eq. 1);
                                    # costs one test-set evaluation per sampled client
    feature_quality: bool = False   # after the last round, NMI and silhouette of the global model's test features
                                    # (FedFM Table IV; K-means: about a second, so off unless asked)


@dataclass(frozen=True)
class JobConfig:
    """A whole job file: one frozen dataclass per table, every key checked before any rank trains."""
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def evaluates(self, round: int) -> bool:
        """Whether the server's model is tested after `round` (0-based): after rounds k, 2k, ... of
        eval.every = k, and after the last."""
        return (round + 1) % self.eval.every == 0 or round == self.run.rounds - 1

    @property
    def data_seed(self) -> int:
        """The seed of the split: data.seed, or run.seed when data.seed = -1."""
        return self.run.seed if self.data.seed == -1 else self.data.seed

    @property
    def architectures(self) -> tuple[str, ...]:
        """The distinct model architectures, in the order clients are dealt them."""
        return tuple(dict.fromkeys(self.model.architectures or [self.model.name]))

    @property
    def run_name(self) -> str:
        return self.run.name or f"{self.algorithm.name}-{self.data.partition}-seed{self.run.seed}"

    @property
    def result_path(self) -> Path:
        return Path(self.run.results_root) / self.run.study / f"{self.run_name}.h5"


CHOICES = {
    "run.device": ("auto", "cpu", "cuda"),
    "run.placement": ("auto", "fixed", "per_round"),
    "run.memory_format": ("auto", "channels_last", "contiguous"),
    "train.optimizer": ("sgd", "adam"),
    "train.augment": ("none", "crop_flip", "crop_flip_reflect"),
    "train.precision": ("fp32", "bf16"),
    "model.batchnorm": ("average", "local"),
    "train.on_nonfinite": ("stop", "drop"),
}
# data.min_samples >= 1: a client without samples trains on an empty batch, whose loss is NaN
POSITIVE = {"run.rounds", "data.num_clients", "train.clients_per_round", "train.local_epochs",
            "train.batch_size", "train.lr", "eval.every", "eval.batch_size", "run.threads", "run.checkpoint_keep",
            "data.min_samples"}
NON_NEGATIVE = {"run.seed", "data.train_samples", "train.momentum", "train.weight_decay",
                "data.local_test_ratio", "run.checkpoint_every", "run.round_timeout_s"}
# Keys that change how a run computes, not what: its numbers at most to float rounding (the device, the
# threads, the convolutions' layout, clients trained together), or where its files lie (the results, the
# data). A run may resume with other values, and the analysis never groups or pairs runs by them. One
# exception: an augmenting job's crops are drawn on the client's device, so a GPU and a CPU see other
# crops (docs: Determinism).
NON_RESULT_KEYS = ("run.results_root", "data.root", "run.checkpoint_every", "run.checkpoint_keep",
                   "run.round_timeout_s", "run.threads", "run.device", "run.placement", "run.memory_format",
                   "train.batched_clients", "train.cuda_graphs")
MAX_THREADS = 1024   # torch's intra-op threads per rank: more cores than any node has
NAME_BYTES = 200    # file names may have 255 bytes, and the files beside a result add suffixes (.h5.lock.<pid>)


def flatten(table: dict, prefix: str = "") -> dict:
    """{"data": {"partition_params": {"beta": 0.5}}} -> {"data.partition_params.beta": 0.5}; an empty
    table stays a value."""
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _key_path(key: str) -> list[str] | None:
    """A dotted TOML key's parts, quoted parts whole ('algorithm.terms."pkg.mod:Term".weight' has 3 dots
    and 4 parts); None unless `key` is one TOML key."""
    try:
        node = tomllib.loads(f"{key} = 0")
    except (ValueError, RecursionError):
        return None
    path = []
    while isinstance(node, dict) and len(node) == 1:
        path.append(next(iter(node)))
        node = node[path[-1]]
    return path if node == 0 and all(part.strip() for part in path) else None


def toml_string(text: str) -> str:
    """`text` as a TOML basic string that reads back as `text`: JSON's escapes are TOML's, but its ASCII
    \\uXXXX pairs for a character past U+FFFF are not (TOML wants \\UXXXXXXXX), so such characters stay as
    they are; DEL, which TOML does not allow raw, is escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.lr=0.05' -> (['train', 'lr'], 0.05). A VALUE that is not one TOML value is that string."""
    key, sep, raw = text.partition("=")
    path = _key_path(key) if sep else None
    if path is None:
        raise ConfigError(f"override {text!r} is not KEY=VALUE with a dotted KEY (e.g. --set train.lr=0.05, "
                          '--set algorithm.terms."pkg.mod:Term".weight=0.1)')
    try:
        parsed = tomllib.loads(f"v = {raw}")   # "0.1\nx = 2" parses, but as two values: a string
    except (ValueError, RecursionError):      # TOMLDecodeError, or an integer or nesting past Python's limits
        parsed = {}
    return path, parsed["v"] if parsed.keys() == {"v"} else raw


def current_names(raw: dict, warn: bool = True) -> dict:
    """The job's tables with each renamed key (RENAMED) under its new name; a FutureWarning says so
    unless `warn` is off (a result file written before the rename)."""
    for old, new in RENAMED.items():
        section, old_key = old.split(".")
        new_key = new.split(".")[1]
        table = raw.get(section)
        if not isinstance(table, dict) or old_key not in table:
            continue
        if new_key in table:
            raise ConfigError(f"[{section}] has both {old_key!r} and {new_key!r}: {old} is the old name of {new}; "
                              f"keep {new} alone")
        if warn:
            warnings.warn(f"{old} is now called {new}; the old name is accepted until the next release",
                          FutureWarning, stacklevel=3)
        raw = {**raw, section: {new_key if key == old_key else key: value for key, value in table.items()}}
    return raw


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    raw = copy.deepcopy(raw)
    for text in overrides:
        path, value = parse_override(text)
        renamed = RENAMED.get(".".join(path[:2]))
        if renamed:
            warnings.warn(f"{'.'.join(path[:2])} is now called {renamed}; the old name is accepted until the next "
                          "release", FutureWarning, stacklevel=2)
            path = [*renamed.split("."), *path[2:]]
        node = raw
        for depth, part in enumerate(path[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(path[:depth + 1])} is a value, not a table")
        node[path[-1]] = value
    return raw


def coerce(path: str, value: Any, kind: type) -> Any:
    if not isinstance(kind, type):                # e.g. list[int]: checked by the dataclass itself
        return value
    integer = isinstance(value, int) and not isinstance(value, bool)
    if kind in (int, float) and integer and not -2 ** 63 <= value < 2 ** 63:
        raise ConfigError(f"{path} = {value} is out of range: integers have 64 bits, as in TOML")
    if kind is float and integer:
        return float(value)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path} = {value!r} must be a finite number")
    if kind is dict:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return {v: {} for v in value}          # a list of names: each with its default parameters
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a table (e.g. [{path}]), got {value!r}")
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{path} must be of type {kind.__name__}, got {value!r} ({type(value).__name__})")
    return value


def _build(cls, raw: Any, path: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"[{path}] must be a table, got {raw!r}")
    hints, names = get_type_hints(cls), [f.name for f in fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        where = f"[{path}]" if path else "the job file"
        raise ConfigError(f"unknown key(s) {unknown} in {where}; valid: {names}")
    values = {}
    for name in names:
        if name not in raw:
            continue
        key = f"{path}.{name}" if path else name
        kind = hints[name]
        values[name] = _build(kind, raw[name], key) if dataclasses.is_dataclass(kind) else coerce(key, raw[name], kind)
    return cls(**values)


def _check_values(job: JobConfig) -> None:
    flat = {f"{s}.{k}": v for s, section in job.to_dict().items() for k, v in section.items()}
    for key, valid in CHOICES.items():
        if flat[key] not in valid:
            raise ConfigError(f"{key} = {flat[key]!r} is not valid; choose one of {list(valid)}")
    for key in POSITIVE:
        if flat[key] <= 0:
            raise ConfigError(f"{key} = {flat[key]!r} must be > 0")
    for key in NON_NEGATIVE:
        if flat[key] < 0:
            raise ConfigError(f"{key} = {flat[key]!r} must be >= 0")
    group = job.train.batched_clients
    if group != "auto" and (not isinstance(group, int) or isinstance(group, bool) or not 0 <= group < 2 ** 63):
        raise ConfigError(f"train.batched_clients = {group!r} must be 'auto' or a number of clients >= 0 (0: one "
                          "after another)")
    if job.train.cuda_graphs and group == 0:
        raise ConfigError("train.cuda_graphs = true captures the steps of clients trained together, and "
                          "train.batched_clients = 0 trains them one at a time: set train.batched_clients "
                          "= 'auto' (or a number), or train.cuda_graphs = false")
    if job.run.threads > MAX_THREADS:
        raise ConfigError(f"run.threads = {job.run.threads} must be at most {MAX_THREADS}: it is torch's intra-op "
                          "threads per rank, best at most the cores each rank has (1 for small CNNs on a CPU)")
    if job.data.seed < -1:
        raise ConfigError(f"data.seed = {job.data.seed} must be >= 0, or -1 to split with run.seed")
    if not 0.0 <= job.data.validation_fraction < 1.0:
        raise ConfigError(f"data.validation_fraction = {job.data.validation_fraction!r} must be in [0, 1), e.g. 0.2")
    if job.train.clients_per_round > job.data.num_clients:
        raise ConfigError(f"train.clients_per_round = {job.train.clients_per_round} exceeds "
                          f"data.num_clients = {job.data.num_clients}; lower it or add clients")
    betas = job.train.betas
    if not isinstance(betas, list) or len(betas) != 2 or \
            not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"train.betas = {betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
    names = job.model.architectures
    if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
        raise ConfigError(f"model.architectures = {job.model.architectures!r} must be a list of model names, "
                          f"e.g. [\"resnet18\", \"shufflenetv2\"]")
    for key in ("run.study", "run.name"):                 # run.name "" stands for the derived name
        text = flat[key]
        if (not text and key == "run.study") or not text.isprintable() or "/" in text or "\\" in text \
                or text.startswith(".") or text != text.strip() or len(text.encode()) > NAME_BYTES:
            raise ConfigError(f"{key} = {text!r} must be a plain name: printable, at most {NAME_BYTES} bytes, "
                              "without '/' or '\\', spaces around it or a leading '.'")
    for key in ("run.results_root", "data.root"):
        if "\0" in flat[key]:
            raise ConfigError(f"{key} = {flat[key]!r} holds a NUL character, which no path can")


def read_job_file(path: str | Path) -> dict:
    """The job file's TOML tables, unvalidated."""
    path = Path(path)
    try:
        with path.open("rb") as file:                   # binary: TOML's own newlines, and UTF-8 whatever the locale
            return tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"job file {path} does not exist; pass the path of a TOML job file (see jobs/)") from None
    except OSError as err:
        raise ConfigError(f"job file {path} cannot be read: {err.strerror}") from None
    except (ValueError, RecursionError) as err:     # also not UTF-8, or an integer or nesting past Python's limits
        raise ConfigError(f"job file {path} is not valid TOML: {err}") from None


def read_job(job: "str | Path | dict | JobConfig", overrides: list[str] = (), allow_sweep: bool = False) -> JobConfig:
    """A job file's path, its tables (as TOML gives them) or a JobConfig, with --set's KEY=VALUE
    `overrides`, parsed and checked key by key (`parse_job`). A job file's [sweep] table is for
    hpcfl.sweep, which runs one of its points (`allow_sweep`)."""
    if isinstance(job, JobConfig):
        raw = job.to_dict()
    elif isinstance(job, dict):
        raw = job
    else:
        raw = read_job_file(job)
        if "sweep" in raw and not allow_sweep:
            raise ConfigError(f"job file {job} defines a [sweep]: run one of its points with `hpcfl sweep {job} "
                              f"--index I`; `hpcfl sweep {job} --list` checks every point and lists them")
        raw = {table: values for table, values in raw.items() if table != "sweep"}
    return parse_job(apply_overrides(raw, list(overrides)))


def parse_job(raw: dict) -> JobConfig:
    """The job's tables as a JobConfig, every key and value checked on its own (types, ranges,
    names); what the registries know (algorithms, models, data sets, loss terms) is checked by
    hpcfl.jobs, the one place that knows both."""
    job = _build(JobConfig, current_names(raw), "")
    _check_values(job)
    return job
