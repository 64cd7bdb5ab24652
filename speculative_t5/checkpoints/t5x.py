"""T5X checkpoints: the legacy format (msgpack `checkpoint` file + tensorstore zarr arrays)
and orbax checkpoints, read without t5x installed. T5X stores no model config, so the
config is inferred from the parameter shapes (or checked against one the caller gives).

Legacy layout (t5x/checkpoints.py, VERSION 3):
  checkpoint_<step>/checkpoint      msgpack {'version': 3, 'optimizer': {'target': params,
                                    'state': optimizer state}}; small arrays inline, large ones
                                    replaced by a tensorstore spec dict
                                    {'driver': 'zarr', 'kvstore': {'driver': 'file',
                                     'path': 'target.encoder.layers_0.attention.query.kernel'}, ...}
  checkpoint_<step>/target.encoder.layers_0.attention.query.kernel/   zarr array
The path in a spec is relative to the checkpoint directory; versions < 3 stored bfloat16
as uint16. `gs://` directories are read through tensorstore's gcs kvstore.
"""
from __future__ import annotations

import copy
import os
import re
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

import numpy as np
from flax import serialization, traverse_util

from speculative_t5.checkpoints.common import (CheckpointError, build_model, build_sharded,
                                               check_shapes, orbax_metadata, restore_orbax)
from speculative_t5.model.api import Model
from speculative_t5.model.config import T5Config

LEGACY_FILE = "checkpoint"
ORBAX_MARKERS = ("_METADATA", "_CHECKPOINT_METADATA", "manifest.ocdbt")


def _kvstore(directory: str) -> dict:
    m = re.fullmatch(r"gs://([^/]*)/(.*)", directory, re.DOTALL)
    if m:
        return {"driver": "gcs", "bucket": m.group(1), "path": m.group(2).rstrip("/") + "/"}
    return {"driver": "file", "path": os.path.abspath(directory) + "/"}


def _is_spec(path, value) -> bool:
    return isinstance(value, dict) and {"driver", "kvstore"} <= set(value)


class _Stored:
    """A tensorstore array opened for its metadata only and read when numpy asks for it
    (`build_model` does, after checking its declared shape against the config), or one
    shard at a time (`read`, for `build_sharded`), so hostile metadata (a shape of 10^12
    elements) is refused before anything is allocated."""

    def __init__(self, store, where: str, name: str, version: int):
        self.store, self.where, self.name, self.version = store, where, name, version
        self.shape = tuple(int(n) for n in store.shape)
        self.dtype = np.dtype(store.dtype.numpy_dtype)

    def read(self, index: Optional[tuple] = None) -> np.ndarray:
        """The whole array, or the slices `index` of it (only the chunks they touch)."""
        try:
            arr = (self.store if index is None else self.store[index]).read().result()
        except Exception as e:  # tensorstore raises ValueError/OSError subclasses by status
            raise CheckpointError(f"{self.where}: cannot read tensor {self.name} ({e})") from None
        if self.version < 3 and arr.dtype == np.uint16:
            import ml_dtypes
            arr = arr.view(ml_dtypes.bfloat16)
        return arr

    def __array__(self, dtype=None, copy=None):
        arr = self.read()
        return arr if dtype is None else arr.astype(dtype)


def _open_array(directory: str, spec: dict, name: str, version: int) -> _Stored:
    import tensorstore as ts
    spec = copy.deepcopy(spec)
    rel = spec["kvstore"].get("path") or spec.pop("path", None)
    if not rel:
        raise CheckpointError(f"{directory}/{LEGACY_FILE}: tensorstore spec for {name} has no path")
    spec.pop("path", None)
    kv = _kvstore(directory)
    kv["path"] = kv["path"] + rel
    spec["kvstore"] = kv
    spec["fill_missing_data_reads"] = False  # a missing chunk is corruption, not zeros
    try:
        store = ts.open(spec, read=True, open=True).result()
    except Exception as e:  # tensorstore raises ValueError/OSError subclasses by status
        raise CheckpointError(f"{directory}/{rel}: cannot read tensor {name} ({e})") from None
    return _Stored(store, f"{directory}/{rel}", name, version)


def _read_file(directory: str, key: str) -> bytes:
    if not directory.startswith("gs://"):
        with open(os.path.join(directory, key), "rb") as f:
            return f.read()
    import tensorstore as ts
    return ts.KvStore.open(_kvstore(directory)).result().read(key).result().value


def read_legacy(directory: str) -> Dict[str, Any]:
    """Flat {'encoder/layers_0/attention/query/kernel': array} of a legacy checkpoint: inline
    arrays as numpy, tensorstore ones opened but not yet read (`_Stored`)."""
    file = os.path.join(directory, LEGACY_FILE)
    try:
        contents = serialization.msgpack_restore(_read_file(directory, LEGACY_FILE))
    except Exception as e:  # msgpack raises ExtraData, ValueError, UnpackValueError, ...
        raise CheckpointError(f"{file}: not a readable T5X msgpack checkpoint "
                              f"({type(e).__name__}: {e})") from None
    try:
        target = contents["optimizer"]["target"]
    except (KeyError, TypeError):
        raise CheckpointError(f"{file}: no 'optimizer/target' parameter tree in the checkpoint") from None
    version = int(contents.get("version", 0))
    flat = traverse_util.flatten_dict(target, sep="/", is_leaf=_is_spec)
    return {k: (_open_array(directory, v, k, version) if _is_spec(k, v) else np.asarray(v))
            for k, v in flat.items()}


