"""`compile`: the decode's programs compiled for a TPU topology with no TPU attached, and what
the TPU compiler says of them: memory per device, flops and bytes per part, roofline times,
c and v, the predicted speedup.

Deviceless ahead-of-time compilation (FACTS.md): `libtpu` (the `tpu` extra) holds XLA's TPU
compiler; `jax.experimental.topologies` describes a slice's devices without opening them;
parameters are `jax.ShapeDtypeStruct`s carrying the partitioner's shardings, so nothing is
allocated and no weights are needed. The programs are the ones `st.generate` runs
(`engine._generate`: the whole plain and speculative decodes, one while loop each) and their
parts compiled alone: the set-up (encoders, cross-attention keys/values, caches; a GPT-2's
prefill), the target's one-token step, its verify pass over gamma + 1 tokens and the draft's
step, each step with its cache donated (updated in place, as in the loop).

Roofline: a part takes max(HBM bytes / HBM bandwidth, flops / peak flops) on one chip, the
HBM bytes read off the optimised HLO (`hlo`: XLA's own count adds on-chip copies);
c and v are ratios of those, and eq. (5) and the cost model (`costs.Costs`) turn them into a
predicted speedup. These are the compiler's figures, not walltime.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Dict, Optional, Tuple

import gin
import jax
import jax.numpy as jnp

from speculative_t5.decoding.trees import TreeNodes, TreeShape
from speculative_t5.engine import _generate, cache_positions
from speculative_t5.layouts import relaid
from speculative_t5.measure.analysis import expected_tokens_per_call, walltime_improvement
from speculative_t5.measure.costs import Costs
from speculative_t5.measure.hlo import hbm_bytes, loop_bytes
from speculative_t5.measure.plan import CHIPS, GiB, plan, read_config
from speculative_t5.model.api import Model, cache_axes, decode, param_shapes, start_cache
from speculative_t5.partitioning import Partitioner

LIBTPU_HINT = 'pip install "jax[tpu]=={jax}" (or speculative_t5[tpu])'


class LibtpuMissing(OSError):
    """The TPU compiler is not installed (an environment problem: one line, with the fix)."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice as `topologies.get_topology_desc` names it."""
    name: str                    # the Cloud TPU name: v4-8 = 8 TensorCores = 4 chips
    topology: str                # 'v4:2x2x1'
    chip: str                    # a key of plan.CHIPS
    chips_per_host_bounds: Tuple[int, int, int]
    megacore: bool               # v4/v5p: a chip's two cores are one device


TOPOLOGIES: Dict[str, Topology] = {t.name: t for t in (
    Topology("v4-2", "v4:1x1x1", "v4", (1, 1, 1), True),
    Topology("v4-8", "v4:2x2x1", "v4", (2, 2, 1), True),
    Topology("v4-16", "v4:2x2x2", "v4", (2, 2, 1), True),
    Topology("v4-32", "v4:2x2x4", "v4", (2, 2, 1), True),
    Topology("v5e-1", "v5e:1x1", "v5e", (1, 1, 1), False),
    Topology("v5e-8", "v5e:2x4", "v5e", (2, 4, 1), False),
    Topology("v5p-8", "v5p:2x2x1", "v5p", (2, 2, 1), True),
)}


def tpu_devices(name: str):
    """The devices of the named slice (one per chip), from libtpu with no TPU attached; a
    one-line error if libtpu is missing or the name unknown."""
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; one of {', '.join(TOPOLOGIES)}")
    t = TOPOLOGIES[name]
    try:
        import libtpu  # noqa: F401  (only to say clearly that it is missing)
    except ImportError:
        raise LibtpuMissing("compiling for a TPU needs libtpu, the TPU compiler: "
                           + LIBTPU_HINT.format(jax=jax.__version__)) from None
    # libtpu looks for a TPU VM's metadata unless told this host is one
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", t.name)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # with no TPU attached there is nothing to share: let compiles run side by side (libtpu
    # otherwise takes a lock file and refuses a second process)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    kwargs = dict(chip_config_name="megacore") if t.megacore else {}
    desc = topologies.get_topology_desc(
        topology_name=t.topology, platform="tpu", chips_per_host_bounds=t.chips_per_host_bounds,
        num_slices=1, **kwargs)
    return list(desc.devices)


# -- abstract inputs -------------------------------------------------------------------------
def abstract_model(config, partitioner: Partitioner, role: str) -> Model:
    """A Model whose parameters are ShapeDtypeStructs placed as `partitioner` places them:
    shards and, with `parameter_layouts='compiler'`, the layouts the compiler asks for."""
    shapes, shardings = param_shapes(config), partitioner.param_formats(config, role)
    params = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
    return Model(config, params)


