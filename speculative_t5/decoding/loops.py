"""The decode loops: plain (one token per target call) and speculative (Algorithm 1, with
token-wise or block verification).

Each is one `lax.while_loop` (no host round-trip per token or round) over a batch of rows
with per-row state. The loops know nothing of T5: a model is a step function
    logits [B, K, V], cache = step(cache, tokens [B, K], pos [B])
that writes tokens at positions pos..pos+K-1 of an opaque cache by overwrite, so
positions beyond a row's accepted tokens are simply rewritten next round.

Token buffer: seq[:, 0] is the start token (0), seq[:, j] the j-th emitted token y_j; the
model's output at position j predicts y_{j+1}.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp

from speculative_t5.decoding.output import emit, init_stats, record_call
from speculative_t5.decoding.sampling import (VERIFIERS, SamplingConfig, adjust, choose,
                                              check_verification, fold_rows, split_rows)

Array = jax.Array
StepFn = Callable[[Any, Array, Array], Tuple[Array, Any]]


class PlainState(NamedTuple):
    seq: Array          # [B, max_len + 2] start token, then the emitted tokens
    m: Array            # [B] tokens emitted so far
    done: Array         # [B] row finished (EOS or max_len)
    cache: Any          # the target's cache
    rng: Array          # [B] one PRNG key per row
    stats: Dict[str, Array]


class SpeculativeState(NamedTuple):
    seq: Array          # [B, max_len + 2]
    m: Array            # [B]
    done: Array         # [B]
    swept: Array        # [B] the last round accepted every draft (the draft missed x_gamma)
    target_cache: Any
    draft_cache: Any
    rng: Array          # [B]
    stats: Dict[str, Array]


def _running(state) -> Array:
    return ~jnp.all(state.done)


def _take(seq: Array, cols: Array) -> Array:
    """seq [B, N] at per-row columns cols [B, K] -> [B, K]."""
    return jnp.take_along_axis(seq, cols, axis=1)


def plain_decode(step: StepFn, cache: Any, batch: int, max_len: int, eos_id: int,
                 sampling: SamplingConfig, rng: Array):
    """T5X `temperature_sample` semantics: one target call per emitted token. rng [B]: a
    PRNG key per row."""
    state = PlainState(jnp.zeros((batch, max_len + 2), jnp.int32), jnp.zeros((batch,), jnp.int32),
                       jnp.zeros((batch,), bool), cache, rng, init_stats(batch, 0))

    def body(s: PlainState) -> PlainState:
        rng, key = split_rows(s.rng, 2)
        logits, cache = step(s.cache, _take(s.seq, s.m[:, None]), s.m)        # [B, 1, V]
        token = choose(key, adjust(logits[:, 0], sampling), sampling.greedy)   # [B]
        seq, m, done, emitted = emit(s.seq, s.m, s.done, token[:, None], jnp.ones_like(s.m),
                                     eos_id, max_len)
        return PlainState(seq, m, done, cache, rng, record_call(s.stats, ~s.done, emitted, 0))

    s = jax.lax.while_loop(_running, body, state)
    return s.seq[:, 1:max_len + 1], s.m, s.stats


def speculative_decode(target: StepFn, target_cache: Any, draft: StepFn, draft_cache: Any,
                       batch: int, max_len: int, eos_id: int, gamma: int,
                       sampling: SamplingConfig, rng: Array, lenience: float = 1.0,
                       verification: str = "token"):
    """Algorithm 1 of Leviathan et al. (2023), batched; every row emits >= 1 token a round.
    rng [B]: a PRNG key per row. verification: "token" (`verify`) or "block" (`verify_block`,
    Sun et al. 2025) decides how many drafts a round accepts."""
    greedy = sampling.greedy
    verify = VERIFIERS[check_verification(verification, lenience)]
    no = jnp.zeros((batch,), bool)
    state = SpeculativeState(jnp.zeros((batch, max_len + 2), jnp.int32),
                             jnp.zeros((batch,), jnp.int32), no, no, target_cache, draft_cache,
                             rng, init_stats(batch, gamma))
    steps = jnp.arange(gamma + 1)[None, :]                                     # [1, G+1]

    def round_(s: SpeculativeState) -> SpeculativeState:
        seq, m = s.seq, s.m
        rng, k_draft, k_verify = split_rows(s.rng, 3)

        # 1. Draft gamma tokens. After a round that accepted every draft, the draft never
        #    saw x_gamma (position m-1): then the first call feeds positions m-1 and m.
        def feed_two(dcache):
            start = jnp.maximum(m - 1, 0)                                      # [B]
            logits, dcache = draft(dcache, _take(seq, start[:, None] + steps[:, :2]), start)
            return jnp.take_along_axis(logits, (m - start)[:, None, None], 1)[:, 0], dcache

        def feed_one(dcache):
            logits, dcache = draft(dcache, _take(seq, m[:, None]), m)
            return logits[:, 0], dcache

        logits, dcache = jax.lax.cond(jnp.any(s.swept & ~s.done), feed_two, feed_one,
                                      s.draft_cache)
        q1 = adjust(logits, sampling)                                          # [B, V]
        x1 = choose(fold_rows(k_draft, 0), q1, greedy)                # [B]
        qs = jnp.zeros((batch, gamma) + q1.shape[-1:], jnp.float32).at[:, 0].set(q1)
        xs = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x1)

        def draft_step(i, carry):                      # feeds x_i at m+i, samples x_{i+1}
            dcache, qs, xs = carry
            logits, dcache = draft(dcache, jax.lax.dynamic_slice_in_dim(xs, i - 1, 1, 1), m + i)
            q = adjust(logits[:, 0], sampling)                                 # [B, V]
            x = choose(fold_rows(k_draft, i), q, greedy)
            return dcache, qs.at[:, i].set(q), xs.at[:, i].set(x)

        dcache, qs, xs = jax.lax.fori_loop(1, gamma, draft_step, (dcache, qs, xs))

        # 2. Verify: one target call over [y_m, x_1..x_gamma] -> p_1..p_{gamma+1}.
        tokens = jnp.concatenate([_take(seq, m[:, None]), xs], axis=1)         # [B, G+1]
        logits, tcache = target(s.target_cache, tokens, m)                     # [B, G+1, V]
        p = adjust(logits, sampling)

        # 3-4. Accept a prefix of n drafts, then one token from the target's side.
        n, nxt, accepted = verify(k_verify, p, qs, xs, greedy, lenience)
        new = jnp.where(steps < n[:, None], jnp.pad(xs, ((0, 0), (0, 1))),
                        jnp.where(steps == n[:, None], nxt[:, None], 0))       # [B, G+1]
        seq, m, done, emitted = emit(seq, m, s.done, new, n + 1, eos_id, max_len)
        reached = jnp.pad(accepted[:, :-1], ((0, 0), (1, 0)), constant_values=True)
        stats = record_call(s.stats, ~s.done, emitted, gamma, accepted, reached, s.swept)
        return SpeculativeState(seq, m, done, n == gamma, tcache, dcache, rng, stats)

    s = jax.lax.while_loop(_running, round_, state)
    return s.seq[:, 1:max_len + 1], s.m, s.stats
