"""`plan`: bytes per device and HBM roofline times of a (speculative) T5 or GPT-2 decode on
a mesh, answered before anything is allocated.

Every size comes from `jax.eval_shape` (parameters: `model.api.param_shapes`; caches: an
`init_cache` (T5) or `prefill_cache` (GPT-2, prompts of input_length tokens) traced on
ShapeDtypeStructs) and the model's logical axis names
(`param_axes`, `cache_axes`), divided the way T5X's logical axis rules place them on a
('data', 'model') mesh of data = num_devices / num_partitions by model = num_partitions.
The mesh is numbers only: no `jax.sharding.Mesh`, no devices.

Roofline (memory-bound decoding, the paper's regime): one decoder step reads the decoder's
weights (minus T5's cross-attention key/value kernels, whose outputs are cached, and
GPT-2's position table, of which it reads a row), the whole static self-attention cache
and T5's cross-attention keys/values, once, whatever its K; so
a verify pass over gamma+1 tokens costs one step (v = 1) and a round costs gamma draft
steps + one target step. c = draft step / target step, and eq. (5) gives the speedup bound.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
from flax import traverse_util

from speculative_t5.engine import cache_positions
from speculative_t5.measure.analysis import (best_gamma, expected_tokens_per_call,
                                             walltime_improvement)
from speculative_t5.model import api, gpt2
from speculative_t5.model.api import ModelConfig
from speculative_t5.model.config import T5Config, preset_names
from speculative_t5.model.gpt2 import GPT2Config
from speculative_t5.partitioning import DRAFT_MODES, STANDARD_RULES

GiB = 1 << 30
Rules = Sequence[Tuple[str, Optional[str]]]


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: int        # memory per chip
    hbm_label: str        # as the vendor states it
    bandwidth: float      # HBM bytes per second
    flops: float          # peak bf16 flops per second (dense)


CHIPS: Dict[str, Chip] = {
    "v4": Chip("TPU v4", 32 * GiB, "32 GiB", 1.2e12, 275e12),
    "v5e": Chip("TPU v5e", 16 * GiB, "16 GiB", 819e9, 197e12),
    "v5p": Chip("TPU v5p", 95 * GiB, "95 GiB", 2.765e12, 459e12),
    "h100": Chip("H100", 80 * 10**9, "80 GB", 3.35e12, 989e12),
    "h200": Chip("H200", 141 * 10**9, "141 GB", 4.8e12, 989e12),
}


# -- configs: a preset name or a checkpoint directory, config only -------------------------
def read_config(name_or_path: str) -> ModelConfig:
    """A `T5Config.preset` or `GPT2Config.preset` name, or a checkpoint directory's config
    alone (Hugging Face config.json, native speculative_t5.json, T5X: inferred from the
    declared tensor shapes); no weights are read."""
    from speculative_t5.checkpoints import CheckpointError, hf, native, t5x
    from speculative_t5.checkpoints.common import orbax_shapes
    if name_or_path in preset_names():
        return T5Config.preset(name_or_path)
    if name_or_path in gpt2.preset_names():
        return GPT2Config.preset(name_or_path)
    path = os.fspath(name_or_path)
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is neither a preset (T5: {', '.join(preset_names())}; "
                         f"GPT-2: {', '.join(gpt2.preset_names())}) nor a checkpoint directory")
    files = set(os.listdir(path))
    config = (hf.read_hf_config(path)[0] if "config.json" in files
              else native.read_native_config(path) if native.MARKER in files else None)
    if config is not None:
        return config
    state = os.path.join(path, "state")
    orbax = bool(files & set(t5x.ORBAX_MARKERS)) or (
        os.path.isdir(state) and bool(set(os.listdir(state)) & set(t5x.ORBAX_MARKERS)))
    if t5x.LEGACY_FILE not in files and not orbax:
        step = t5x.latest_step_dir(path)
        if step is None:
            raise CheckpointError(f"{path}: no config.json, {native.MARKER}, T5X checkpoint "
                                  "or checkpoint_<step>/ directory to read a config from")
        return read_config(step)
    if t5x.LEGACY_FILE in files:  # tensorstore arrays are opened for their metadata only
        return t5x._infer(t5x.read_legacy(path), path)
    declared = orbax_shapes(state if os.path.isdir(state) else path)
    for key in ("target", "params"):
        inner = {k[len(key) + 1:]: v for k, v in declared.items() if k.startswith(key + "/")}
        if inner:
            declared = inner
            break
    return t5x._infer(declared, path)


# -- logical axes -> bytes per device --------------------------------------------------------
def mesh_shape(num_partitions: int, num_devices: Optional[int] = None) -> Dict[str, int]:
    """{'data': num_devices / num_partitions, 'model': num_partitions}, checked."""
    for name, value in (("num_partitions", num_partitions), ("num_devices", num_devices)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    num_devices = num_partitions if num_devices is None else num_devices
    if num_devices % num_partitions:
        raise ValueError(f"num_partitions {num_partitions} does not divide num_devices "
                         f"{num_devices}: the mesh is (num_devices / num_partitions) x "
                         "num_partitions")
    return {"data": num_devices // num_partitions, "model": num_partitions}


def mesh_axes(logical_axes: Optional[Sequence[Optional[str]]], rules: Rules) -> Tuple:
    """One array's logical axis names -> its mesh axis per dimension (what
    `Partitioner.spec` computes, without a Mesh)."""
    if logical_axes is None:
        return ()
    return tuple(nn.logical_to_mesh_axes(tuple(logical_axes), rules))


def _ways(axis, mesh: Dict[str, int]) -> int:
    """How many devices one dimension is split over (an axis name, a tuple of them, None)."""
    if axis is None:
        return 1
    return math.prod(mesh[a] for a in ((axis,) if isinstance(axis, str) else axis))


def array_bytes(shape, dtype, logical_axes, mesh: Dict[str, int], rules: Rules,
                where: str, strict: bool = True) -> int:
    """Bytes of one device's shard. A split dimension the mesh does not divide is a
    ValueError naming both numbers, or (strict=False) is counted whole (replicated)."""
    axes = mesh_axes(logical_axes, rules)
    local = []
    for i, size in enumerate(shape):
        axis = axes[i] if i < len(axes) else None
        ways = _ways(axis, mesh)
        if size % ways:
            if strict:
                raise ValueError(f"{where}: its '{logical_axes[i]}' dimension ({size}) is not "
                                 f"divisible by the mesh's '{axis}' axis ({ways} devices)")
            ways = 1
        local.append(size // ways)
    return math.prod(local) * jnp.dtype(dtype).itemsize


def _is_axes(a) -> bool:
    return isinstance(a, tuple) and all(n is None or isinstance(n, str) for n in a)


@functools.lru_cache(maxsize=16)
def _boxed(config: ModelConfig):
    """One trace for both `api.param_shapes` and `api.param_axes`."""
    if isinstance(config, GPT2Config):
        return gpt2._boxed_shapes(config)
    return api._boxed_shapes(config)


def _param_shapes(config: ModelConfig):
    return nn.unbox(_boxed(config))


@functools.lru_cache(maxsize=16)
def _shapes_and_axes(config: ModelConfig):
    """Flat {'encoder/layers_0/...': ShapeDtypeStruct} and {...: logical axes}."""
    flat = lambda tree: traverse_util.flatten_dict(tree, sep="/")  # noqa: E731
    return flat(_param_shapes(config)), flat(nn.get_partition_spec(_boxed(config)))


@functools.lru_cache(maxsize=16)
def _cache_shapes(config: ModelConfig, batch: int, input_length: int, length: int):
    """A decode's cache as ShapeDtypeStructs, nothing run: T5's `init_cache` (the encoder
    traced), GPT-2's `prefill_cache` of input_length-token prompts."""
    model = api.Model(config, _param_shapes(config))
    ids = jax.ShapeDtypeStruct((batch, input_length), jnp.int32)
    if isinstance(config, GPT2Config):
        lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
        return jax.eval_shape(lambda m, i, n: api.prefill_cache(m, i, n, length), model, ids,
                              lengths)
    return jax.eval_shape(lambda m, i: api.init_cache(m, i, length), model, ids)


