"""Parameter layouts chosen by the compiler: each weight kept in device memory the way the
decode's matmuls read it.

Inside a program XLA lays arrays out as it likes, but a program's inputs arrive in the
layout they were placed in (row-major unless asked otherwise). Where the verify pass over
gamma + 1 tokens wants a weight in another layout -- on a TPU at batch 1, the decoder's
attention projections column-major -- the compiled decode copies those weights once before
its loop, memory that no parameter count shows (`speculative-t5 compile
--parameter_layouts default` shows it; docs/tpu.md). Asking the compiler which layouts it wants (`Layout.AUTO`)
in a small program that reads the decoder's weights as the loop does -- a step over
`PROBE_TOKENS` tokens of `Partitioner.layout_batch` rows per model copy -- and placing the
weights in those layouts once, at load, removes the copy: `jit` compiles for the layouts
its committed arguments have (`Partitioner.param_formats`). The encoder's weights, read
once per input, stay row-major. On a CPU XLA keeps row-major layouts anyway; there is
nothing to ask.
"""
from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.experimental.layout import Format, Layout

from speculative_t5.model.api import Model, cache_axes, decode, param_shapes, start_cache

PROBE_TOKENS = 8       # a verify pass over gamma + 1 = 8 tokens: the step that wants new layouts
PROBE_INPUT = 32       # input (T5) or prompt (GPT-2) positions of the probe
PROBE_POSITIONS = 48   # cache positions of the probe


def compiler_layouts(config, partitioner, role: str) -> Any:
    """The parameter tree's layouts (`jax.experimental.layout.Layout`) that the compiler
    asks for in a step over `PROBE_TOKENS` tokens (a verify pass) of
    `partitioner.layout_batch` rows per model copy, when `partitioner` places the
    parameters (as `role`), the rows and the cache. None for a parameter the step does
    not read (the encoder's: the set-up reads them once, row-major as stored), and for all
    on CPUs (row-major there). Compiles one small program, allocates nothing."""
    shardings = partitioner.param_shardings(config, role)
    rows = partitioner.sharding(("batch",))
    if next(iter(rows.device_set)).platform == "cpu":
        return jax.tree_util.tree_map(lambda sh: None, shardings)
    params = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        param_shapes(config), shardings)
    B = partitioner.data_size * partitioner.layout_batch
    ids = jax.ShapeDtypeStruct((B, PROBE_INPUT), jnp.int32)

    shape = jax.eval_shape(lambda p, ids: start_cache(
        Model(config, p), ids, jnp.full((B,), PROBE_INPUT), PROBE_POSITIONS),
        param_shapes(config), ids)
    cache = partitioner.abstract(shape, cache_axes(shape), role)
    tokens = jax.ShapeDtypeStruct((B, PROBE_TOKENS), jnp.int32, sharding=rows)
    pos = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=rows)

    def step(params, cache, tokens, pos):
        return decode(Model(config, params), cache, tokens, pos, beside_cache=True)[0]
    auto = jax.tree_util.tree_map(lambda sh: Format(Layout.AUTO, sh), shardings)
    compiled = jax.jit(step, in_shardings=(auto, jax.tree_util.tree_map(
        lambda c: c.sharding, cache), rows, rows)).lower(params, cache, tokens, pos).compile()
    return jax.tree_util.tree_map(lambda f: None if f is None else f.layout,
                                  compiled.input_formats[0][0],
                                  is_leaf=lambda f: isinstance(f, Format))


def with_layouts(shardings: Any, layouts: Any) -> Any:
    """Formats (layout + sharding) where a layout differs from row-major, else the sharding
    itself: what `jax.device_put` and `jax.ShapeDtypeStruct(sharding=...)` take."""
    def one(sharding, layout):
        if layout is None or tuple(layout.major_to_minor) == tuple(range(len(layout.major_to_minor))):
            return sharding
        return Format(layout, sharding)
    return jax.tree_util.tree_map(one, shardings, layouts,
                                  is_leaf=lambda x: x is None or isinstance(x, Layout))


def relaid(formats: Any) -> list:
    """Paths ('decoder/layers_0/self_attention/query/kernel', ...) of the parameters that
    `formats` places in a layout other than row-major."""
    return [path for path, f in traverse_util.flatten_dict(formats, sep="/").items()
            if isinstance(f, Format)]


def probe_failed(error: BaseException) -> None:
    """A probe that cannot compile costs memory, not correctness: say so on stderr, once per
    model, and keep the default layouts."""
    print(f"speculative_t5: keeping row-major parameter layouts (the compiler's choice could "
          f"not be probed: {type(error).__name__}: {str(error).splitlines()[0][:200]})",
          file=sys.stderr)
