"""`Model` (config + parameters) and the functional entry points the rest of the package uses.

A decode loop only needs `init_cache` and `decode`:
    cache = init_cache(model, input_ids, max_len)          # encoder run + cross K/V, once
    logits, cache = decode(model, cache, tokens, pos)      # tokens [B, K], pos [B]
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from speculative_t5.model import gpt2
from speculative_t5.model.config import T5Config
from speculative_t5.model.gpt2 import GPT2Config
from speculative_t5.model.t5 import T5

Array = jax.Array
ModelConfig = Union[T5Config, GPT2Config]   # the families a Model holds
FAMILIES = {"t5": T5Config, "gpt2": GPT2Config}  # family name (HF's model_type) -> its config


def family(config: ModelConfig) -> str:
    """'t5' or 'gpt2'."""
    return "gpt2" if isinstance(config, GPT2Config) else "t5"


@struct.dataclass
class Model:
    """A config (static: a T5Config, or a GPT2Config for a decoder-only GPT-2) and its
    parameter tree (plain arrays; T5X's names for T5, Hugging Face's for GPT-2)."""
    config: Any = struct.field(pytree_node=False)
    params: Any

    @property
    def decoder_only(self) -> bool:
        return isinstance(self.config, GPT2Config)

    @property
    def module(self) -> T5:
        if self.decoder_only:
            raise TypeError("a GPT-2 has no encoder-decoder module; use model.gpt2's functions")
        return T5(self.config)

    def num_params(self) -> int:
        return sum(int(x.size) for x in jax.tree_util.tree_leaves(self.params))

    def num_bytes(self) -> int:
        return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(self.params))


def _dummy_inputs():
    return jnp.ones((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32)


def _boxed_shapes(config: T5Config):
    return jax.eval_shape(lambda: T5(config).init(jax.random.PRNGKey(0), *_dummy_inputs()))["params"]


def param_shapes(config: ModelConfig) -> Dict[str, Any]:
    """The parameter tree as jax.ShapeDtypeStruct leaves (no memory allocated); a
    T5Config's or a GPT2Config's."""
    if isinstance(config, GPT2Config):
        return gpt2.param_shapes(config)
    return nn.unbox(_boxed_shapes(config))


def param_axes(config: ModelConfig) -> Dict[str, Any]:
    """The parameter tree with a PartitionSpec of logical axis names per leaf."""
    if isinstance(config, GPT2Config):
        return gpt2.param_axes(config)
    return nn.get_partition_spec(_boxed_shapes(config))


@functools.partial(jax.jit, static_argnums=(0,))
def _init_params(config: T5Config, rng: Array):
    return nn.unbox(T5(config).init(rng, *_dummy_inputs())["params"])


def init_model(config, seed: int = 0) -> Model:
    """Random weights with T5X's initialisers (GPT-2's for a GPT2Config), for tests, timing
    and training from scratch."""
    if isinstance(config, GPT2Config):
        return Model(config, gpt2.init_params(config, seed))
    return Model(config, _init_params(config, jax.random.PRNGKey(seed)))


def _check_ids(name: str, ids, vocab_size: int, ndim: int = 2):
    if getattr(ids, "ndim", None) != ndim:
        raise ValueError(f"{name} must be an int array of rank {ndim}, got shape "
                         f"{getattr(ids, 'shape', None)}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    if not isinstance(ids, jax.core.Tracer) and ids.size:
        lo, hi = int(jnp.min(ids)), int(jnp.max(ids))
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} has token ids in [{lo}, {hi}], outside [0, {vocab_size})")


@jax.jit
def _forward(model: Model, input_ids: Array, decoder_input_ids: Array) -> Array:
    if model.decoder_only:
        return gpt2.forward(model.config, model.params, input_ids)
    return model.module.apply({"params": model.params}, input_ids, decoder_input_ids)


def forward(model: Model, input_ids: Array, decoder_input_ids: Array | None = None) -> Array:
    """Teacher-forced float32 logits [B, T, V]; decoder_input_ids[:, 0] is the start token (0).
    A GPT-2 (decoder-only) takes its tokens [B, T] as input_ids alone (causal)."""
    if model.decoder_only:
        if decoder_input_ids is not None:
            raise ValueError("a decoder-only model takes one token array (input_ids)")
        input_ids = jnp.asarray(input_ids)
        _check_ids("input_ids", input_ids, model.config.vocab_size)
        return _forward(model, input_ids.astype(jnp.int32), None)
    if decoder_input_ids is None:
        raise ValueError("a T5 needs decoder_input_ids beside input_ids")
    input_ids, decoder_input_ids = jnp.asarray(input_ids), jnp.asarray(decoder_input_ids)
    _check_ids("input_ids", input_ids, model.config.vocab_size)
    _check_ids("decoder_input_ids", decoder_input_ids, model.config.vocab_size)
    if input_ids.shape[0] != decoder_input_ids.shape[0]:
        raise ValueError(f"batch sizes differ: input_ids {input_ids.shape}, "
                         f"decoder_input_ids {decoder_input_ids.shape}")
    return _forward(model, input_ids.astype(jnp.int32), decoder_input_ids.astype(jnp.int32))


@jax.jit
def encode(model: Model, input_ids: Array) -> Array:
    """Encoder output [B, S, E]."""
    return model.module.apply({"params": model.params}, input_ids, method=T5.encode)


@functools.partial(jax.jit, static_argnames=("max_len", "recompute_cross_attention"))
def init_cache(model: Model, input_ids: Array, max_len: int,
               recompute_cross_attention: bool = False,
               encoded: Array | None = None) -> Dict[str, Any]:
    """Run the encoder and allocate the decoder cache for `max_len` decoder positions.

    cache = {'self': [{'k','v'}: [B, max_len, H, D]] per layer (zeros),
             'cross': [(k [B, H, D, S], v [B, H, S, D])] per layer, or None when
                      `recompute_cross_attention`
                      (then every step recomputes them from 'encoded', as T5X's example does),
             'encoded': [B, S, E], 'encoder_mask': [B, S] bool}
    Jitted; traceable inside another jit."""
    c = model.config
    if encoded is None:
        encoded = encode(model, input_ids)
    B = input_ids.shape[0]
    zeros = jnp.zeros((B, max_len, c.num_heads, c.head_dim), c.jnp_dtype)
    cross = None if recompute_cross_attention else model.module.apply(
        {"params": model.params}, encoded, method=T5.cross_kv)
    return {"self": [{"k": zeros, "v": zeros} for _ in range(c.num_decoder_layers)],
            "cross": cross, "encoded": encoded, "encoder_mask": input_ids != c.pad_id}


@functools.partial(jax.jit, static_argnames=("length",))
def prefill_cache(model: Model, prompts: Array, lengths: Array, length: int):
    """A GPT-2 decode's cache: the prompts [B, S] (right-padded, lengths [B]) written, room
    for `length` more positions (`gpt2.prefill`). Jitted; traceable inside another jit."""
    return gpt2.prefill(model.config, model.params, prompts, lengths, length)


def start_cache(model: Model, ids: Array, lengths: Array | None, length: int,
                recompute_cross_attention: bool = False) -> Dict[str, Any]:
    """The cache a decode starts from, with room for `length` positions: a T5's
    (`init_cache`: its encoder run over ids [B, S]) or a GPT-2's (`prefill_cache`: the
    prompts ids [B, S] of lengths [B] written)."""
    if model.decoder_only:
        return prefill_cache(model, ids, lengths, length)
    return init_cache(model, ids, length, recompute_cross_attention)


def cache_axes(cache: Dict[str, Any]) -> Dict[str, Any]:
    """Logical axis names of every array in an `init_cache` cache, or a GPT-2's
    `prefill_cache` cache (the same tree), so a partitioner can shard it: batch rows over
    'data', heads over 'model'."""
    if "layers" in cache:
        return gpt2.cache_axes(cache)
    return {"self": [{"k": ("batch", "length", "heads", "kv"), "v": ("batch", "length", "heads", "kv")}
                     for _ in cache["self"]],
            "cross": None if cache["cross"] is None else [
                (("batch", "heads", "kv", "length"), ("batch", "heads", "length", "kv"))
                for _ in cache["cross"]],
            "encoded": ("batch", "length", "embed"), "encoder_mask": ("batch", "length")}


def beside_cache_default() -> bool:
    """Whether a decoder step attends beside its cache (`decode`'s `beside_cache`) on the
    default backend: everywhere but on CPUs."""
    return jax.default_backend() != "cpu"


@functools.partial(jax.jit, static_argnames=("tree", "beside_cache"))
def decode(model: Model, cache: Dict[str, Any], tokens: Array, pos: Array, tree=None,
           beside_cache: Optional[bool] = None):
    """One decoder pass over tokens [B, K] at positions pos[B].. -> (float32 logits [B, K, V], cache).

    Keys/values are written by overwrite at pos..pos+K-1; writes at positions >= max_len are
    dropped (the caller sizes the cache so that never matters). Jitted; traceable inside jit.
    A GPT-2's cache comes from `prefill_cache`; its positions are relative to each prompt's
    last token. tree (static, `decoding.trees.TreeNodes`): the tokens are nodes of a token
    tree rooted at pos -- node j in slot pos + j at position pos + its depth, seeing the
    slots before pos and its ancestors. beside_cache (static; None: `beside_cache_default`):
    attend over the cache as it was and the new keys beside it, then write them -- the same
    logits; what an accelerator's compiler writes in place (`T5.decode_step`)."""
    beside = beside_cache_default() if beside_cache is None else beside_cache
    if model.decoder_only:
        return gpt2.step(model.config, model.params, cache, tokens, pos, tree, beside)
    return model.module.apply({"params": model.params}, tokens, pos, cache, tree, beside,
                              method=T5.decode_step)


@jax.jit
def keep_path(model: Model, cache: Dict[str, Any], pos: Array, path: Array, depth: Array):
    """After a step over a token tree at pos [B] (`decode` with `tree`): the keys and values
    of the accepted nodes path [B, D] (the first depth [B] of them) moved to slots pos + 1..,
    so the cache reads as if the path had been fed one token after another (each node was
    already computed at its depth's position). Slots past the path are left as they are:
    the next step overwrites them."""
    layers, base = ((cache["layers"], pos + cache["offset"]) if model.decoder_only
                    else (cache["self"], pos))
    B, D = path.shape
    rows = jnp.arange(B)[:, None]                                              # [B, 1]
    src = base[:, None] + path                                                 # [B, D]
    L = layers[0]["k"].shape[1]
    dst = jnp.where(jnp.arange(D)[None, :] < depth[:, None],
                    base[:, None] + 1 + jnp.arange(D)[None, :], L)             # L: dropped
    moved = [{n: x.at[rows, dst].set(x[rows, src], mode="drop") for n, x in layer.items()}
             for layer in layers]
    return dict(cache, layers=moved) if model.decoder_only else dict(cache, self=moved)


def cast_params(model: Model, dtype: str) -> Model:
    """The same model with floating parameters stored as `dtype`."""
    config = model.config.replace(param_dtype=dtype)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), model.params)
    return Model(config, params)


def host_memory() -> int:
    """Bytes of physical memory on this machine (0 where the OS does not say)."""
    import os
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
