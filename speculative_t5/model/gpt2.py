"""Flax (linen) GPT-2 with the same static, overwrite-only KV cache as the T5 decoder.

Learned absolute positions, pre-LayerNorm blocks, GELU (tanh), the output layer tied to the
token embedding. Like `t5.py` it knows nothing of decoding:
  * `__call__`      teacher-forced logits [B, T, V] (causal);
  * `decode_step`   K >= 1 new tokens per row at per-row positions pos [B]: their keys and
                    values are written into the cache at pos..pos+K-1 (overwrite, never
                    add), each query sees keys at absolute positions <= its own, and the
                    position embedding is wpe[pos + j]. A prompt is prefilled by one call
                    with K = its (padded) width; positions past a row's prompt hold pad
                    tokens until the row's own tokens overwrite them.

Parameter names follow Hugging Face's GPT-2 (`h_0/attn_c_attn/kernel` for
`h.0.attn.c_attn.weight`, whose Conv1D layout [in, out] is already a Flax kernel's), and
every parameter carries logical axis names (`vocab`, `embed`, `joined_kv`, `mlp`) so the
tree shards like T5's on a mesh.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Dict, List, Mapping, Tuple

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
from flax import traverse_util

from speculative_t5.model.config import ConfigBase
from speculative_t5.model.t5 import _param, attend_beside_cache, keys_beside_cache

Array = jax.Array
NEG_INF = -1e10

# (n_embd, n_layer, n_head) of the public checkpoints; n_positions 1024, vocab 50257
_PRESETS = {"gpt2": (768, 12, 12), "gpt2-medium": (1024, 24, 16), "gpt2-large": (1280, 36, 20),
            "gpt2-xl": (1600, 48, 25), "distilgpt2": (768, 6, 12)}
LIMITS = {"vocab_size": 1 << 21, "n_positions": 1 << 20, "n_embd": 1 << 16, "n_layer": 256,
          "n_head": 1024}


@dataclasses.dataclass(frozen=True)
class GPT2Config(ConfigBase):
    """Shape and numerics of one GPT-2 (hashable: a static jit argument). GPT-2 has no pad
    token; pad_id only fills right-padded prompts, which their lengths mask."""
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    eos_id: int = 50256
    pad_id: int = 50256
    dtype: str = "float32"          # activations
    param_dtype: str = "float32"

    def __post_init__(self):
        for name, most in LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(f"GPT2Config.{name} must be an int in [1, {most}], got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config n_embd {self.n_embd} is not a multiple of n_head "
                             f"{self.n_head}")
        for name in ("eos_id", "pad_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"GPT2Config.{name} {getattr(self, name)} is outside the "
                                 f"vocabulary [0, {self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GPT2Config":
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown GPT2Config fields: {unknown}")
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "GPT2Config":
        if name not in _PRESETS:
            raise ValueError(f"unknown GPT-2 preset {name!r}; known: {sorted(_PRESETS)}")
        n_embd, n_layer, n_head = _PRESETS[name]
        return cls(n_embd=n_embd, n_layer=n_layer, n_head=n_head, **overrides)

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], **overrides: Any) -> "GPT2Config":
        """From a transformers `config.json` (model_type gpt2); a missing or mistyped field
        is a ValueError naming it."""
        if hf.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"config.json model_type is {hf.get('model_type')!r}, not 'gpt2'")
        fields = {}
        for ours, theirs in (("vocab_size", "vocab_size"), ("n_positions", "n_positions"),
                             ("n_embd", "n_embd"), ("n_layer", "n_layer"), ("n_head", "n_head")):
            value = hf.get(theirs)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"config.json field {theirs!r} must be one int, got {value!r}")
            fields[ours] = value
        n_inner = hf.get("n_inner")
        if n_inner is not None and n_inner != 4 * fields["n_embd"]:
            raise ValueError(f"config.json n_inner {n_inner!r}: only GPT-2's 4 * n_embd MLP "
                             "is implemented")
        for name, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                           ("add_cross_attention", False)):
            if hf.get(name, want) != want:
                raise ValueError(f"config.json {name} {hf[name]!r}: only {want} is implemented")
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"config.json activation_function {act!r}: only GPT-2's tanh GELU "
                             "('gelu_new') is implemented")
        eos = hf.get("eos_token_id", 50256)
        eos = eos if isinstance(eos, int) and 0 <= eos < fields["vocab_size"] else fields["vocab_size"] - 1
        fields.update(layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)), eos_id=eos,
                      pad_id=eos)
        fields.update(overrides)
        return cls(**fields)

    def to_hf_config(self) -> dict:
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "vocab_size": self.vocab_size, "n_positions": self.n_positions,
                "n_ctx": self.n_positions, "n_embd": self.n_embd, "n_layer": self.n_layer,
                "n_head": self.n_head, "n_inner": None, "activation_function": "gelu_new",
                "layer_norm_epsilon": self.layer_norm_epsilon, "bos_token_id": self.eos_id,
                "eos_token_id": self.eos_id, "tie_word_embeddings": True}


def preset_names() -> Tuple[str, ...]:
    return tuple(sorted(_PRESETS))


@gin.configurable("GPT2Config")
def gin_gpt2_config(preset: str = "", **fields: Any) -> GPT2Config:
    """`GPT2Config` as gin sees it: `GPT2Config.n_embd = 256`, or `GPT2Config.preset = 'gpt2'`."""
    return GPT2Config.preset(preset, **fields) if preset else GPT2Config(**fields)


class Linear(nn.Module):
    """y = x @ kernel + bias, kernel [in, out] (HF's Conv1D layout). residual: a projection
    into the residual stream, initialised with std 0.02 / sqrt(2 n_layer) as GPT-2 does."""
    features: int
    axes: Tuple[str, str]
    config: GPT2Config
    residual: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        c = self.config
        std = 0.02 / math.sqrt(2 * c.n_layer) if self.residual else 0.02
        kernel = _param(self, "kernel", nn.initializers.normal(std), (x.shape[-1], self.features),
                        self.axes, c.jnp_param_dtype)
        bias = _param(self, "bias", nn.initializers.zeros, (self.features,), self.axes[1:],
                      c.jnp_param_dtype)
        y = jnp.einsum("...i,io->...o", x.astype(c.jnp_dtype), kernel.astype(c.jnp_dtype))
        return y + bias.astype(c.jnp_dtype)


def LayerNorm(c: GPT2Config, name: str = None) -> nn.LayerNorm:  # noqa: N802 (a module)
    """GPT-2's layer norm (Flax's, statistics in float32): scale and bias over 'embed'."""
    return nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype,
                        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                        name=name)


class Block(nn.Module):
    config: GPT2Config

    @nn.compact
    def __call__(self, x: Array, bias, cache=None, slots=None) -> Tuple[Array, Array, Array]:
        """x [B, K, E] -> (x, keys, values): with no cache, bias [1, 1, K, K] over the K
        tokens and their keys, values [B, K, H, D]; with one ({'k','v'} [B, L, H, D]), the
        cache with them written at slots [B, K], attention reading it (bias [B, 1, K, L])
        or, with a pair of biases ([B, 1, K, L], [B, 1, K, K]), the cache as it was and
        the new keys beside it (`attend_beside_cache`)."""
        c = self.config
        B, K = x.shape[:2]
        h = LayerNorm(c, name="ln_1")(x)
        qkv = Linear(3 * c.n_embd, ("embed", "joined_kv"), c, name="attn_c_attn")(h)
        q, k, v = (t.reshape(B, K, c.n_head, c.head_dim) for t in jnp.split(qkv, 3, -1))
        if cache is not None:
            new_k, new_v = k.astype(cache["k"].dtype), v.astype(cache["v"].dtype)
            rows = jnp.arange(B)[:, None]                                      # [B, 1]
            k = cache["k"].at[rows, slots].set(new_k, mode="drop")             # [B, L, H, D]
            v = cache["v"].at[rows, slots].set(new_v, mode="drop")
        if isinstance(bias, tuple):  # (over the cache as it was, over the new keys)
            y = attend_beside_cache(q, cache, new_k, new_v, bias, c.jnp_dtype,
                                    1.0 / math.sqrt(c.head_dim)).astype(c.jnp_dtype)
        else:
            scores = jnp.einsum("bkhd,blhd->bhkl", q, k, preferred_element_type=jnp.float32)
            scores = scores / jnp.sqrt(jnp.float32(c.head_dim)) + bias         # [B, H, K, L]
            y = jnp.einsum("bhkl,blhd->bkhd", jax.nn.softmax(scores, -1).astype(c.jnp_dtype), v)
        x = x + Linear(c.n_embd, ("joined_kv", "embed"), c, residual=True, name="attn_c_proj")(
            y.reshape(B, K, c.n_embd))
        h = LayerNorm(c, name="ln_2")(x)
        h = Linear(4 * c.n_embd, ("embed", "mlp"), c, name="mlp_c_fc")(h)
        h = Linear(c.n_embd, ("mlp", "embed"), c, residual=True, name="mlp_c_proj")(
            jax.nn.gelu(h, approximate=True))
        return x + h, k, v


class GPT2(nn.Module):
    config: GPT2Config

    def setup(self):
        c = self.config
        self.wte = self.param("wte", nn.with_logical_partitioning(
            nn.initializers.normal(0.02), ("vocab", "embed")), (c.vocab_size, c.n_embd),
            c.jnp_param_dtype)
        self.wpe = self.param("wpe", nn.with_logical_partitioning(
            nn.initializers.normal(0.01), (None, "embed")), (c.n_positions, c.n_embd),
            c.jnp_param_dtype)
        self.blocks = [Block(c, name=f"h_{i}") for i in range(c.n_layer)]
        self.ln_f = LayerNorm(c)

    def _run(self, tokens: Array, positions: Array, bias, cache=None,
             slots=None) -> Tuple[Array, List]:
        c = self.config
        x = (jnp.take(self.wte, tokens, axis=0) + jnp.take(self.wpe, positions, axis=0)
             ).astype(c.jnp_dtype)                                             # [B, K, E]
        kvs = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, bias, None if cache is None else cache[i], slots)
            kvs.append((k, v))
        x = self.ln_f(x)
        logits = jnp.einsum("bke,ve->bkv", x, self.wte.astype(c.jnp_dtype),
                            preferred_element_type=jnp.float32)
        return logits, kvs

    def __call__(self, tokens: Array) -> Array:
        """Teacher-forced logits float32 [B, T, V] for tokens [B, T] (causal)."""
        T = tokens.shape[1]
        pos = jnp.arange(T)
        bias = jnp.where(pos[None, :] <= pos[:, None], 0.0, NEG_INF)[None, None]  # [1, 1, T, T]
        logits, _ = self._run(tokens, jnp.broadcast_to(pos, tokens.shape), bias)
        return logits

    def decode_step(self, cache: List[Dict[str, Array]], tokens: Array, pos: Array, tree=None,
                    beside_cache: bool = False):
        """tokens [B, K] at positions pos[b] + 0..K-1 -> (logits float32 [B, K, V], cache).
        cache: per layer {'k', 'v'} [B, L, H, D]; writes past L are dropped. tree: the
        tokens are nodes of a token tree (`decoding.trees.TreeNodes`: slots, positions from
        their depths, attention to ancestors only). beside_cache: attend over the cache as it
        was and the new keys beside it (`model.t5.attend_beside_cache`: what a TPU writes in
        place)."""
        K = tokens.shape[1]
        L = cache[0]["k"].shape[1]
        if tree is None:
            q_pos = slots = pos[:, None] + jnp.arange(K)[None, :]              # [B, K]
            visible = jnp.arange(L)[None, None, :] <= q_pos[:, :, None]        # [B, K, L]
        else:
            slots, q_pos, _, visible = tree.attention(pos, K, L)
        bias = jnp.where(visible, 0.0, NEG_INF)[:, None]                       # [B, 1, K, L]
        if beside_cache:
            hidden, sees, _ = keys_beside_cache(visible, slots)               # [B, L], [B, K, K]
            bias = (jnp.where(hidden[:, None, None, :], NEG_INF, bias),
                    jnp.where(sees, 0.0, NEG_INF)[:, None])                    # [B, 1, K, K]
        positions = jnp.minimum(q_pos, self.config.n_positions - 1)
        logits, kvs = self._run(tokens, positions, bias, cache, slots)
        return logits, [{"k": k, "v": v} for k, v in kvs]


def init_params(config: GPT2Config, seed: int = 0):
    """Random parameters (GPT-2's initializers), plain arrays."""
    tokens = jnp.zeros((1, 2), jnp.int32)
    return nn.unbox(jax.jit(lambda r: GPT2(config).init(r, tokens)["params"])(
        jax.random.PRNGKey(seed)))


def _boxed_shapes(config: GPT2Config):
    tokens = jnp.zeros((1, 2), jnp.int32)
    return jax.eval_shape(lambda: GPT2(config).init(jax.random.PRNGKey(0), tokens))["params"]


def param_shapes(config: GPT2Config):
    """The parameter tree as jax.ShapeDtypeStruct leaves (no memory allocated)."""
    return nn.unbox(_boxed_shapes(config))


def param_axes(config: GPT2Config):
    """The parameter tree with a PartitionSpec of logical axis names per leaf."""
    return nn.get_partition_spec(_boxed_shapes(config))


def forward(config: GPT2Config, params, tokens: Array) -> Array:
    """Teacher-forced logits float32 [B, T, V]."""
    return GPT2(config).apply({"params": params}, jnp.asarray(tokens, jnp.int32))


def init_cache(config: GPT2Config, batch: int, length: int) -> List[Dict[str, Array]]:
    """An empty cache: per layer keys and values [B, length, H, D] in the activation dtype."""
    shape = (batch, length, config.n_head, config.head_dim)
    return [{"k": jnp.zeros(shape, config.jnp_dtype), "v": jnp.zeros(shape, config.jnp_dtype)}
            for _ in range(config.n_layer)]


def decode(config: GPT2Config, params, cache, tokens: Array, pos: Array, tree=None,
           beside_cache: bool = False):
    """The step protocol: logits [B, K, V], cache = decode(..., cache, tokens [B, K], pos [B])."""
    return GPT2(config).apply({"params": params}, cache, tokens, pos, tree, beside_cache,
                              method=GPT2.decode_step)


HF_NAMES = {"ln_1": "ln_1", "ln_2": "ln_2", "attn_c_attn": "attn.c_attn",
            "attn_c_proj": "attn.c_proj", "mlp_c_fc": "mlp.c_fc", "mlp_c_proj": "mlp.c_proj"}
_HF_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias"}


def hf_name(path: str) -> str:
    """Our parameter path -> its Hugging Face GPT-2 name, without the 'transformer.' prefix
    ('h_0/attn_c_attn/kernel' -> 'h.0.attn.c_attn.weight'). No transpose: HF's Conv1D
    stores [in, out], as our kernels do. The one map the loader and the exporter share."""
    parts = path.split("/")
    if path in ("wte", "wpe"):
        return f"{path}.weight"
    if len(parts) == 2 and parts[0] == "ln_f" and parts[1] in _HF_LEAF:
        return f"ln_f.{_HF_LEAF[parts[1]]}"
    m = re.fullmatch(r"h_(\d+)", parts[0])
    if not m or len(parts) != 3 or parts[1] not in HF_NAMES or parts[2] not in _HF_LEAF:
        raise KeyError(path)
    return f"h.{m.group(1)}.{HF_NAMES[parts[1]]}.{_HF_LEAF[parts[2]]}"


def params_from_hf(tensors: Mapping[str, Any], config: GPT2Config):
    """Our parameter tree from a Hugging Face GPT-2 state dict (numpy arrays; with or
    without the 'transformer.' prefix; lm_head tied, so ignored). A missing tensor or a
    wrong shape is a ValueError naming it. (Checkpoint directories: `load_checkpoint`.)"""
    shapes = traverse_util.flatten_dict(param_shapes(config), sep="/")
    flat = {}
    for path in sorted(shapes, key=lambda k: ({"wte": 0, "wpe": 1}.get(k, 2), k)):  # wte, wpe first
        name, shape = hf_name(path), tuple(shapes[path].shape)
        key = next((k for k in (f"transformer.{name}", name) if k in tensors), None)
        if key is None:
            raise ValueError(f"GPT-2 state dict is missing {name!r}")
        if tuple(tensors[key].shape) != shape:
            raise ValueError(f"{key}: shape {tuple(tensors[key].shape)}, expected {shape}")
        flat[tuple(path.split("/"))] = jnp.asarray(tensors[key], config.jnp_param_dtype)
    return traverse_util.unflatten_dict(flat)


def prefill(config: GPT2Config, params, prompts: Array, lengths: Array, length: int):
    """A decode's cache: every row's prompt (right-padded prompts [B, S], lengths [B] >= 1)
    but its last token written at positions 0.., room for `length` more positions, and the
    row's offset (lengths - 1): the decode loop feeds the last prompt token at its position
    0, which is offset + 0 here (`step` adds it)."""
    B, S = prompts.shape
    layers = init_cache(config, B, S + length)
    if S > 1:  # pads after a shorter prompt are overwritten by the row's own tokens later
        _, layers = decode(config, params, layers, prompts[:, :S - 1], jnp.zeros((B,), jnp.int32))
    return {"layers": layers, "offset": (lengths - 1).astype(jnp.int32)}


def cache_axes(cache) -> Dict[str, Any]:
    """Logical axis names of every array in a `prefill` cache (the same tree): rows over
    'data', heads over 'model'."""
    kv = ("batch", "length", "heads", "kv")
    return {"layers": [{"k": kv, "v": kv} for _ in cache["layers"]], "offset": ("batch",)}


def step(config: GPT2Config, params, cache, tokens: Array, pos: Array, tree=None,
         beside_cache: bool = False):
    """The loops' step on a `prefill` cache: loop position pos is offset + pos here."""
    logits, layers = decode(config, params, cache["layers"], tokens, pos + cache["offset"], tree,
                            beside_cache)
    return logits, dict(cache, layers=layers)


def cache_bytes(config: GPT2Config, batch: int, positions: int) -> int:
    return config.n_layer * 2 * batch * positions * config.n_embd * config.jnp_dtype.itemsize
