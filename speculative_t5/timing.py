"""Honest timing helpers for benchmarks: warm-up first (compile excluded), then medians of
interleaved repetitions so machine noise hits every variant alike."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding import generate
from speculative_t5.model.api import Model, decode, init_cache


_step = jax.jit(decode, donate_argnums=(1,))  # one compile cache shared by every timer


def _block(x):
    jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)
    return x


def interleaved_medians(fns: Dict[str, Callable[[], Any]], rounds: int, warmup: int = 1) -> Dict[str, float]:
    """Median seconds per call of each fn, timing them in turn within every round."""
    for fn in fns.values():
        for _ in range(warmup):
            _block(fn())
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            _block(fn())
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def step_timer(model: Model, batch: int, K: int, input_len: int = 32, max_len: int = 64,
               pos: int = 16, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function running one jitted decoder step over K tokens (cache donated)."""
    rng = np.random.RandomState(seed)
    c = model.config
    x = jnp.asarray(rng.randint(2, c.vocab_size, (batch, input_len)), jnp.int32)
    tokens = jnp.asarray(rng.randint(2, c.vocab_size, (batch, K)), jnp.int32)
    positions = jnp.full((batch,), pos, jnp.int32)
    state = {"cache": init_cache(model, x, max_len)}

    def run():
        logits, state["cache"] = _step(model, state["cache"], tokens, positions)
        return logits
    return run


def timed_decodes(model: Model, variants: Dict[str, Dict[str, Any]], input_ids, sampling,
                  max_decode_len: int, rng) -> Dict[str, Tuple[Any, float]]:
    """Decode one input with every variant {name: generate kwargs (draft, gamma,
    recompute_cross_attention)} back to back, so machine noise hits them alike.
    Returns {name: (GenerateOutput, seconds)}; the caller warms the programs first."""
    out = {}
    for name, kwargs in variants.items():
        t0 = time.perf_counter()
        res = generate(model, input_ids, max_decode_len=max_decode_len,
                       temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p, rng=rng, **kwargs)
        out[name] = (res, time.perf_counter() - t0)
    return out
