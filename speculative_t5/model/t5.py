"""Flax (linen) T5 1.0 / 1.1 with a static, overwrite-only decoder KV cache.

The module knows nothing of decoding. It offers four entry points (used through
`speculative_t5.model.api`):
  * `__call__`      teacher-forced logits [B, T, V] (training, alpha measurement);
  * `encode`        encoder output [B, S, E];
  * `cross_kv`      the decoder's cross-attention keys/values, computed once per input;
  * `decode_step`   K >= 1 new tokens per row at per-row positions `pos[B]`: writes their
                    self-attention keys/values into the cache at pos..pos+K-1 (overwrite,
                    never add) and lets each query see keys at absolute positions <= its own.
                    Stale slots beyond a row's position are masked, so rolling back after a
                    rejected draft costs nothing: the next step overwrites them.

Parameter names are T5X's (`encoder/layers_0/attention/query/kernel`, ...) and every
parameter carries logical axis names (`embed`, `mlp`, `joined_kv`, `heads`, `vocab`,
`relpos_buckets`) so the same tree shards on a mesh.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.model.config import T5Config

Array = jax.Array
Cache = Dict[str, Any]
NEG_INF = -1e10  # additive mask value (T5X uses the same); scores are float32
CROSS_LAYOUT = "bhdl,bhld"  # cross-attention keys [B, H, D, S], values [B, H, S, D]

_ACT = {"relu": jax.nn.relu, "gelu": lambda x: jax.nn.gelu(x, approximate=True),
        "silu": jax.nn.silu, "linear": lambda x: x}


def _dropout(c: T5Config) -> nn.Dropout:
    """T5X's dropout, training only: rate c.dropout_rate, one mask for every position of a
    row (broadcast over axis -2). Every module calls it with deterministic=not
    enable_dropout; deterministic or at rate 0 it gives its input back."""
    return nn.Dropout(c.dropout_rate, broadcast_dims=(-2,))


def _param(module: nn.Module, name: str, init, shape, axes: Tuple[str, ...], dtype):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class Dense(nn.Module):
    """y = x @ kernel, kernel [in, out] as T5X stores it (no bias)."""
    features: int
    axes: Tuple[str, str]
    config: T5Config
    init_scale: float = 1.0

    @nn.compact
    def __call__(self, x: Array) -> Array:
        c = self.config
        init = nn.initializers.variance_scaling(self.init_scale, "fan_in", "truncated_normal")
        kernel = _param(self, "kernel", init, (x.shape[-1], self.features), self.axes,
                        c.jnp_param_dtype)
        return jnp.einsum("...i,io->...o", x.astype(c.jnp_dtype), kernel.astype(c.jnp_dtype))


class RMSNorm(nn.Module):
    """T5 layer norm: no mean subtraction, no bias, variance in float32."""
    config: T5Config

    @nn.compact
    def __call__(self, x: Array) -> Array:
        c = self.config
        scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",),
                       c.jnp_param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + c.layer_norm_epsilon)
        return y.astype(c.jnp_dtype) * scale.astype(c.jnp_dtype)


def relative_position_bucket(rel: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
    """Mesh-TF's bucketing of rel = key_pos - query_pos into [0, num_buckets)."""
    ret = jnp.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (rel > 0).astype(rel.dtype) * num_buckets
        n = jnp.abs(rel)
    else:
        n = jnp.maximum(-rel, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact)
        / np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(rel.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return ret + jnp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """Bias [B, H, K, L] from query positions [B, K] and key positions [L] or [B, L];
    shared by a stack."""
    config: T5Config
    bidirectional: bool

    @nn.compact
    def __call__(self, q_pos: Array, k_pos: Array) -> Array:
        c = self.config
        table = _param(self, "rel_embedding",
                       nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                       (c.num_heads, c.relative_attention_num_buckets), ("heads", "relpos_buckets"),
                       c.jnp_param_dtype)
        k_pos = k_pos[None, :] if k_pos.ndim == 1 else k_pos                 # [B|1, L]
        rel = k_pos[:, None, :] - q_pos[:, :, None]                           # [B, K, L]
        bucket = relative_position_bucket(rel, self.bidirectional,
                                          c.relative_attention_num_buckets,
                                          c.relative_attention_max_distance)
        bias = jnp.take(table.astype(jnp.float32), bucket, axis=1)          # [H, B, K, L]
        return jnp.transpose(bias, (1, 0, 2, 3))                             # [B, H, K, L]


def keys_beside_cache(visible: Array, slots: Array) -> Tuple[Array, Array, Array]:
    """For K new keys bound for cache slots [B, K] (>= L: dropped) and what each query sees
    of the cache once they are written, visible [B, K, L] -> (the slots they overwrite,
    hidden [B, L]; what each query sees of the new keys, sees [B, K, K]; the slots clipped
    into the cache [B, K]): attending over the old cache less `hidden` and the new keys by
    `sees` is attending over the written cache (`attend_beside_cache`)."""
    L = visible.shape[-1]
    at = jnp.clip(slots, 0, L - 1)                                             # [B, K]
    hidden = jnp.any(slots[:, :, None] == jnp.arange(L), axis=1)               # [B, L]
    cols = jnp.broadcast_to(at[:, None, :], visible.shape[:2] + at.shape[1:])  # [B, K, K]
    return hidden, jnp.take_along_axis(visible, cols, 2) & (slots < L)[:, None, :], at


def attend_beside_cache(q: Array, cache: Dict[str, Array], k: Array, v: Array,
                        bias: Tuple[Array, Array], dtype, scale: float = 1.0) -> Array:
    """Queries q [B, K, H, D] over a cache as it was ({'k','v'} [B, L, H, D]) and K new keys,
    values [B, K, H, D] beside it, one softmax over both -> [B, K, H, D] float32. bias:
    ([B, H|1, K, L] over the cache, the slots the new keys overwrite hidden; [B, H|1, K, K]
    over the new keys). The same as attending over the cache with the new keys written in,
    but nothing reads the written cache within the step, so a TPU writes the K slots in
    place in HBM instead of staging each layer's whole cache in on-chip memory and copying
    it back."""
    scores = jnp.concatenate(
        [jnp.einsum("bkhd,blhd->bhkl", q, cache["k"], preferred_element_type=jnp.float32)
         * scale + bias[0],
         jnp.einsum("bkhd,bjhd->bhkj", q, k, preferred_element_type=jnp.float32)
         * scale + bias[1]], axis=-1)                                          # [B, H, K, L + K]
    weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
    L = cache["k"].shape[1]
    return (jnp.einsum("bhkl,blhd->bkhd", weights[..., :L], cache["v"],
                       preferred_element_type=jnp.float32)
            + jnp.einsum("bhkj,bjhd->bkhd", weights[..., L:], v,
                         preferred_element_type=jnp.float32))


class Attention(nn.Module):
    """Multi-head attention without 1/sqrt(d) (T5 folds it into the query weights)."""
    config: T5Config

    def setup(self):
        c = self.config
        joined = c.num_heads * c.head_dim
        self.query = Dense(joined, ("embed", "joined_kv"), c, init_scale=1.0 / c.head_dim)
        self.key = Dense(joined, ("embed", "joined_kv"), c)
        self.value = Dense(joined, ("embed", "joined_kv"), c)
        self.out = Dense(c.emb_dim, ("joined_kv", "embed"), c)

    def kv(self, x: Array) -> Tuple[Array, Array]:
        """x [B, L, E] -> keys, values [B, L, H, D]."""
        c = self.config
        shape = x.shape[:2] + (c.num_heads, c.head_dim)
        return self.key(x).reshape(shape), self.value(x).reshape(shape)

    def __call__(self, x: Array, k: Array, v: Array, bias: Array,
                 layout: str = "blhd,blhd") -> Array:
        """x [B, K, E] queries over keys, values in `layout` (the self-attention cache's
        "blhd,blhd", or the cross-attention's "bhdl,bhld": keys [B, H, D, L] and values
        [B, H, L, D], which the two contractions read as plain batched matmuls, several
        times faster on CPU than transposing long inputs' keys every step);
        bias [B|1, H|1, K|1, L]."""
        c = self.config
        k_axes, v_axes = layout.split(",")
        q = self.query(x).reshape(x.shape[:2] + (c.num_heads, c.head_dim))   # [B, K, H, D]
        scores = jnp.einsum(f"bkhd,{k_axes}->bhkl", q, k,
                            preferred_element_type=jnp.float32) + bias       # [B, H, K, L]
        weights = jax.nn.softmax(scores, axis=-1).astype(c.jnp_dtype)
        y = jnp.einsum(f"bhkl,{v_axes}->bkhd", weights, v)                   # [B, K, H, D]
        return self.out(y.reshape(x.shape[:2] + (c.num_heads * c.head_dim,)))

    def over_cache(self, x: Array, cache: Dict[str, Array], k: Array, v: Array,
                   bias: Tuple[Array, Array]) -> Array:
        """x [B, K, E] queries over the cache as it was and the K new keys, values
        [B, K, H, D] beside it (`attend_beside_cache`)."""
        c = self.config
        q = self.query(x).reshape(x.shape[:2] + (c.num_heads, c.head_dim))   # [B, K, H, D]
        y = attend_beside_cache(q, cache, k, v, bias, c.jnp_dtype)           # [B, K, H, D]
        return self.out(y.astype(c.jnp_dtype).reshape(x.shape[:2] + (c.num_heads * c.head_dim,)))


class MLP(nn.Module):
    """wo(prod_i act_i(wi_i x)): ReLU `wi` (T5 1.0) or gated GELU `wi_0`, `wi_1` (1.1)."""
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, enable_dropout: bool = False) -> Array:
        c = self.config
        acts = c.mlp_activations
        h = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            y = _ACT[act](Dense(c.mlp_dim, ("embed", "mlp"), c, name=name)(x))
            h = y if h is None else h * y
        h = _dropout(c)(h, deterministic=not enable_dropout)                # [B, K, M]
        return Dense(c.emb_dim, ("mlp", "embed"), c, name="wo")(h)


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, bias: Array, enable_dropout: bool = False) -> Array:
        c = self.config
        drop = functools.partial(_dropout(c), deterministic=not enable_dropout)
        h = RMSNorm(c, name="pre_attention_layer_norm")(x)
        attn = Attention(c, name="attention")
        k, v = attn.kv(h)
        x = x + drop(attn(h, k, v, bias))
        h = MLP(c, name="mlp")(RMSNorm(c, name="pre_mlp_layer_norm")(x), enable_dropout)
        return x + drop(h)