def _rows(partitioner: Partitioner, shape, dtype, axes):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=partitioner.sharding(axes))


# -- the programs ----------------------------------------------------------------------------
def _compile(name: str, lowered):
    """lowered.compile(); the TPU compiler's out-of-memory as one line naming the program."""
    try:
        return lowered.compile()
    except Exception as e:  # XlaRuntimeError: its type moves between jax versions
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        first = next((l for l in str(e).splitlines() if "RESOURCE_EXHAUSTED" in l), str(e))
        raise ValueError(f"{name} does not fit the device: {first.strip()[:300]}") from None


def compile_parts(target: Model, draft: Optional[Model], partitioner: Partitioner, batch: int,
                  input_length: int, max_decode_len: int, gamma: int,
                  whole: bool = True, tree: Optional[TreeShape] = None) -> Dict[str, Any]:
    """{name: jax.stages.Compiled}: 'setup', 'target_step', 'verify', 'draft_step', with a
    tree 'tree_verify' (the target over the tree's nodes, tree attention), and (whole)
    'plain_decode', 'speculative_decode'. Batch is already a multiple of the 'data' axis."""
    p, B, S = partitioner, batch, input_length
    decoder_only = target.decoder_only
    length = (cache_positions(max_decode_len, S if decoder_only else 0) if draft is not None
              else max_decode_len)
    ids = _rows(p, (B, S), jnp.int32, ("batch", "length"))
    lengths = _rows(p, (B,), jnp.int32, ("batch",)) if decoder_only else None
    out: Dict[str, Any] = {}

    def constrained_setup(model, ids, lengths, role):
        cache = start_cache(model, ids, lengths, length)
        return p.constrain(cache, cache_axes(cache), role)

    def setup(t, d, ids, lengths):
        return (constrained_setup(t, ids, lengths, "target"),
                None if d is None else constrained_setup(d, ids, lengths, "draft"))
    out["setup"] = _compile("setup", jax.jit(setup).lower(target, draft, ids, lengths))

    def step_program(model: Model, role: str, K: int, nodes: Optional[TreeNodes] = None):
        shape = jax.eval_shape(functools.partial(start_cache, length=length), model, ids, lengths)
        cache = p.abstract(shape, cache_axes(shape), role)
        tokens = _rows(p, (B, K), jnp.int32, ("batch", "length"))
        pos = _rows(p, (B,), jnp.int32, ("batch",))

        def step(m, c, t, q):
            logits, c = decode(m, c, t, q, tree=nodes, beside_cache=True)  # as on the TPU
            return logits, p.constrain(c, cache_axes(c), role)
        return jax.jit(step, donate_argnums=(1,)).lower(model, cache, tokens, pos)
    out["target_step"] = _compile("target_step", step_program(target, "target", 1))
    if draft is not None:
        out["verify"] = _compile("verify", step_program(target, "target", gamma + 1))
        out["draft_step"] = _compile("draft_step", step_program(draft, "draft", 1))
    if draft is not None and tree is not None:
        out["tree_verify"] = _compile("tree_verify", step_program(
            target, "target", tree.num_nodes, TreeNodes.of(tree)))
    if whole:
        keys = _rows(p, (B, 2), jnp.uint32, ("batch",))
        static = dict(max_decode_len=max_decode_len, lenience=1.0,
                      recompute_cross_attention=False, partitioner=p)
        args = (ids, keys, jnp.float32(0), jnp.int32(1), lengths, jnp.int32(0), jnp.float32(1))
        out["plain_decode"] = _compile("plain_decode", _generate.lower(
            target, None, *args, gamma=0, **static))
        if draft is not None:
            out["speculative_decode"] = _compile("speculative_decode", _generate.lower(
                target, draft, *args, gamma=gamma, **static))
    return out


# -- what the compiler says ------------------------------------------------------------------
def memory(compiled) -> Dict[str, int]:
    """Bytes per device: the compiler's arguments, temporaries, outputs (less what aliases
    an argument), generated code, and their total."""
    m = compiled.memory_analysis()
    out = {"arguments": int(m.argument_size_in_bytes), "temporaries": int(m.temp_size_in_bytes),
           "outputs": int(m.output_size_in_bytes - m.alias_size_in_bytes),
           "code": int(m.generated_code_size_in_bytes)}
    out["total"] = sum(out.values())
    return out


