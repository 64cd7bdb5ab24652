"""A training run's identity, kept beside its checkpoints as MODEL_DIR/run_config.json: the
settings that decide its result (model config, optimizer and schedule, batch size, steps,
seed, data options) with sha256s of its training data and teacher. A rerun resumes only
that run: another one is refused in one line naming what changed, and `restart` moves the
old run's files aside to start over. The model_dir is one writer's (`locks.hold`)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional

import jax
import numpy as np

from speculative_t5.locks import hold, move_aside

RUN_CONFIG = "run_config.json"
# everything a trainer writes in its model_dir, moved aside together on restart
WRITTEN = ("checkpoints", "model", "hf", "train_log.json", RUN_CONFIG, "config.json",
           "teacher_outputs.npz", "teacher_outputs.npz.tmp.npz", "teacher_samples")


def sha256_of(tree: Any) -> str:
    """sha256 of a dict of arrays or a parameter tree (paths, shapes, dtypes and bytes)."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}\0{a.shape}\0{a.dtype}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def settings(scope: Dict[str, Any], names: List[str], **hashes: str) -> Dict[str, Any]:
    """The named arguments (a model config as its dict) and the given sha256s, as JSON
    would give them back (tuples as lists), to compare with a stored run's."""
    picked = {k: scope[k].to_dict() if hasattr(scope[k], "to_dict") else scope[k] for k in names}
    return json.loads(json.dumps({**picked, **hashes}))


def has_checkpoints(model_dir: str) -> bool:
    ckpt = os.path.join(model_dir, "checkpoints")
    return os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def changed(old: Dict[str, Any], new: Dict[str, Any]) -> Optional[str]:
    """'learning_rate=0.001, now 0.01' (several: 'a=1 and b=2, now a=3 and b=4'), or None."""
    old, new = _flat(old), _flat(new)
    keys = [k for k in list(new) + [k for k in old if k not in new] if old.get(k) != new.get(k)]
    if not keys:
        return None
    if len(keys) == 1:
        return f"{keys[0]}={old.get(keys[0])!r}, now {new.get(keys[0])!r}"
    return (" and ".join(f"{k}={old.get(k)!r}" for k in keys) + ", now "
            + " and ".join(f"{k}={new.get(k)!r}" for k in keys))


def check_run(model_dir: str, command: str, run: Dict[str, Any],
              started_from: Optional[str] = None) -> None:
    """Refuse (ValueError, one line) a model_dir whose checkpoints another run wrote; write
    run_config.json where no checkpoint is kept yet (nothing to resume: a fresh start)."""
    path = os.path.join(model_dir, RUN_CONFIG)
    hint = "pass --restart to start over or use a new directory"
    if has_checkpoints(model_dir) and os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        if stored.get("command") != command:
            raise ValueError(f"{model_dir} holds a {stored.get('command')} run, not {command}; "
                             f"{hint}")
        diff = changed(stored.get("settings", {}), run)
        if diff:
            raise ValueError(f"{model_dir} was started with {diff}; {hint}")
        return
    record = {"command": command, "settings": run, "started_from": started_from}
    if has_checkpoints(model_dir):  # written before run_config.json existed: resumed as is
        record = dict(record, started_from=None, note="its checkpoints predate this file")
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


@contextlib.contextmanager
def open_run(model_dir: str, command: str, run: Dict[str, Any], restart: bool = False,
             started_from: Optional[str] = None, quiet: bool = False) -> Iterator[None]:
    """Hold model_dir for the block, having moved the old run aside (`restart`) or checked
    that it is this one (`check_run`)."""
    def prepare():
        if restart:
            move_aside(model_dir, WRITTEN, quiet)
        check_run(model_dir, command, run, started_from)
    with hold(model_dir, prepare=prepare):
        yield