# a cache's parts: T5's self-attention, cross-attention K/V, encoder output and mask; GPT-2's
# per-layer keys/values ('layers', its self-attention) and the rows' prompt offsets
CACHE_PARTS = {"t5": {"self": "self", "cross": "cross", "encoded": "encoded",
                      "encoder_mask": "encoder_mask"},
               "gpt2": {"self": "layers", "offset": "offset"}}


def _step_reads(config: ModelConfig, key: str) -> bool:
    """Whether one decoder step reads the parameter `key` whole."""
    if isinstance(config, GPT2Config):
        return key != "wpe"                  # every weight, wte for the tied logits
    return (key.startswith("decoder/") and "encoder_decoder_attention/key" not in key
            and "encoder_decoder_attention/value" not in key) or (
            key == "token_embedder/embedding" and config.logits_via_embedding)


def param_bytes(config: ModelConfig, mesh: Dict[str, int], rules: Rules, role: str,
                replicated: bool = False) -> Dict[str, int]:
    """{'total', 'step'}: one device's bytes of every parameter, and of those one decoder
    step reads (T5: decoder kernels except the cross-attention keys/values, the tied
    embedding for T5 1.0, an untied one's few looked-up rows left out; GPT-2: all but the
    position table)."""
    shapes, axes = _shapes_and_axes(config)
    total = step = 0
    for key, leaf in shapes.items():
        spec = None if replicated else axes[key]
        n = array_bytes(leaf.shape, leaf.dtype, spec, mesh, rules, f"{role} parameter {key}")
        total += n
        step += n if _step_reads(config, key) else 0
    return {"total": total, "step": step}