def cost(compiled, hlo_text: str, chip: str) -> Dict[str, float]:
    """Per device: flops and bytes accessed (XLA's cost analysis, every memory space), the
    bytes that move to and from HBM (`hlo.hbm_bytes` of its optimised HLO, hlo_text) and the
    roofline ms, max(HBM bytes / bandwidth, flops / peak)."""
    c = compiled.cost_analysis()
    c = c[0] if isinstance(c, (list, tuple)) else c
    flops, nbytes = float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0))
    hbm = hbm_bytes(hlo_text)["total"]
    spec = CHIPS[chip]
    ms = 1e3 * max(hbm / spec.bandwidth, flops / spec.flops)
    return {"flops": flops, "bytes_accessed": nbytes, "hbm_bytes": hbm, "roofline_ms": ms}


def predicted_speedup(parts: Dict[str, Dict[str, float]], alpha: float, gamma: int,
                      max_decode_len: int) -> Dict[str, float]:
    """c, v from the parts' roofline times; eq. (5) with that v, and the cost model's
    prediction for one decode of max_decode_len tokens (set-up included, the loop's own work
    left out: it is not in these programs)."""
    T, vT, cT = (parts[k]["roofline_ms"] for k in ("target_step", "verify", "draft_step"))
    c, v = cT / T, vT / T
    costs = Costs(target_step=T, draft_step=cT, draft_two=cT, verify={gamma: vT},
                  setup={0: {"target": parts["setup"]["roofline_ms"], "draft": 0.0}},
                  plain_loop=0.0, round_loop={gamma: 0.0}, step_width=0, cache_len=0)
    rounds = math.ceil(max_decode_len / expected_tokens_per_call(alpha, gamma))
    plain = costs.plain_seconds(0, max_decode_len)
    spec = costs.speculative_seconds(0, gamma, rounds, two_token_calls=0)
    return {"c": c, "v": v, "speedup_predicted": walltime_improvement(alpha, gamma, c, v),
            "speedup_predicted_paper": walltime_improvement(alpha, gamma, c, 1.0),
            "speedup_predicted_cost_model": plain / spec}


PARTS = ("setup", "target_step", "verify", "draft_step", "tree_verify")
PART_NAMES = {"target_params": "target parameters", "draft_params": "draft parameters",
              "target_cache": "target cache", "draft_cache": "draft cache",
              "activations": "activations"}


def check_fits(planned: Dict[str, Any], chip: str) -> None:
    """A one-line ValueError naming the largest part when `plan` says the decode does not
    fit one device of `chip` (the compiler would spend minutes to say the same)."""
    row, parts = planned["chips"][chip], planned["bytes_per_device"]
    if row["fits"]:
        return
    largest = max(PART_NAMES, key=parts.get)
    raise ValueError(f"the decode does not fit a {row['name']} ({CHIPS[chip].hbm_label}): "
                     f"{parts['total'] / GiB:.2f} GiB per device, {PART_NAMES[largest]} "
                     f"{parts[largest] / GiB:.2f} GiB of it; raise --num_partitions, use "
                     "--dtype bfloat16 or a smaller --batch")


