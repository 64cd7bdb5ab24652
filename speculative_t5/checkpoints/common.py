"""What every checkpoint reader shares: the error type, the check that a set of named
arrays is exactly the parameter tree a config expects (no missing, extra or misshapen
tensor, nothing non-finite), so no reader can return a partial model, and the placement of
each tensor straight into its shards when a `Partitioner` is given (`build_sharded`,
`restore_orbax`), so no process ever holds the whole model on its host."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import numpy as np
from flax import traverse_util

from speculative_t5.model.api import Model, ModelConfig, host_memory, param_shapes
from speculative_t5.model.gpt2 import GPT2Config


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a model; the message names file and tensor."""


def architecture(config: ModelConfig) -> str:
    """'2/2-layer gated T5' or '2-layer GPT-2', for messages."""
    if isinstance(config, GPT2Config):
        return f"{config.n_layer}-layer GPT-2"
    return (f"{config.num_encoder_layers}/{config.num_decoder_layers}-layer "
            f"{'gated' if config.is_gated else 'ReLU'} T5")


def expected_shapes(config: ModelConfig) -> Dict[str, tuple]:
    """'encoder/layers_0/attention/query/kernel' (T5) or 'h_0/attn_c_attn/kernel' (GPT-2)
    -> shape, for every parameter of `config`."""
    flat = traverse_util.flatten_dict(param_shapes(config), sep="/")
    return {k: tuple(v.shape) for k, v in flat.items()}


def check_shapes(config: ModelConfig, declared: Mapping[str, tuple], source: str,
                 names: Optional[Mapping[str, str]] = None,
                 shardings: Optional[Mapping[str, Any]] = None) -> None:
    """The tensor names and shapes a checkpoint declares must be exactly those `config`
    expects, and what this process will hold must fit this machine's memory: checked before
    reading any data, so hostile metadata (10^12 elements) fails at once.
    shardings: {path: Sharding} when loading partitioned (see `host_bytes`)."""
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
                              f"{architecture(config)} config")
    for key, shape in expected.items():
        if tuple(declared[key]) != shape:
            raise CheckpointError(f"{source}: tensor {names.get(key, key)} has shape "
                                  f"{tuple(declared[key])}, expected {shape} for {key}")
    need = host_bytes(expected, np.dtype(config.jnp_param_dtype).itemsize, shardings)
    have = host_memory()
    if have and need > have:
        raise CheckpointError(f"{source}: the model its config declares needs {need:,} bytes "
                              f"of parameters, more than this machine's {have:,} bytes of memory")


def host_bytes(shapes: Mapping[str, tuple], itemsize: int,
               shardings: Optional[Mapping[str, Any]] = None) -> int:
    """Bytes of parameters a load keeps in this host's memory: the whole model unpartitioned;
    partitioned, the shards on this process's CPU devices (accelerators hold theirs in their
    own memory) plus the largest tensor, read one at a time."""
    if shardings is None:
        return sum(int(np.prod(shape)) for shape in shapes.values()) * itemsize
    total = max(int(np.prod(shape)) for shape in shapes.values())
    for key, shape in shapes.items():
        on_host = sum(d.platform == "cpu" for d in shardings[key].addressable_devices)
        total += int(np.prod(shardings[key].shard_shape(shape))) * on_host
    return total * itemsize


def check_dtype(dtype, source: str, name: str) -> None:
    """A tensor stored as integers or bools is no parameter: an error, never a cast."""
    if not np.issubdtype(dtype, np.floating) and np.dtype(dtype).name != "bfloat16":
        raise CheckpointError(f"{source}: tensor {name} has dtype {dtype}, expected floating point")


def checked(arr: np.ndarray, dtype, source: str, name: str) -> np.ndarray:
    """`arr` (a whole tensor or one shard) as `dtype`; floating point and finite or an error."""
    check_dtype(arr.dtype, source, name)
    arr = arr.astype(dtype)
    if not np.isfinite(arr.astype(np.float32)).all():
        raise CheckpointError(f"{source}: tensor {name} has NaN or Inf values")
    return arr


def build_model(config: ModelConfig, flat: Mapping[str, Any], source: str,
                names: Optional[Mapping[str, str]] = None) -> Model:
    """Check flat {'a/b/kernel': array} against `config` and build a Model.

    `names` maps our path to the name the tensor has in the file, for error messages."""
    names = names or {}
    check_shapes(config, {k: tuple(v.shape) for k, v in flat.items()}, source, names)
    dtype = np.dtype(config.jnp_param_dtype)
    out = {}
    for key in expected_shapes(config):
        out[key] = checked(np.asarray(flat[key]), dtype, source, names.get(key, key))
    params = traverse_util.unflatten_dict(out, sep="/")
    return Model(config, jax.tree_util.tree_map(jax.numpy.asarray, params))


def orbax_metadata(directory: str) -> Dict[str, Tuple[tuple, Any]]:
    """{'encoder/layers_0/...': (shape, dtype)} an orbax checkpoint declares, from its
    metadata alone (nothing restored)."""
    import orbax.checkpoint as ocp
    try:
        with ocp.PyTreeCheckpointer() as ckptr:
            meta = ckptr.metadata(directory)
        meta = getattr(meta, "item_metadata", meta)
        leaves = jax.tree_util.tree_leaves_with_path(meta)
    except Exception as e:  # orbax surfaces tensorstore/json failures as many types
        raise CheckpointError(f"{directory}: cannot read orbax metadata "
                              f"({type(e).__name__}: {e})") from None
    return {"/".join(str(getattr(k, "key", k)) for k in path):
            (tuple(getattr(leaf, "shape", ())), getattr(leaf, "dtype", None))
            for path, leaf in leaves}


