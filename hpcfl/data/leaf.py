"""LEAF's Shakespeare next-character task from its JSON files; each sample keeps its LEAF user."""
import json
from pathlib import Path

import numpy as np
import torch

from hpcfl.data.base import Dataset, not_found
from hpcfl.errors import DataError

# LEAF's Shakespeare vocabulary: index = position in this string (newline, space, punctuation, digits,
# letters, and "}"); 80 symbols, so the next-character task has 80 classes.
SHAKESPEARE_VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_SHAKESPEARE_SEQ_LEN = 80

_VOCAB_INDEX = np.full(128, -1, dtype=np.int16)   # ASCII code -> vocabulary index, -1 outside it
_VOCAB_INDEX[np.frombuffer(SHAKESPEARE_VOCAB.encode("ascii"), dtype=np.uint8)] = np.arange(len(SHAKESPEARE_VOCAB))


def _encode_chars(text: str, where: str) -> np.ndarray:
    """uint8 vocabulary indices of `text`; a character outside LEAF's vocabulary is a DataError, not a guess."""
    try:
        codes = _VOCAB_INDEX[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    except UnicodeEncodeError:
        codes = None
    if codes is None or (codes < 0).any():
        unknown = sorted(set(text) - set(SHAKESPEARE_VOCAB))
        raise DataError(f"{where} holds characters outside LEAF's 80-symbol vocabulary: {unknown!r}; "
                        "regenerate it with LEAF's preprocessing")
    return codes.astype(np.uint8)


def _read_leaf_split(folder: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """uint8 x (N x 80), uint8 y (N) and each sample's user, from every *.json under `folder` in name order."""
    xs, ys, users = [], [], []
    for path in sorted(folder.glob("*.json")):
        try:
            blob = json.loads(path.read_text())
            for user in blob["users"]:
                x, y = blob["user_data"][user]["x"], blob["user_data"][user]["y"]
                if len(x) != len(y) or any(len(s) != _SHAKESPEARE_SEQ_LEN for s in x) or any(len(c) != 1 for c in y):
                    raise DataError(f"{path}: user {user!r} must have as many 80-character x strings as "
                                    "1-character y strings; regenerate it with LEAF's preprocessing")
                xs.append(_encode_chars("".join(x), f"{path} (user {user!r})"))
                ys.append(_encode_chars("".join(y), f"{path} (user {user!r})"))
                users.extend([user] * len(y))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"cannot read LEAF file {path}: {type(exc).__name__}: {exc}; "
                            "it must hold 'users' and 'user_data': {user: {'x': [...], 'y': [...]}}") from exc
    x = np.concatenate(xs) if xs else np.empty(0, dtype=np.uint8)
    y = np.concatenate(ys) if ys else np.empty(0, dtype=np.uint8)
    return x.reshape(-1, _SHAKESPEARE_SEQ_LEN), y, users


def load_shakespeare(root: Path) -> Dataset:
    """LEAF's Shakespeare next-character task: x is N x 80 int64 character indices, y the next character.

    `groups` numbers the LEAF users (speaking roles) in sorted-name order over both splits."""
    folders = [root / "shakespeare", root / "shakespeare" / "data"]   # ours, and LEAF's own repository layout
    base = next((f for f in folders if any((f / "train").glob("*.json")) and any((f / "test").glob("*.json"))), None)
    if base is None:
        raise not_found("Shakespeare (LEAF)", [f / s for f in folders for s in ("train", "test")], "*.json",
                         "run LEAF's data/shakespeare/preprocess.sh (github.com/TalwalkarLab/leaf) on a machine with "
                         f"internet and copy its data/train and data/test folders into {root / 'shakespeare'}")
    train_x, train_y, train_users = _read_leaf_split(base / "train")
    test_x, test_y, test_users = _read_leaf_split(base / "test")
    names = sorted(set(train_users) | set(test_users))
    index = {u: i for i, u in enumerate(names)}
    def ints(a):
        return torch.from_numpy(a.astype(np.int64))

    return Dataset(name="shakespeare", train_x=ints(train_x), train_y=ints(train_y), test_x=ints(test_x),
                   test_y=ints(test_y),
                   num_classes=len(SHAKESPEARE_VOCAB),
                   groups=np.array([index[u] for u in train_users], dtype=np.int64))
