"""Honest timing helpers for benchmarks: warm-up first (compile excluded), then medians of
interleaved repetitions so machine noise hits every variant alike."""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.drafts import ModelDraft
from speculative_t5.decoding.loops import plain_decode, speculative_decode
from speculative_t5.decoding.sampling import SamplingConfig, row_keys
from speculative_t5.generate import generate
from speculative_t5.model.api import Model, decode, init_cache


@functools.partial(jax.jit, static_argnums=(4,), donate_argnums=(1,))
def _steps(model: Model, cache, tokens, pos, n: int):
    """n decoder steps inside one program, each fed the argmax of the last (a data
    dependency, as in decoding), so a step costs what it costs inside a decode loop:
    no Python dispatch per step (which, for a small draft, can exceed the step itself)."""
    def body(_, carry):
        cache, toks = carry
        logits, cache = decode(model, cache, toks, pos)                        # [B, K, V]
        return cache, jnp.argmax(logits, -1).astype(jnp.int32)                 # [B, K]
    return jax.lax.fori_loop(0, n, body, (cache, tokens))


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
               pos: int = 16, steps: int = 16, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function running `steps` decoder steps over K tokens in one jitted
    loop (cache donated); divide its time by `steps` (as `step_times` does)."""
    rng = np.random.RandomState(seed)
    c = model.config
    x = jnp.asarray(rng.randint(2, c.vocab_size, (batch, input_len)), jnp.int32)
    tokens = jnp.asarray(rng.randint(2, c.vocab_size, (batch, K)), jnp.int32)
    positions = jnp.full((batch,), pos, jnp.int32)
    state = {"cache": init_cache(model, x, max_len)}

    def run():
        state["cache"], out = _steps(model, state["cache"], tokens, positions, steps)
        return out
    return run


def setup_timer(model: Model, width: int, cache_len: int, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function doing one input's per-decode set-up: the encoder over
    [1, width] tokens, the cross-attention keys/values and the cache allocation (one jitted
    call, as a decode's program starts with them)."""
    x = jnp.asarray(np.random.RandomState(seed).randint(2, model.config.vocab_size, (1, width)),
                    jnp.int32)
    return lambda: init_cache(model, x, cache_len)


def step_times(specs: Dict[str, Tuple[Model, int]], batch: int = 1, input_len: int = 32,
               max_len: int = 64, pos: int = 16, rounds: int = 20, steps: int = 16,
               warmup: int = 2) -> Dict[str, float]:
    """Median seconds per decoder step of each {name: (model, K tokens)}, as a compiled
    decode loop pays it, the variants timed in turn (c and v are ratios of these)."""
    timers = {name: step_timer(m, batch, K, input_len, max_len, pos, steps)
              for name, (m, K) in specs.items()}
    return {k: t / steps for k, t in interleaved_medians(timers, rounds, warmup).items()}


@functools.partial(jax.jit, static_argnames=("gamma", "max_len", "top_k", "top_p"))
def _free_loop(logits_row, rng, temperature, *, gamma: int, max_len: int, top_k: int,
               top_p: float):
    """A decode loop (plain when gamma is 0) whose model steps cost nothing: every call
    returns `logits_row` [V] for every token. Target and draft then agree, so every draft
    is accepted; no EOS (id -1), so the loop runs max_len tokens. What it costs is the
    loop's own work: sampling, the accept test, writing tokens, statistics, control flow."""
    def step(cache, tokens, pos):                                              # -> [B, K, V]
        return jnp.broadcast_to(logits_row, tokens.shape + logits_row.shape), cache
    sampling = SamplingConfig(temperature, top_k, top_p)
    cache, rng = jnp.zeros((), jnp.int32), row_keys(rng, 1)
    if gamma == 0:
        return plain_decode(step, cache, 1, max_len, -1, sampling, rng)
    draft = ModelDraft(step, lambda ids, length: cache)
    state = draft.init(jnp.zeros((1, 1), jnp.int32), max_len + gamma + 1)
    return speculative_decode(step, cache, draft, state, 1, max_len, -1, gamma, sampling, rng)


def loop_timer(vocab_size: int, gamma: int, sampling: SamplingConfig, max_len: int = 64,
               seed: int = 0) -> Tuple[Callable[[], Any], int]:
    """(a no-argument function running one batch-1 decode loop of `max_len` tokens with
    free model steps, the number of target calls it makes): divide the first's time by the
    second for the loop's own work per plain step (gamma 0) or per speculative round."""
    row = jnp.asarray(np.random.RandomState(seed).randn(vocab_size), jnp.float32)
    temperature = jnp.float32(sampling.temperature)  # traced, as `generate` passes it
    run = functools.partial(_free_loop, row, jax.random.PRNGKey(seed), temperature, gamma=gamma,
                            max_len=max_len, top_k=sampling.top_k, top_p=sampling.top_p)
    calls = int(run()[2]["target_calls"].sum())
    return run, calls


def decoder_step_bytes(model: Model, K: int = 1) -> int:
    """Bytes of weights one decoder step over K tokens reads: every decoder kernel except
    the cross-attention key/value kernels (their outputs are cached per input), the output
    layer (the tied embedding for T5 1.0), and K embedding rows. Divided by a step's time:
    the weight bandwidth achieved."""
    from flax import traverse_util
    total = 0
    for key, arr in traverse_util.flatten_dict(model.params, sep="/").items():
        nbytes = arr.size * arr.dtype.itemsize
        if key.startswith("decoder/") and "encoder_decoder_attention/key" not in key \
                and "encoder_decoder_attention/value" not in key:
            total += nbytes
        elif key == "token_embedder/embedding":
            total += nbytes if model.config.logits_via_embedding else K * arr.shape[1] * arr.dtype.itemsize
    return total


def timed_decodes(model: Model, variants: Dict[str, Dict[str, Any]], input_ids, sampling,
                  max_decode_len: int, rng) -> Dict[str, Tuple[Any, float]]:
    """Decode one input with every variant {name: generate kwargs (draft, gamma,
    recompute_cross_attention)} back to back, so machine noise hits them alike.
    Returns {name: (GenerateOutput, seconds)}; the caller warms the programs first."""
    out = {}
    for name, kwargs in variants.items():
        t0 = time.perf_counter()
        res = generate(model, input_ids, max_decode_len=max_decode_len, sampling=sampling,
                       rng=rng, **kwargs)
        out[name] = (res, time.perf_counter() - t0)
    return out
