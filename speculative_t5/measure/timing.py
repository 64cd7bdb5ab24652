"""Timers of a decode's parts above one model step, for the cost model and the benchmarks:
per-input set-up, a call of `generate`, speculative rounds, whole loops. Each is a
no-argument function to time with `calibration.interleaved_medians` (warm-up first, then
medians of interleaved repetitions); one model step's timers live in `calibration`."""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.drafts import Fallback, ModelDraft
from speculative_t5.decoding.loops import plain_decode, speculative_decode
from speculative_t5.decoding.sampling import SamplingConfig, row_keys
from speculative_t5.engine import generate
from speculative_t5.model.api import Model, decode, init_cache, prefill_cache


def setup_timer(model: Model, width: int, cache_len: int, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function doing one input's per-decode set-up and the decode's first
    one-token step, in one jitted call (as a decode's program starts with them): the
    encoder over [1, width] tokens, the cross-attention keys/values and the cache allocation
    (for a decoder-only model, the prefill of a [1, width] prompt), then one decoder step.
    Less a steady-state one-token step (`step_timer`), it is what a decode pays once: the
    set-up, and the first pass over the decoder's weights from a colder cache."""
    x = jnp.asarray(np.random.RandomState(seed).randint(2, model.config.vocab_size, (1, width)),
                    jnp.int32)
    lengths = jnp.full((1,), width, jnp.int32)
    return lambda: _setup_and_step(model, x, lengths, cache_len)


@functools.partial(jax.jit, static_argnums=(3,))
def _setup_and_step(model: Model, x, lengths, cache_len: int):
    cache = prefill_cache(model, x, lengths, cache_len) if model.decoder_only \
        else init_cache(model, x, cache_len)
    return decode(model, cache, x[:, :1], jnp.zeros((1,), jnp.int32))


def call_width(model: Model, width: int) -> int:
    """The input width `call_timer` decodes at: `width`, cut for a decoder-only model so
    that its prompt and one new token fit the model's positions."""
    return min(width, model.config.n_positions - 1) if model.decoder_only else width


def call_timer(model: Model, width: int, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function decoding one token of a random [1, call_width] input with
    `st.generate`, as a walltime driver calls it: its time less the set-up at that width,
    one step and one plain step's loop work is what a call of `generate` pays besides the
    device's work (argument checks, keys, dispatch, moving the output)."""
    width = call_width(model, width)
    x = np.random.RandomState(seed).randint(2, model.config.vocab_size, (1, width))
    return lambda: generate(model, x, max_decode_len=1).tokens


def round_timer(target: Model, draft: Model, gamma: int, width: int, cache_len: int,
                rounds: int, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function running `rounds` speculative rounds' model steps in one jitted
    loop: gamma one-token draft steps (each fed the last's argmax), then the target's pass
    over the gamma + 1 tokens, both caches donated; divide its time by `rounds`. The two
    models run in turn, as in a decode (each step timer runs one model alone, so what one
    model's pass costs the other's next, e.g. in evicted caches, shows only here). No accept
    test or sampling: that is the loop's own work (`loop_timer`)."""
    rng = np.random.RandomState(seed)
    x = jnp.asarray(rng.randint(2, target.config.vocab_size, (1, width)), jnp.int32)
    state = {m: (prefill_cache(model, x, jnp.full((1,), width), cache_len) if model.decoder_only
                 else init_cache(model, x, cache_len)) for m, model in (("t", target), ("d", draft))}
    tok = jnp.asarray(rng.randint(2, target.config.vocab_size, (1, 1)), jnp.int32)   # [1, 1]
    pos = jnp.full((1,), cache_len // 2, jnp.int32)

    def run():
        state["t"], state["d"], out = _rounds(target, draft, state["t"], state["d"], tok, pos,
                                              gamma, rounds)
        return out
    return run


@functools.partial(jax.jit, static_argnums=(6, 7), donate_argnums=(2, 3))
def _rounds(target: Model, draft: Model, tcache, dcache, tok, pos, gamma: int, n: int):
    def body(_, carry):
        tcache, dcache, tok = carry
        toks = [tok]                                                           # [1, 1] each
        for j in range(gamma):
            logits, dcache = decode(draft, dcache, toks[-1], pos + j)          # [1, 1, V]
            toks.append(jnp.argmax(logits, -1).astype(jnp.int32))
        logits, tcache = decode(target, tcache, jnp.concatenate(toks, 1), pos)  # [1, g+1, V]
        return tcache, dcache, jnp.argmax(logits[:, -1:], -1).astype(jnp.int32)
    return jax.lax.fori_loop(0, n, body, (tcache, dcache, tok))


@functools.partial(jax.jit, static_argnames=("gamma", "max_len", "kind"))
def _free_loop(logits_row, rng, temperature, input_ids, zero_cost, *, gamma: int, max_len: int,
               top_k, top_p, kind: str = "model"):
    """A decode loop (plain when gamma is 0) whose model steps cost nothing: every call
    returns `logits_row` [V] for every token (not foldable: see `step`). No EOS (id -1),
    so the loop runs max_len tokens. What it costs is the loop's own work: sampling, the
    accept test, writing tokens, statistics, control flow, and a zero-cost draft's own
    proposing. kind: 'model' (a free
    draft model: target and draft agree, every draft is accepted), 'zero_cost' (the draft
    object `zero_cost` itself, e.g. a PromptLookup over input_ids [1, W]) or 'fallback'
    (Fallback(zero_cost, a free draft model)). The sampling settings are traced, as in
    `engine._generate`, so the loop branches on them as a decode does."""
    def step(cache, tokens, pos):                                              # -> [B, K, V]
        # logits that depend on the tokens fed (+ 0.0 keeps them equal): of a broadcast row,
        # XLA would compute softmaxes and argmaxes once, not per row and position
        return logits_row + 0.0 * tokens[..., None].astype(logits_row.dtype), cache
    sampling = SamplingConfig(temperature, top_k, top_p)
    cache, rng = jnp.zeros((), jnp.int32), row_keys(rng, 1)
    if gamma == 0:
        return plain_decode(step, cache, 1, max_len, -1, sampling, rng)
    free = ModelDraft(step, lambda ids, length: cache, catch_up=kind == "fallback")
    draft = {"model": free, "zero_cost": zero_cost,
             "fallback": Fallback(zero_cost, free)}[kind]
    state = draft.init(input_ids, max_len + gamma + 1)
    return speculative_decode(step, cache, draft, state, 1, max_len, -1, gamma, sampling, rng)


def loop_kind(draft) -> Tuple[str, Any]:
    """How the loop timer runs a cell's draft: ('model', None) for a draft Model (its steps
    free), ('zero_cost', draft) for a zero-cost draft (PromptLookup, Bigram: run as it is),
    ('fallback', first) for Fallback(zero-cost first, Model)."""
    if isinstance(draft, Model):
        return "model", None
    if isinstance(draft, Fallback):
        if isinstance(draft.then, Model) and not isinstance(draft.first, (Model, Fallback)):
            return "fallback", draft.first
        raise ValueError(f"the loop timer runs Fallback(zero-cost draft, Model) only, got {draft!r}")
    if not hasattr(draft, "propose"):
        raise TypeError(f"not a draft: {draft!r}")
    return "zero_cost", draft


def loop_timer(vocab_size: int, gamma: int, sampling: SamplingConfig, max_len: int = 64,
               seed: int = 0, draft=None, width: int = 1) -> Tuple[Callable[[], Any], int]:
    """(a no-argument function running one batch-1 decode loop of `max_len` tokens with
    free model steps, the number of target calls it makes): divide the first's time by the
    second for the loop's own work per plain step (gamma 0) or per speculative round.
    draft: the decode's draft (default: a model); a zero-cost one is run as it is (a
    PromptLookup searches a random [1, width] input and the tokens emitted, so its work is
    in the loop's), a Fallback's model is free (`loop_kind`)."""
    rs = np.random.RandomState(seed)
    row = jnp.asarray(rs.randn(vocab_size), jnp.float32)
    x = jnp.asarray(rs.randint(2, vocab_size, (1, width)), jnp.int32)          # [1, W]
    kind, zero_cost = ("model", None) if draft is None else loop_kind(draft)
    if zero_cost is not None and getattr(zero_cost, "vocab_size", 0) is None:
        zero_cost = zero_cost.for_vocab(vocab_size)
    temperature = jnp.float32(sampling.temperature)  # traced, as `generate` passes it
    run = functools.partial(_free_loop, row, jax.random.PRNGKey(seed), temperature, x, zero_cost,
                            gamma=gamma, max_len=max_len, top_k=sampling.top_k,
                            top_p=sampling.top_p, kind=kind)
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