def orbax_shapes(directory: str) -> Dict[str, tuple]:
    """{'encoder/layers_0/...': shape} an orbax checkpoint declares (`orbax_metadata`)."""
    return {k: shape for k, (shape, _) in orbax_metadata(directory).items()}


# -- partitioned loading: each tensor straight into its shards ------------------------------
def flat_shardings(partitioner, config: ModelConfig, role: str) -> Dict[str, Any]:
    """{path: NamedSharding}; a dimension the mesh does not divide is a ValueError."""
    return traverse_util.flatten_dict(partitioner.param_shardings(config, role), sep="/")


def flat_formats(partitioner, config: ModelConfig, role: str) -> Dict[str, Any]:
    """{path: NamedSharding or Format}: `Partitioner.param_formats`, flattened."""
    return traverse_util.flatten_dict(partitioner.param_formats(config, role), sep="/")


def lay_out(x: jax.Array, placement) -> jax.Array:
    """x moved into `placement`'s layout when it is a Format (one tensor at a time, so a
    load never holds a second copy of the model); a no-op for a sharding."""
    return x if isinstance(placement, jax.sharding.Sharding) else jax.device_put(x, placement)


def place(shape: tuple, sharding, read: Callable[[tuple], Any], dtype, source: str,
          name: str) -> jax.Array:
    """One parameter built on its devices from `read(index)`, which returns the checkpoint's
    values at `index` (a tuple of slices of `shape`) in the stored dtype. Each distinct shard
    is read once (replicas share it), cast and checked, so the host holds at most this
    tensor's distinct shards, never a whole tensor on one device first."""
    shards: Dict[tuple, np.ndarray] = {}

    def shard(index):
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in shards:
            shards[key] = checked(np.asarray(read(index)), dtype, source, name)  # [shard shape]
        return shards[key]
    return jax.make_array_from_callback(tuple(shape), sharding, shard)


def slice_reader(tensor: Any) -> Callable[[tuple], Any]:
    """`tensor.read(index)` for lazily opened tensors, plain indexing for in-memory arrays."""
    return getattr(tensor, "read", None) or (lambda index: tensor[index])


def build_sharded(config: ModelConfig, flat: Mapping[str, Any], source: str,
                  names: Optional[Mapping[str, str]], partitioner, role: str) -> Model:
    """`build_model` for a partitioner: the same checks, each tensor read shard by shard
    (`slice_reader`) into `partitioner.param_shardings(config, role)`."""
    names = names or {}
    shardings = flat_shardings(partitioner, config, role)
    check_shapes(config, {k: tuple(v.shape) for k, v in flat.items()}, source, names, shardings)
    formats = flat_formats(partitioner, config, role)
    dtype = np.dtype(config.jnp_param_dtype)
    out = {key: lay_out(place(shape, shardings[key], slice_reader(flat[key]), dtype, source,
                              names.get(key, key)), formats[key])
           for key, shape in expected_shapes(config).items()}
    return Model(config, traverse_util.unflatten_dict(out, sep="/"))


def check_finite(x: jax.Array, source: str, name: str) -> None:
    """NaN/Inf anywhere in a placed array is an error; one distinct shard at a time."""
    seen = set()
    for shard in x.addressable_shards:
        key = tuple((s.start, s.stop, s.step) for s in shard.index)
        if key not in seen:
            seen.add(key)
            if not np.isfinite(np.asarray(shard.data).astype(np.float32)).all():
                raise CheckpointError(f"{source}: tensor {name} has NaN or Inf values")


def restore_orbax(directory: str, config: ModelConfig, declared: Mapping[str, Tuple[tuple, Any]],
                  partitioner, role: str, prefix: Tuple[str, ...] = ()) -> Model:
    """Parameters of an orbax checkpoint restored straight into their shards: abstract targets
    carry the shardings, so tensorstore reads only each device's slice (cast to the param
    dtype). declared: `orbax_metadata` of the parameters, found under `prefix` in the tree."""
    import orbax.checkpoint as ocp
    shardings = flat_shardings(partitioner, config, role)
    check_shapes(config, {k: shape for k, (shape, _) in declared.items()}, directory,
                 shardings=shardings)
    for key, (_, stored) in declared.items():
        if stored is not None:  # a non-float tensor would be cast silently by orbax
            check_dtype(stored, directory, key)
    dtype = np.dtype(config.jnp_param_dtype)
    expected = expected_shapes(config)
    item = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=shardings[k])
            for k, shape in expected.items()}
    args = {k: ocp.ArrayRestoreArgs(sharding=shardings[k], dtype=dtype, global_shape=shape)
            for k, shape in expected.items()}
    item, args = (traverse_util.unflatten_dict(t, sep="/") for t in (item, args))
    for key in reversed(prefix):
        item, args = {key: item}, {key: args}
    try:
        with ocp.PyTreeCheckpointer() as ckptr:
            tree = ckptr.restore(os.path.abspath(directory), args=ocp.args.PyTreeRestore(
                item=item, restore_args=args, partial_restore=True))
    except Exception as e:  # orbax surfaces tensorstore/json failures as many types
        raise CheckpointError(f"{directory}: cannot restore parameters "
                              f"({type(e).__name__}: {e})") from None
    for key in prefix:
        tree = tree[key]
    flat, formats = traverse_util.flatten_dict(tree, sep="/"), flat_formats(partitioner, config, role)
    for key in list(flat):
        check_finite(flat[key], directory, key)
        flat[key] = lay_out(flat[key], formats[key])
    return Model(config, traverse_util.unflatten_dict(flat, sep="/"))


def flat_params(model: Model) -> Dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in
            traverse_util.flatten_dict(jax.device_get(model.params), sep="/").items()}