class Encoder(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, mask: Array, enable_dropout: bool = False) -> Array:
        """x [B, S, E] embedded inputs, mask [B, S] (True = real token) -> [B, S, E]."""
        c = self.config
        drop = functools.partial(_dropout(c), deterministic=not enable_dropout)
        x = drop(x)
        pos = jnp.arange(x.shape[1])
        bias = RelativePositionBias(c, bidirectional=True, name="relpos_bias")(
            pos[None, :], pos)                                               # [1, H, S, S]
        bias = bias + jnp.where(mask[:, None, None, :], 0.0, NEG_INF)        # [B, H, S, S]
        for i in range(c.num_encoder_layers):
            x = EncoderLayer(c, name=f"layers_{i}")(x, bias, enable_dropout)
        return drop(RMSNorm(c, name="encoder_norm")(x))


class DecoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        c = self.config
        self.pre_self_attention_layer_norm = RMSNorm(c)
        self.self_attention = Attention(c)
        self.pre_cross_attention_layer_norm = RMSNorm(c)
        self.encoder_decoder_attention = Attention(c)
        self.pre_mlp_layer_norm = RMSNorm(c)
        self.mlp = MLP(c)
        self.dropout = _dropout(c)

    def cross_kv(self, encoded: Array) -> Tuple[Array, Array]:
        """Cross-attention keys [B, H, D, S] and values [B, H, S, D], laid out once per input
        the way every decoder step's contractions read them (CROSS_LAYOUT)."""
        k, v = self.encoder_decoder_attention.kv(encoded)                   # [B, S, H, D]
        return jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3))

    def __call__(self, x: Array, self_bias: Array, cross_k: Array, cross_v: Array,
                 cross_bias: Array, cache: Optional[Dict[str, Array]] = None,
                 pos: Optional[Array] = None, enable_dropout: bool = False):
        """x [B, K, E]. With a cache ({'k','v'}: [B, L, H, D]) the new keys/values are written
        at slots pos [B, K] (out-of-range writes are dropped); attention reads the written
        cache, or, when self_bias is a pair, the cache as it was and the new keys beside it
        (`Attention.over_cache`, what `T5.decode_step`'s `beside_cache` asks for)."""
        def drop(y):
            return self.dropout(y, deterministic=not enable_dropout)
        h = self.pre_self_attention_layer_norm(x)
        k, v = self.self_attention.kv(h)                                     # [B, K, H, D]
        if cache is not None:
            k, v = k.astype(cache["k"].dtype), v.astype(cache["v"].dtype)
            rows = jnp.arange(x.shape[0])[:, None]                           # [B, 1]
            written = {"k": cache["k"].at[rows, pos].set(k, mode="drop"),    # pos [B, K]
                       "v": cache["v"].at[rows, pos].set(v, mode="drop")}
        if isinstance(self_bias, tuple):  # (over the cache as it was, over the new keys)
            x = x + drop(self.self_attention.over_cache(h, cache, k, v, self_bias))
        elif cache is not None:
            x = x + drop(self.self_attention(h, written["k"], written["v"], self_bias))
        else:
            x = x + drop(self.self_attention(h, k, v, self_bias))
        cache = None if cache is None else written
        h = self.pre_cross_attention_layer_norm(x)
        x = x + drop(self.encoder_decoder_attention(h, cross_k, cross_v, cross_bias, CROSS_LAYOUT))
        x = x + drop(self.mlp(self.pre_mlp_layer_norm(x), enable_dropout))
        return x, cache