def cache_bytes(config: ModelConfig, batch: int, input_length: int, length: int,
                mesh: Dict[str, int], rules: Rules, role: str,
                strict: bool = True) -> Dict[str, int]:
    """One device's bytes of a decode's cache, per part (`CACHE_PARTS`: T5 'self', 'cross',
    'encoded', 'encoder_mask'; GPT-2 'self', 'offset') and 'total', from `jax.eval_shape`
    and `cache_axes`."""
    cache = _cache_shapes(config, batch, input_length, length)
    axes = api.cache_axes(cache)
    if not strict:  # a replicated draft's cache: rows split over 'data' only (as generate has it)
        axes = jax.tree_util.tree_map(lambda a: tuple(n if n == "batch" else None for n in a),
                                      axes, is_leaf=_is_axes)
    out = {}
    for part, key in CACHE_PARTS[api.family(config)].items():
        sizes = jax.tree_util.tree_map(
            lambda a, x: array_bytes(x.shape, x.dtype, a, mesh, rules, f"{role} cache '{part}'",
                                     strict), axes[key], cache[key], is_leaf=_is_axes)
        out[part] = sum(jax.tree_util.tree_leaves(sizes))
    out["total"] = sum(out.values())
    return out


def _shape(config: ModelConfig) -> Tuple[int, int, int]:
    """(heads, MLP width, MLP branches): T5's gated MLP has two, GPT-2's one of 4 n_embd."""
    if isinstance(config, GPT2Config):
        return config.n_head, 4 * config.n_embd, 1
    return config.num_heads, config.mlp_dim, len(config.mlp_activations)