def compile_report(target_config, draft_config, topology: str = "v4-8", num_partitions: int = 1,
                   batch: int = 1, input_length: int = 512, max_decode_len: int = 128,
                   gamma: int = 4, alpha: float = 0.7, draft_partitioning: str = "replicated",
                   whole: bool = True, hlo_dir: Optional[str] = None,
                   tree=None, parameter_layouts: str = "compiler",
                   layout_batch: Optional[int] = None) -> Dict[str, Any]:
    """Compile a decode's programs for `topology` and report what the compiler says, beside
    `plan`'s arithmetic for the same settings. hlo_dir: also write each program's optimised
    HLO there (NAME.hlo.txt), to read what the figures come from. tree: children per depth:
    also the target's pass over a token tree's nodes (part 'tree_verify'), and its cost in
    target steps (`tree_verify_over_step`: what checking that many nodes costs there).
    parameter_layouts: `Partitioner`'s, 'compiler' (the layouts a decode on the TPU places
    its parameters in) or 'default' (row-major); layout_batch: the rows per model copy they
    are chosen for (default this compile's batch per model copy, as
    `Partitioner(layout_batch=...)` chooses them for that batch)."""
    tree = None if tree is None else TreeShape.of(tree)
    devices = tpu_devices(topology)
    t = TOPOLOGIES[topology]
    planned = plan(target_config, draft_config, num_partitions, len(devices), batch,
                   input_length, max_decode_len, gamma, draft_partitioning, alpha)
    check_fits(planned, t.chip)
    data = len(devices) // num_partitions
    layout_batch = layout_batch or -(-planned["batch"] // data)  # rows per model copy
    p = Partitioner(num_partitions=num_partitions, draft=draft_partitioning, devices=devices,
                    parameter_layouts=parameter_layouts, layout_batch=layout_batch)
    batch = planned["batch"]  # padded to a multiple of 'data', as generate pads it
    start, cache = time.monotonic(), jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # no client to load TPU programs
    try:
        target = abstract_model(target_config, p, "target")  # the layout probes compile here
        draft = None if draft_config is None else abstract_model(draft_config, p, "draft")
        compiled = compile_parts(target, draft, p, batch, input_length, max_decode_len, gamma,
                                 whole, tree)
    finally:
        jax.config.update("jax_enable_compilation_cache", cache)
    seconds = time.monotonic() - start
    texts = {name: c.as_text() for name, c in compiled.items()}  # megabytes each for XXL
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        for name, text in texts.items():
            with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
                f.write(text)
    parts = {name: cost(c, texts[name], t.chip) for name, c in compiled.items()
             if name in PARTS}
    main = compiled.get("speculative_decode" if draft is not None else "plain_decode")
    report = {"topology": topology, "chip": t.chip, "num_devices": len(devices),
              "mesh": {"data": p.data_size, "model": p.num_partitions},
              "batch": batch, "input_length": input_length, "max_decode_len": max_decode_len,
              "gamma": gamma, "alpha": alpha, "compile_seconds": seconds,
              "parameter_layouts": parameter_layouts, "layout_batch": p.layout_batch,
              "relaid_parameters": {role: relaid(p.param_formats(config, role))
                                    for role, config in (("target", target_config),
                                                         ("draft", draft_config))
                                    if config is not None},
              "memory_per_device_bytes": None if main is None else memory(main),
              "programs": {name: {"memory_per_device_bytes": memory(c),
                                  "hbm_bytes": loop_bytes(texts[name])}
                           for name, c in compiled.items() if name not in PARTS},
              "plan_total_bytes": planned["bytes_per_device"]["total"],
              "plan": planned["bytes_per_device"],
              "ideal_step_bytes": {"target_step": planned["target"]["step_bytes"],
                                   "draft_step": None if draft is None
                                   else planned["draft"]["step_bytes"]},
              "parts": parts}
    if tree is not None and draft is not None:
        report.update(tree=list(tree.branching), tree_nodes=tree.num_nodes - 1,
                      tree_verify_over_step=parts["tree_verify"]["roofline_ms"]
                      / parts["target_step"]["roofline_ms"])
    if draft is not None:
        report.update(predicted_speedup(parts, alpha, gamma, max_decode_len))
        if whole:
            report["in_loop"] = in_loop(report["programs"], alpha, gamma)
    return report


def in_loop(programs: Dict[str, Any], alpha: float, gamma: int) -> Dict[str, float]:
    """c and v from the whole decodes' loops, as they run there, in HBM bytes: a plain step
    (the plain loop's iteration), a draft step (the speculative round's inner loop) and a
    round's own work beside its gamma draft steps (the verify pass and the loop's
    bookkeeping): the round's iteration less one draft step, its first draft call (two
    tokens on a TPU, `ModelDraft.feed_two`: outside the inner loop, reading what a draft
    step reads)."""
    step = programs["plain_decode"]["hbm_bytes"]["per_iteration"]
    spec = programs["speculative_decode"]["hbm_bytes"]
    draft, round_ = spec["inner_per_iteration"], spec["per_iteration"]
    c, v = draft / step, (round_ - draft) / step
    return {"target_step_hbm_bytes": step, "draft_step_hbm_bytes": draft,
            "round_hbm_bytes": round_, "c": c, "v": v,
            "speedup_predicted": walltime_improvement(alpha, gamma, c, v)}


def format_report(r: Dict[str, Any]) -> str:
    """The report as a few aligned lines."""
    lines = [f"{r['topology']} ({r['num_devices']} devices, mesh data {r['mesh']['data']} x "
             f"model {r['mesh']['model']}): batch {r['batch']}, input {r['input_length']}, "
             f"max_decode_len {r['max_decode_len']}, gamma {r['gamma']}; compiled in "
             f"{r['compile_seconds']:.0f} s",
             "parameter layouts: " + ("row-major" if r["parameter_layouts"] == "default" else
                                      f"the compiler's for batch {r['layout_batch']} per model copy (" + ", ".join(
                                          f"{role} {len(paths)} relaid" for role, paths in
                                          r["relaid_parameters"].items()) + ")"),
             "", "memory per device (GiB)      arguments  "
             "temporaries  outputs   total"]
    for name, prog in r["programs"].items():
        m = prog["memory_per_device_bytes"]
        lines.append(f"  {name:<26}{m['arguments'] / GiB:>9.3f}{m['temporaries'] / GiB:>13.3f}"
                     f"{m['outputs'] / GiB:>9.3f}{m['total'] / GiB:>8.3f}")
    lines.append(f"  {'plan':<26}{'':>9}{'':>13}{'':>9}{r['plan_total_bytes'] / GiB:>8.3f}")
    for name, prog in r["programs"].items():
        h = prog["hbm_bytes"]
        lines.append(f"  {name}: HBM GB per iteration {h['per_iteration'] / 1e9:.3f} (inner loop "
                     f"{h['inner_per_iteration'] / 1e9:.4f}), copies into HBM per iteration "
                     f"{h['copies_per_iteration'] / 1e9:.4f}, once {h['copies_outside'] / 1e9:.3f}")
    lines += ["", "per part, per device      GFLOP  GB accessed (XLA)  HBM GB (HLO)  roofline ms"]
    for name, part in r["parts"].items():
        lines.append(f"  {name:<22}{part['flops'] / 1e9:>9.2f}{part['bytes_accessed'] / 1e9:>19.3f}"
                     f"{part['hbm_bytes'] / 1e9:>14.3f}{part['roofline_ms']:>13.3f}")
    ideal = r["ideal_step_bytes"]
    lines.append(f"  ideal steps (plan: the weights a step reads, each shard once, + caches): "
                 f"target {ideal['target_step'] / 1e9:.3f} GB" + (
                     "" if ideal["draft_step"] is None else
                     f", draft {ideal['draft_step'] / 1e9:.4f} GB"))
    if "c" in r:
        lines += ["", f"c = {r['c']:.4f}, v = {r['v']:.3f}; at alpha {r['alpha']}, gamma "
                  f"{r['gamma']}: eq. (5) {r['speedup_predicted']:.2f}x (v = 1: "
                  f"{r['speedup_predicted_paper']:.2f}x), cost model with set-up "
                  f"{r['speedup_predicted_cost_model']:.2f}x -- the compiler's figures, not "
                  "walltime"]
    if "tree" in r:
        lines.append(f"a token tree {tuple(r['tree'])} ({r['tree_nodes']} nodes): one target "
                     f"pass over it costs {r['tree_verify_over_step']:.3f} target steps")
    if "in_loop" in r:
        x = r["in_loop"]
        lines.append(f"in the decode loops: c = {x['c']:.4f}, v = {x['v']:.3f}: eq. (5) "
                     f"{x['speedup_predicted']:.2f}x")
    return "\n".join(lines)


@gin.configurable("compile")
def compile_command(target: str = gin.REQUIRED, draft: Optional[str] = None,
                    topology: str = "v4-8", num_partitions: int = 1, batch: int = 1,
                    input_length: int = 512, max_decode_len: int = 128, gamma: int = 4,
                    dtype: Optional[str] = None, activation_dtype: Optional[str] = None,
                    draft_partitioning: str = "replicated", alpha: float = 0.7,
                    parts_only: bool = False, hlo_dir: Optional[str] = None,
                    as_json: bool = False, tree: Any = None,
                    parameter_layouts: str = "compiler",
                    layout_batch: Optional[int] = None) -> Dict[str, Any]:
    """`speculative-t5 compile`: print the report (a table, or JSON with --json)."""
    activation_dtype = activation_dtype or dtype  # on a TPU activations follow the weights
    overrides = {k: v for k, v in (("param_dtype", dtype), ("dtype", activation_dtype)) if v}
    target_config = read_config(target).replace(**overrides)
    draft_config = None if draft is None else read_config(draft).replace(**overrides)
    if isinstance(tree, str):
        try:
            tree = tuple(int(k) for k in tree.split(","))
        except ValueError:
            raise ValueError(f"--tree must be children per depth like 3,2,1, got {tree!r}") from None
    if tree is not None and draft is None:
        raise ValueError("--tree needs --draft (a tree is verified against a draft's guesses)")
    report = compile_report(target_config, draft_config, topology, num_partitions, batch,
                            input_length, max_decode_len, gamma, alpha, draft_partitioning,
                            whole=not parts_only, hlo_dir=hlo_dir, tree=tree,
                            parameter_layouts=parameter_layouts, layout_batch=layout_batch)
    if as_json:
        print(json.dumps({"target_name": target, "draft_name": draft, **report}, indent=2))
    else:
        print(format_report(report))
    return report