def orbax_params(directory: str) -> Tuple[str, Tuple[str, ...], Dict[str, Any]]:
    """(item directory, key of the parameters in the tree, {path: (shape, dtype)} of the
    parameters) of a T5X orbax checkpoint (train state {'target': params, 'state': ...},
    possibly under a `state/` item directory), from its metadata alone."""
    if os.path.isdir(os.path.join(directory, "state")):
        directory = os.path.join(directory, "state")
    declared = orbax_metadata(directory)
    for key in ("target", "params"):
        inner = {k[len(key) + 1:]: v for k, v in declared.items() if k.startswith(key + "/")}
        if inner:
            return directory, (key,), inner
    return directory, (), declared


def read_orbax(directory: str) -> Dict[str, Any]:
    """Flat parameters of a T5X orbax checkpoint (`orbax_params`), restored to the host."""
    import orbax.checkpoint as ocp
    directory, _, declared = orbax_params(directory)
    declared = {k: shape for k, (shape, _) in declared.items()}
    # the declared shapes first: an impossible architecture or a tensor of 10^12 elements
    # fails here, before orbax allocates anything
    config = _infer(declared, directory)
    check_shapes(config, declared, directory)
    try:
        tree = ocp.PyTreeCheckpointer().restore(os.path.abspath(directory))
    except Exception as e:  # orbax wraps tensorstore and json errors in many types
        raise CheckpointError(f"{directory}: cannot restore orbax checkpoint "
                              f"({type(e).__name__}: {e})") from None
    for key in ("target", "params"):
        if isinstance(tree, dict) and key in tree:
            tree = tree[key]
            break
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


def infer_config(flat: Dict[str, Any], source: str) -> T5Config:
    """Architecture from T5X parameter shapes (heads from rel_embedding [heads, buckets])."""
    def shape(key):
        if key not in flat:
            raise CheckpointError(f"{source}: missing tensor {key}; cannot infer the architecture")
        return flat[key].shape

    vocab, emb = shape("token_embedder/embedding")
    heads, buckets = shape("encoder/relpos_bias/rel_embedding")
    joined = shape("encoder/layers_0/attention/query/kernel")[1]
    if joined % heads:
        raise CheckpointError(f"{source}: query width {joined} is not a multiple of {heads} heads")
    gated = "encoder/layers_0/mlp/wi_0/kernel" in flat
    mlp = shape("encoder/layers_0/mlp/wi_0/kernel" if gated else "encoder/layers_0/mlp/wi/kernel")[1]

    def count(stack):
        return len({m.group(1) for k in flat for m in [re.match(rf"{stack}/layers_(\d+)/", k)] if m})

    return T5Config(vocab_size=int(vocab), emb_dim=int(emb), num_heads=int(heads),
                    head_dim=int(joined // heads), mlp_dim=int(mlp),
                    num_encoder_layers=count("encoder"), num_decoder_layers=count("decoder"),
                    mlp_activations=("gelu", "linear") if gated else ("relu",),
                    logits_via_embedding="decoder/logits_dense/kernel" not in flat,
                    relative_attention_num_buckets=int(buckets))


def _infer(shapes: Dict[str, Any], directory: str) -> T5Config:
    """`infer_config` from {name: shape} or {name: array}; T5Config's own checks as a
    CheckpointError (the shapes a checkpoint declares may be hostile)."""
    flat = {k: v if hasattr(v, "shape") else SimpleNamespace(shape=tuple(v)) for k, v in shapes.items()}
    try:
        return infer_config(flat, directory)
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{directory}: the tensor shapes declare an impossible T5: {e}") from None


def load_t5x(directory: str, config: Optional[T5Config] = None, dtype: Optional[str] = None,
             fmt: str = "t5x", partitioner=None, role: str = "target") -> Model:
    """A legacy or orbax T5X checkpoint; with a partitioner each tensor goes straight into
    its shards (legacy: tensorstore reads each shard's slice; orbax: restored sharded)."""
    if partitioner is not None and fmt != "t5x":
        item, prefix, declared = orbax_params(directory)
        shapes = {k: shape for k, (shape, _) in declared.items()}
        config = _resolve_config(_infer(shapes, item), config, dtype, directory)
        return restore_orbax(item, config, declared, partitioner, role, prefix)
    flat = read_legacy(directory) if fmt == "t5x" else read_orbax(directory)
    config = _resolve_config(_infer(flat, directory), config, dtype, directory)
    if partitioner is not None:
        return build_sharded(config, flat, directory, None, partitioner, role)
    return build_model(config, flat, directory)


def _resolve_config(inferred: T5Config, config: Optional[T5Config], dtype: Optional[str],
                    directory: str) -> T5Config:
    """The inferred architecture, or the given config when the shapes agree with it."""
    if config is None:
        config = inferred
    else:
        structural = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
                      "num_encoder_layers", "num_decoder_layers", "logits_via_embedding")
        bad = [f"{k}: {getattr(inferred, k)} in checkpoint vs {getattr(config, k)} given"
               for k in structural if getattr(inferred, k) != getattr(config, k)]
        if bad:
            raise CheckpointError(f"{directory}: checkpoint does not match the config given: "
                                  + ", ".join(bad))
    if dtype:
        config = config.replace(param_dtype=dtype)
    return config


def latest_step_dir(directory: str) -> Optional[str]:
    """For a T5X model dir holding checkpoint_<step>/ subdirs: the highest step's dir."""
    steps = [(int(m.group(1)), name) for name in os.listdir(directory)
             for m in [re.fullmatch(r"checkpoint_(\d+)", name)] if m
             and os.path.isdir(os.path.join(directory, name))]
    return os.path.join(directory, max(steps)[1]) if steps else None