def activation_bytes(config: ModelConfig, b: int, input_length: int, heads_ways: int,
                     mlp_ways: int) -> Dict[str, int]:
    """The largest arrays one device holds while the input is read (T5's encoder, GPT-2's
    prefill; b rows per device): the attention bias, scores and softmax weights
    [b, H, S, S] and the MLP's hidden [b, S, mlp] per branch."""
    heads, mlp, branches = _shape(config)
    h, S = heads // heads_ways, input_length
    act = jnp.dtype(config.dtype).itemsize
    square = b * h * S * S
    return {"attention": square * (4 + 4 + act),          # bias f32 + scores f32 + weights
            "mlp": square * 4 + b * S * (mlp // mlp_ways) * act * branches}


# -- the plan ----------------------------------------------------------------------------------
def _check_int(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    return value


def _check_divisible(config: ModelConfig, role: str, num_partitions: int) -> None:
    heads, mlp, _ = _shape(config)
    sizes = ((("n_head", heads), ("vocab_size", config.vocab_size), ("MLP width 4 n_embd", mlp),
              ("joined_kv (n_embd)", config.n_embd)) if isinstance(config, GPT2Config) else
             (("num_heads", heads), ("vocab_size", config.vocab_size), ("mlp_dim", mlp),
              ("joined_kv (num_heads * head_dim)", config.num_heads * config.head_dim)))
    for name, size in sizes:
        if size % num_partitions:
            raise ValueError(f"{role} {name} {size} is not divisible by num_partitions "
                             f"{num_partitions}; choose num_partitions dividing {size}")


def _model_plan(config: ModelConfig, mesh, rules, batch, input_length, length, replicated,
                role):
    params = param_bytes(config, mesh, rules, role, replicated)
    cache = cache_bytes(config, batch, input_length, length, mesh, rules, role,
                        strict=not replicated)
    heads_ways = 1 if replicated or _shape(config)[0] % mesh["model"] else mesh["model"]
    mlp_ways = 1 if replicated else mesh["model"]
    acts = activation_bytes(config, batch // mesh["data"], input_length, heads_ways, mlp_ways)
    return {"family": api.family(config),
            "num_params": sum(int(x.size) for x in _shapes_and_axes(config)[0].values()),
            "param_dtype": config.param_dtype, "activation_dtype": config.dtype,
            "partitioning": "replicated" if replicated else "partitioned",
            "param_bytes": params["total"], "step_weight_bytes": params["step"],
            "cache_bytes": cache,
            "step_bytes": params["step"] + cache["self"] + cache.get("cross", 0),
            "encoder_activation_bytes": acts}


def plan(target_config: ModelConfig, draft_config: Optional[ModelConfig] = None,
         num_partitions: int = 1, num_devices: Optional[int] = None, batch: int = 1,
         input_length: int = 512, max_decode_len: int = 128, gamma: int = 4,
         draft_partitioning: str = "replicated", alpha: float = 0.7,
         rules: Rules = STANDARD_RULES) -> Dict[str, Any]:
    """Bytes per device (parameters, caches, largest activations), whether they fit each
    chip in `CHIPS`, and HBM roofline times per step and per speculative round. Nothing is
    allocated. Caches hold max_decode_len positions, with a draft rounded up to a multiple
    of 16 (a GPT-2's with its prompt's input_length), as `generate` sizes them
    (`cache_positions`). A
    replicated draft's cache is split over 'data' only, as `generate` places it. A batch
    that 'data' does not divide is padded up, as `generate` pads it (copies of the last
    row). Target and draft are one family (a GPT-2 target, a GPT-2 draft)."""
    mesh = mesh_shape(num_partitions, num_devices)
    for name, value in (("batch", batch), ("input_length", input_length),
                        ("max_decode_len", max_decode_len), ("gamma", gamma)):
        _check_int(name, value, 1)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if draft_partitioning not in DRAFT_MODES:
        raise ValueError(f"draft_partitioning must be one of {DRAFT_MODES}, got "
                         f"{draft_partitioning!r}")
    batch += -batch % mesh["data"]
    if draft_config is not None and api.family(draft_config) != api.family(target_config):
        raise ValueError(f"the draft is a {api.family(draft_config)} and the target a "
                         f"{api.family(target_config)}: they must be one family")
    if draft_config is not None and draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"draft vocab_size {draft_config.vocab_size} != target vocab_size "
                         f"{target_config.vocab_size}")
    _check_divisible(target_config, "target", num_partitions)
    draft_replicated = draft_partitioning == "replicated"
    if draft_config is not None and not draft_replicated:
        _check_divisible(draft_config, "draft", num_partitions)

    prompt = input_length if isinstance(target_config, GPT2Config) else 0
    length = (cache_positions(max_decode_len, prompt)
              if draft_config is not None else max_decode_len)
    for config in (target_config, draft_config):
        if isinstance(config, GPT2Config) and input_length + max_decode_len > config.n_positions:
            raise ValueError(f"a prompt of input_length {input_length} tokens + max_decode_len "
                             f"{max_decode_len} exceeds the GPT-2's {config.n_positions} positions")
    positions = length + (input_length if isinstance(target_config, GPT2Config) else 0)
    target = _model_plan(target_config, mesh, rules, batch, input_length, length, False, "target")
    draft = None if draft_config is None else _model_plan(
        draft_config, mesh, rules, batch, input_length, length, draft_replicated, "draft")

    b, V = batch // mesh["data"], target_config.vocab_size
    reads = "prefill" if isinstance(target_config, GPT2Config) else "encoder"
    phases = {f"target {reads}": max(target["encoder_activation_bytes"].values())}
    if draft is None:
        phases["decode logits [B, 1, V] f32 + distribution"] = 2 * b * V * 4
    else:
        phases[f"draft {reads}"] = max(draft["encoder_activation_bytes"].values())
        phases["verify logits + p [B, gamma+1, V] f32, q [B, gamma, V] f32"] = \
            b * V * 4 * (2 * (gamma + 1) + gamma)
    peak = max(phases, key=phases.get)
    parts = {"target_params": target["param_bytes"],
             "draft_params": 0 if draft is None else draft["param_bytes"],
             "target_cache": target["cache_bytes"]["total"],
             "draft_cache": 0 if draft is None else draft["cache_bytes"]["total"],
             "activations": phases[peak]}
    total = sum(parts.values())

    if draft is not None:
        c = draft["step_bytes"] / target["step_bytes"]
        tokens = expected_tokens_per_call(alpha, gamma)
        g_best = best_gamma(alpha, c, 1.0)
        speedup = {"alpha": alpha, "c": c, "v": 1.0, "gamma": gamma,
                   "tokens_per_round": tokens, "speedup": walltime_improvement(alpha, gamma, c),
                   "best_gamma": g_best,
                   "best_gamma_speedup": walltime_improvement(alpha, g_best, c)}
    else:
        speedup = None
    chips = {}
    for key, chip in CHIPS.items():
        t_ms = 1e3 * target["step_bytes"] / chip.bandwidth
        row = {"name": chip.name, "hbm_bytes": chip.hbm_bytes, "bandwidth": chip.bandwidth,
               "fits": total <= chip.hbm_bytes, "headroom_bytes": chip.hbm_bytes - total,
               "target_step_ms": t_ms, "plain_ms_per_token": t_ms}
        if draft is not None:
            d_ms = 1e3 * draft["step_bytes"] / chip.bandwidth
            round_ms = gamma * d_ms + t_ms
            row.update(draft_step_ms=d_ms, round_ms=round_ms,
                       speculative_ms_per_token=round_ms / speedup["tokens_per_round"])
        chips[key] = row
    return {"mesh": {"num_devices": mesh["data"] * mesh["model"], **mesh},
            "batch": batch, "rows_per_device": b, "input_length": input_length,
            "max_decode_len": max_decode_len, "gamma": gamma, "cache_length": positions,
            "draft_partitioning": None if draft is None else draft_partitioning,
            "target": target, "draft": draft,
            "bytes_per_device": {**parts, "total": total},
            "activation_phases": phases, "activation_peak": peak,
            "speedup_bound": speedup, "chips": chips}


# -- output ------------------------------------------------------------------------------------
def _gib(n: int) -> str:
    return f"{n / GiB:9.3f}"


def format_plan(result: Dict[str, Any], chip: Optional[str] = None,
                names: Tuple[str, str] = ("target", "draft")) -> str:
    """The plan as an aligned plain-text table; `chip` (a key of CHIPS) is marked."""
    r, lines = result, []
    t, d, m = r["target"], r["draft"], r["mesh"]

    def model_line(role, name, x):
        return (f"{role}: {name}: {x['num_params']:,} parameters, {x['param_dtype']} weights, "
                f"{x['activation_dtype']} activations, {x['partitioning']}")
    lines.append(model_line("target", names[0], t))
    if d is not None:
        lines.append(model_line("draft ", names[1], d))
    cache_note = (f"max_decode_len {r['max_decode_len']} + gamma {r['gamma']} + 1"
                  if d is not None else f"max_decode_len {r['max_decode_len']}")
    if t.get("family") == "gpt2":
        cache_note = f"the prompt's {r['input_length']} + " + cache_note
    if d is not None:
        cache_note += ", rounded up to a multiple of 16"
    lines.append(f"mesh: {m['num_devices']} devices = data {m['data']} x model {m['model']}; "
                 f"batch {r['batch']} ({r['rows_per_device']} rows per device), input "
                 f"{r['input_length']}, cache {r['cache_length']} positions ({cache_note})")

    def cache_detail(x):
        cb = x["cache_bytes"]
        if "cross" not in cb:  # a GPT-2: its per-layer keys/values only
            return f"self {cb['self'] / GiB:.3f}"
        return (f"self {cb['self'] / GiB:.3f} + cross K/V {cb['cross'] / GiB:.3f} "
                f"+ encoded {cb['encoded'] / GiB:.3f}")
    bp = r["bytes_per_device"]
    rows = [("target parameters", bp["target_params"]),
            (f"target cache ({cache_detail(t)})", bp["target_cache"])]
    if d is not None:
        rows += [(f"draft parameters ({d['partitioning']})", bp["draft_params"]),
                 (f"draft cache ({cache_detail(d)})", bp["draft_cache"])]
    rows += [(f"activations, peak: {r['activation_peak']}", bp["activations"]),
             ("total", bp["total"])]
    width = max(len(label) for label, _ in rows) + 2
    lines += ["", f"{'per device':<{width + 2}}{'GiB':>9}"]
    lines += [f"  {label:<{width}}{_gib(n)}" for label, n in rows]

    head = f"  {'chip':<9}{'HBM':>8}{'fits':>6}{'free GiB':>10}{'target step':>13}"
    if d is not None:
        head += f"{'draft step':>12}{'round':>10}{'ms/token plain':>16}{'spec':>8}"
    else:
        head += f"{'ms/token':>10}"
    lines += ["", "HBM roofline (ms; a step reads its decoder weights, self cache and cross K/V "
              "per device once)", head]
    for key, row in r["chips"].items():
        mark = "*" if key == chip else " "
        line = (f"{mark} {row['name']:<9}{CHIPS[key].hbm_label:>8}"
                f"{'yes' if row['fits'] else 'NO':>6}{row['headroom_bytes'] / GiB:>10.2f}"
                f"{row['target_step_ms']:>13.3f}")
        if d is not None:
            line += (f"{row['draft_step_ms']:>12.3f}{row['round_ms']:>10.3f}"
                     f"{row['plain_ms_per_token']:>16.3f}{row['speculative_ms_per_token']:>8.3f}")
        else:
            line += f"{row['plain_ms_per_token']:>10.3f}"
        lines.append(line)
    s = r["speedup_bound"]
    if s is not None:
        lines += ["", f"speedup bound, eq. (5) with c = draft step / target step = {s['c']:.4f}, "
                  f"v = 1: {s['speedup']:.2f}x at alpha {s['alpha']}, gamma {s['gamma']} "
                  f"({s['tokens_per_round']:.2f} tokens per round); best gamma "
                  f"{s['best_gamma']}: {s['best_gamma_speedup']:.2f}x"]
    return "\n".join(lines)


@gin.configurable("plan")
def plan_command(target: str = gin.REQUIRED, draft: Optional[str] = None,
                 num_partitions: int = 1, num_devices: Optional[int] = None, batch: int = 1,
                 input_length: int = 512, max_decode_len: int = 128, gamma: int = 4,
                 dtype: Optional[str] = None, activation_dtype: Optional[str] = None,
                 draft_partitioning: str = "replicated", alpha: float = 0.7,
                 chip: Optional[str] = None, as_json: bool = False) -> Dict[str, Any]:
    """`speculative-t5 plan`: print the plan (a table, or JSON with --json)."""
    if chip is not None and chip not in CHIPS:
        raise ValueError(f"chip must be one of {tuple(CHIPS)}, got {chip!r}")
    overrides = {k: v for k, v in (("param_dtype", dtype), ("dtype", activation_dtype)) if v}
    target_config = read_config(target).replace(**overrides)
    draft_config = None if draft is None else read_config(draft).replace(**overrides)
    result = plan(target_config, draft_config, num_partitions, num_devices, batch, input_length,
                  max_decode_len, gamma, draft_partitioning, alpha)
    if as_json:
        print(json.dumps({"target_name": target, "draft_name": draft, "chip": chip, **result},
                         indent=2))
    else:
        print(format_plan(result, chip, (target, draft or "")))
    return result