class Decoder(nn.Module):
    config: T5Config

    def setup(self):
        c = self.config
        self.relpos_bias = RelativePositionBias(c, bidirectional=False)
        self.layers = [DecoderLayer(c, name=f"layers_{i}") for i in range(c.num_decoder_layers)]
        self.decoder_norm = RMSNorm(c)
        self.dropout = _dropout(c)
        if not c.logits_via_embedding:
            self.logits_dense = Dense(c.vocab_size, ("embed", "vocab"), c)

    def cross_kv(self, encoded: Array) -> List[Tuple[Array, Array]]:
        return [layer.cross_kv(encoded) for layer in self.layers]

    def __call__(self, y: Array, q_pos: Array, k_pos: Array, cross: Sequence[Tuple[Array, Array]],
                 encoder_mask: Array, embedding: Array,
                 caches: Optional[List[Dict[str, Array]]] = None, slots: Optional[Array] = None,
                 enable_dropout: bool = False, visible: Optional[Array] = None,
                 beside_cache: bool = False):
        """y [B, K, E] embedded decoder inputs at positions q_pos [B, K], written to cache
        slots [B, K]; keys at k_pos [L] (or [B, L]). visible [B, K, L]: what each query sees
        (default causal by position). beside_cache: attend over the caches as they were and
        the new keys beside them (`attend_beside_cache`). Returns float32 logits [B, K, V]
        and the caches."""
        c = self.config
        if visible is None:
            visible = k_pos[None, None, :] <= q_pos[:, :, None]              # [B, K, L]
        self_bias = self.relpos_bias(q_pos, k_pos) + jnp.where(visible[:, None], 0.0, NEG_INF)
        if caches is not None and beside_cache:  # the new keys: what their slots would show
            hidden, sees, at = keys_beside_cache(visible, slots)             # [B, L], [B, K, K]
            new_pos = jnp.take_along_axis(
                jnp.broadcast_to(k_pos, at.shape[:1] + visible.shape[-1:]), at, 1)  # [B, K]
            self_bias = (jnp.where(hidden[:, None, None, :], NEG_INF, self_bias),
                         self.relpos_bias(q_pos, new_pos) + jnp.where(sees[:, None], 0.0, NEG_INF))
        cross_bias = jnp.where(encoder_mask[:, None, None, :], 0.0, NEG_INF)  # [B, 1, 1, S]
        new_caches = []
        x = self.dropout(y, deterministic=not enable_dropout)
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, self_bias, cross[i][0], cross[i][1], cross_bias,
                             None if caches is None else caches[i], slots, enable_dropout)
            new_caches.append(cache)
        x = self.dropout(self.decoder_norm(x), deterministic=not enable_dropout)
        if c.logits_via_embedding:  # T5 1.0: tied output layer, scaled by emb_dim**-0.5
            logits = jnp.einsum("bke,ve->bkv", x.astype(jnp.float32),
                                embedding.astype(jnp.float32)) / np.sqrt(c.emb_dim)
        else:
            logits = self.logits_dense(x).astype(jnp.float32)
        return logits, (None if caches is None else new_caches)


