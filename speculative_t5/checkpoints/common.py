"""What every checkpoint reader shares: the error type and the check that a set of named
arrays is exactly the parameter tree a config expects (no missing, extra or misshapen
tensor, nothing non-finite), so no reader can return a partial model."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np
from flax import traverse_util

from speculative_t5.model.api import Model, host_memory, param_shapes
from speculative_t5.model.config import T5Config


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a T5 model; the message names file and tensor."""


def expected_shapes(config: T5Config) -> Dict[str, tuple]:
    """'encoder/layers_0/attention/query/kernel' -> shape, for every parameter."""
    flat = traverse_util.flatten_dict(param_shapes(config), sep="/")
    return {k: tuple(v.shape) for k, v in flat.items()}


def check_shapes(config: T5Config, declared: Mapping[str, tuple], source: str,
                 names: Optional[Mapping[str, str]] = None) -> None:
    """The tensor names and shapes a checkpoint declares must be exactly those `config`
    expects, and the whole must fit this machine's memory: checked before reading any data,
    so hostile metadata (10^12 elements) fails at once."""
    names = names or {}
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(declared))
    if missing:
        shown = ", ".join(names.get(k, k) for k in missing[:5])
        raise CheckpointError(f"{source}: missing tensor(s) {shown}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    extra = sorted(set(declared) - set(expected))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor(s) {', '.join(extra[:5])} for a "
                              f"{config.num_encoder_layers}/{config.num_decoder_layers}-layer "
                              f"{'gated' if config.is_gated else 'ReLU'} T5 config")
    for key, shape in expected.items():
        if tuple(declared[key]) != shape:
            raise CheckpointError(f"{source}: tensor {names.get(key, key)} has shape "
                                  f"{tuple(declared[key])}, expected {shape} for {key}")
    need = sum(int(np.prod(shape)) for shape in expected.values()) * np.dtype(
        config.jnp_param_dtype).itemsize
    have = host_memory()
    if have and need > have:
        raise CheckpointError(f"{source}: the model its config declares needs {need:,} bytes "
                              f"of parameters, more than this machine's {have:,} bytes of memory")


def build_model(config: T5Config, flat: Mapping[str, Any], source: str,
                names: Optional[Mapping[str, str]] = None) -> Model:
    """Check flat {'a/b/kernel': array} against `config` and build a Model.

    `names` maps our path to the name the tensor has in the file, for error messages."""
    names = names or {}
    check_shapes(config, {k: tuple(v.shape) for k, v in flat.items()}, source, names)
    dtype = np.dtype(config.jnp_param_dtype)
    out = {}
    for key in expected_shapes(config):
        arr = np.asarray(flat[key])
        if not np.issubdtype(arr.dtype, np.floating) and arr.dtype.name != "bfloat16":
            raise CheckpointError(f"{source}: tensor {names.get(key, key)} has dtype {arr.dtype}, "
                                  "expected floating point")
        arr = arr.astype(dtype)
        if not np.isfinite(arr.astype(np.float32)).all():
            raise CheckpointError(f"{source}: tensor {names.get(key, key)} has NaN or Inf values")
        out[key] = arr
    params = traverse_util.unflatten_dict(out, sep="/")
    return Model(config, jax.tree_util.tree_map(jax.numpy.asarray, params))


def orbax_shapes(directory: str) -> Dict[str, tuple]:
    """{'encoder/layers_0/...': shape} an orbax checkpoint declares, from its metadata alone
    (nothing restored)."""
    import orbax.checkpoint as ocp
    try:
        with ocp.PyTreeCheckpointer() as ckptr:
            meta = ckptr.metadata(directory)
        meta = getattr(meta, "item_metadata", meta)
        leaves = jax.tree_util.tree_leaves_with_path(meta)
    except Exception as e:  # orbax surfaces tensorstore/json failures as many types
        raise CheckpointError(f"{directory}: cannot read orbax metadata "
                              f"({type(e).__name__}: {e})") from None
    return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(getattr(leaf, "shape", ()))
            for path, leaf in leaves}


def flat_params(model: Model) -> Dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in
            traverse_util.flatten_dict(jax.device_get(model.params), sep="/").items()}
