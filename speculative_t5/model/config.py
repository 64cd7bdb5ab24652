"""T5 architecture hyper-parameters, named as T5X's `network.T5Config` names them.

One frozen dataclass covers T5 1.0 (ReLU MLP, output layer tied to the embedding with
logits scaled by emb_dim**-0.5) and T5 1.1 (gated-GELU MLP, untied `logits_dense`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Tuple

import gin
import jax.numpy as jnp

_ACTIVATIONS = ("relu", "gelu", "silu", "linear")

# (emb_dim, num_heads, head_dim, num_encoder_layers, num_decoder_layers, mlp_dim)
_T5_1_1 = {
    "tiny": (128, 4, 32, 2, 2, 256),  # not a public checkpoint: a fast test shape
    "small": (512, 6, 64, 8, 8, 1024),
    "base": (768, 12, 64, 12, 12, 2048),
    "large": (1024, 16, 64, 24, 24, 2816),
    "xl": (2048, 32, 64, 24, 24, 5120),
    "xxl": (4096, 64, 64, 24, 24, 10240),
}
_T5_1_0 = {
    "small": (512, 8, 64, 6, 6, 2048),
    "base": (768, 12, 64, 12, 12, 3072),
    "large": (1024, 16, 64, 24, 24, 4096),
    "3b": (1024, 32, 128, 24, 24, 16384),
    "11b": (1024, 128, 128, 24, 24, 65536),
}


# Sane upper limits, far above every published T5 (XXL: 24 layers, d_ff 10240; mT5: 250112
# pieces), so that hostile or broken metadata fails at once instead of allocating for minutes.
LIMITS = {"vocab_size": 1 << 21, "emb_dim": 1 << 16, "num_heads": 1024, "head_dim": 4096,
          "mlp_dim": 1 << 18, "num_encoder_layers": 128, "num_decoder_layers": 128,
          "relative_attention_num_buckets": 4096, "relative_attention_max_distance": 1 << 20}
_MISSING = object()


def _hf_int(hf: Mapping[str, Any], name: str, default: Any = _MISSING) -> int:
    """An int field of a config.json (None or absent: `default`), or a ValueError naming it."""
    value = hf.get(name)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"config.json is missing the field {name!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config.json field {name!r} must be one int, got {value!r}")
    return value


class ConfigBase:
    """What every family's frozen config dataclass shares: its dtypes as jnp dtypes, and
    `replace` (a changed copy; configs are hashable static jit arguments)."""

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class T5Config(ConfigBase):
    """Shape and numerics of one T5 model (hashable: it is a static jit argument)."""

    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 6
    head_dim: int = 64
    mlp_dim: int = 1024
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    mlp_activations: Tuple[str, ...] = ("gelu", "linear")
    logits_via_embedding: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"        # activations; logits and softmax are always float32
    param_dtype: str = "float32"  # weights as stored in memory
    pad_id: int = 0
    eos_id: int = 1
    dropout_rate: float = 0.0     # training only (`T5.__call__(enable_dropout=True)`), as T5X's

    def __post_init__(self):
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        for name, most in LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"T5Config.{name} must be a positive int, got {value!r}")
            if value > most:
                raise ValueError(f"T5Config.{name} is {value}, more than the sane limit {most}")
        for name in ("pad_id", "eos_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not 0 <= value < self.vocab_size:
                raise ValueError(f"T5Config.{name} must be an int in [0, vocab_size "
                                 f"{self.vocab_size}), got {value!r}")
        if self.relative_attention_num_buckets % 2:
            raise ValueError("T5Config.relative_attention_num_buckets must be even, got "
                             f"{self.relative_attention_num_buckets}")
        if not self.mlp_activations or any(a not in _ACTIVATIONS for a in self.mlp_activations):
            raise ValueError(f"T5Config.mlp_activations must be non-empty, each one of "
                             f"{_ACTIVATIONS}; got {self.mlp_activations!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"T5Config.{name} must be float32, bfloat16 or float16, "
                                 f"got {getattr(self, name)!r}")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"T5Config.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon}")
        rate = self.dropout_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"T5Config.dropout_rate must be a number in [0, 1), got {rate!r}")

    # -- presets ---------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "T5Config":
        """`t5_1_1_{tiny,small,base,large,xl,xxl}` or `t5_{small,base,large,3b,11b}`."""
        if name.startswith("t5_1_1_") and name[7:] in _T5_1_1:
            emb, heads, hd, enc, dec, mlp = _T5_1_1[name[7:]]
            base = dict(mlp_activations=("gelu", "linear"), logits_via_embedding=False)
        elif name.startswith("t5_") and name[3:] in _T5_1_0:
            emb, heads, hd, enc, dec, mlp = _T5_1_0[name[3:]]
            base = dict(mlp_activations=("relu",), logits_via_embedding=True)
        else:
            raise ValueError(f"unknown T5 preset {name!r}; known: {', '.join(preset_names())}")
        kwargs = dict(vocab_size=32128, emb_dim=emb, num_heads=heads, head_dim=hd,
                      num_encoder_layers=enc, num_decoder_layers=dec, mlp_dim=mlp, **base)
        kwargs.update(overrides)
        return cls(**kwargs)

    @property
    def is_gated(self) -> bool:
        return len(self.mlp_activations) > 1

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mlp_activations"] = list(self.mlp_activations)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "T5Config":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown T5Config fields: {unknown}")
        return cls(**d)

    # -- Hugging Face config.json ----------------------------------------------------
    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], **overrides: Any) -> "T5Config":
        """Read a transformers `T5Config` (object or config.json dict)."""
        if not isinstance(hf, Mapping):
            hf = hf.to_dict()
        if hf.get("model_type", "t5") != "t5":
            raise ValueError(f"config.json has model_type {hf.get('model_type')!r}, expected 't5'")
        proj = hf.get("feed_forward_proj", "relu")
        try:
            if not isinstance(proj, str):
                raise KeyError(proj)
            parts = proj.split("-")
            if len(parts) == 2 and parts[0] == "gated":
                act = {"gelu": "gelu", "gelu_new": "gelu", "relu": "relu", "silu": "silu"}[parts[1]]
                activations = (act, "linear")
            elif len(parts) == 1:
                activations = ({"relu": "relu", "gelu_new": "gelu", "silu": "silu"}[parts[0]],)
            else:
                raise KeyError(proj)
        except KeyError:
            raise ValueError(f"config.json feed_forward_proj {hf.get('feed_forward_proj')!r} "
                             "is not supported (relu, gated-gelu, gated-relu, gated-silu)") from None
        # transformers >= 5 writes `scale_decoder_outputs`; older configs say
        # `tie_word_embeddings` (absent = tied = T5 1.0).
        scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
        if not isinstance(scaled, bool):
            raise ValueError(f"config.json scale_decoder_outputs / tie_word_embeddings must be "
                             f"true or false, got {scaled!r}")
        kwargs = dict(
            vocab_size=_hf_int(hf, "vocab_size"), emb_dim=_hf_int(hf, "d_model"),
            num_heads=_hf_int(hf, "num_heads"), head_dim=_hf_int(hf, "d_kv"),
            mlp_dim=_hf_int(hf, "d_ff"), num_encoder_layers=_hf_int(hf, "num_layers"),
            mlp_activations=activations, logits_via_embedding=scaled,
            relative_attention_num_buckets=_hf_int(hf, "relative_attention_num_buckets", 32),
            relative_attention_max_distance=_hf_int(hf, "relative_attention_max_distance", 128),
            layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
            pad_id=_hf_int(hf, "pad_token_id", 0), eos_id=_hf_int(hf, "eos_token_id", 1),
            dropout_rate=0.0 if hf.get("dropout_rate") is None else hf["dropout_rate"])
        kwargs["num_decoder_layers"] = _hf_int(hf, "num_decoder_layers", kwargs["num_encoder_layers"])
        eps = kwargs["layer_norm_epsilon"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"config.json layer_norm_epsilon must be a number in (0, 1), got {eps!r}")
        kwargs["layer_norm_epsilon"] = float(eps)
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except ValueError as e:  # name the file's field, not ours
            raise ValueError(f"config.json: {e}") from None

    def to_hf_config(self) -> dict:
        """A config.json dict that transformers' T5ForConditionalGeneration reads."""
        if self.mlp_activations[-1:] == ("linear",) and self.is_gated:
            proj = "gated-" + self.mlp_activations[0]
        elif not self.is_gated and self.mlp_activations[0] in ("relu", "gelu", "silu"):
            proj = {"gelu": "gelu_new"}.get(self.mlp_activations[0], self.mlp_activations[0])
        else:
            raise ValueError(f"mlp_activations {self.mlp_activations} have no transformers equivalent")
        return {
            "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            "vocab_size": self.vocab_size, "d_model": self.emb_dim, "d_kv": self.head_dim,
            "d_ff": self.mlp_dim, "num_layers": self.num_encoder_layers,
            "num_decoder_layers": self.num_decoder_layers, "num_heads": self.num_heads,
            "relative_attention_num_buckets": self.relative_attention_num_buckets,
            "relative_attention_max_distance": self.relative_attention_max_distance,
            "layer_norm_epsilon": self.layer_norm_epsilon, "feed_forward_proj": proj,
            "tie_word_embeddings": self.logits_via_embedding,
            "scale_decoder_outputs": self.logits_via_embedding,
            "dropout_rate": self.dropout_rate, "pad_token_id": self.pad_id, "eos_token_id": self.eos_id,
            "decoder_start_token_id": self.pad_id, "is_encoder_decoder": True,
            "dtype": self.param_dtype,
        }


def preset_names() -> Tuple[str, ...]:
    return tuple([f"t5_1_1_{k}" for k in _T5_1_1] + [f"t5_{k}" for k in _T5_1_0])


@gin.configurable("T5Config")
def gin_t5_config(preset: str = "", **fields: Any) -> T5Config:
    """`T5Config` as gin sees it: `T5Config.emb_dim = 768`, or `T5Config.preset = 't5_1_1_base'`."""
    return T5Config.preset(preset, **fields) if preset else T5Config(**fields)