class T5(nn.Module):
    """Encoder-decoder; parameter tree rooted at token_embedder / encoder / decoder."""
    config: T5Config

    def setup(self):
        c = self.config
        self.token_embedder = nn.Embed(
            c.vocab_size, c.emb_dim, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype,
            embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0),
                                                        ("vocab", "embed")))
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)

    def encode(self, input_ids: Array, enable_dropout: bool = False) -> Array:
        """input_ids [B, S] (0 = pad) -> [B, S, E]."""
        return self.encoder(self.token_embedder(input_ids), input_ids != self.config.pad_id,
                            enable_dropout)

    def cross_kv(self, encoded: Array) -> List[Tuple[Array, Array]]:
        return self.decoder.cross_kv(encoded)

    def decode_step(self, tokens: Array, pos: Array, cache: Cache, tree=None,
                    beside_cache: bool = False) -> Tuple[Array, Cache]:
        """tokens [B, K] at positions pos[B]..pos[B]+K-1 -> logits [B, K, V], cache.

        `cache['cross']` holds per-layer cross keys/values; if it is None they are
        recomputed from `cache['encoded']` (the T5X-faithful baseline does that).
        tree: the tokens are nodes of a token tree (`decoding.trees.TreeNodes`: slots, the
        positions their depths give, attention to ancestors only). beside_cache: attend over
        the cache as it was and the new keys beside it, then write them (the same logits):
        on a TPU the write is then in place, where attending over the written cache makes
        the compiler stage each layer's cache in on-chip memory and copy it back every
        step; on a CPU the extra operations cost more than they save."""
        K = tokens.shape[1]
        L = cache["self"][0]["k"].shape[1]
        if tree is None:
            q_pos = pos[:, None] + jnp.arange(K)[None, :]                    # [B, K]
            slots, k_pos, visible = q_pos, jnp.arange(L), None
        else:
            slots, q_pos, k_pos, visible = tree.attention(pos, K, L)         # [B, K], [B, L], [B, K, L]
        cross = cache["cross"]
        if cross is None:
            cross = self.cross_kv(cache["encoded"])
        logits, caches = self.decoder(
            self.token_embedder(tokens), q_pos, k_pos, cross, cache["encoder_mask"],
            self.token_embedder.embedding, caches=cache["self"], slots=slots, visible=visible,
            beside_cache=beside_cache)
        return logits, dict(cache, self=caches)

    def __call__(self, input_ids: Array, decoder_input_ids: Array,
                 enable_dropout: bool = False) -> Array:
        """Teacher-forced logits [B, T, V] (decoder_input_ids start with the pad token).
        enable_dropout: training (config.dropout_rate; needs a 'dropout' rng)."""
        encoded = self.encode(input_ids, enable_dropout)
        T = decoder_input_ids.shape[1]
        pos = jnp.arange(T)
        logits, _ = self.decoder(
            self.token_embedder(decoder_input_ids),
            jnp.broadcast_to(pos[None, :], decoder_input_ids.shape), pos,
            self.cross_kv(encoded), input_ids != self.config.pad_id, self.token_embedder.embedding,
            enable_dropout=enable_dropout)
        return logits
