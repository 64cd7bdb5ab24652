"""Beam search with T5X's semantics (`t5x.decoding.beam_search`), as one `lax.while_loop`.

Model-agnostic like the other loops: a model is a step function
    logits [N, K, V], cache = step(cache, tokens [N, K], pos [N])
over N = B * W rows (row b's W beams at rows b*W .. b*W + W - 1, each starting from a copy
of the row's cache), and the opaque cache is reordered by parent beam along axis 0 of every
leaf. As in T5X the live and finished sets are kept in ascending order (the best beam last:
`lax.top_k`'s ties to the lower index then fall exactly where T5X's do); the output is
flipped to best first.

Each step (t = 0, 1, ...): the live beams' log_softmax + their log-probs, the top 2W of the
flattened [W, V] candidates; the live set is the top W of those not ending in EOS (EOS ones
get -1e7); a candidate ending in EOS scores log-prob / brevity_penalty(offset + t + 1)
(others -1e7) and the finished set is the top W of old and new. The loop stops after
max_len steps, or when every row's finished slots are all filled and its worst finished
score beats its best live log-prob / brevity_penalty(max offset + max_len + 1) (batch-wide), or
when no live beam is above min_log_prob. A row with no finished beam returns its live ones.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from speculative_t5.decoding.loops import StepFn

Array = jax.Array
NEG_INF = -1.0e7  # T5X's NEG_INF: what a dead or empty slot scores


class BeamState(NamedTuple):
    step: Array             # [] steps taken (T5X's cur_index); the next token goes to step + 1
    live_logprobs: Array    # [B, W] ascending: the best live beam last
    finished_scores: Array  # [B, W] ascending
    live_seqs: Array        # [B, W, max_len + 1] the start token, then the beam's tokens
    finished_seqs: Array    # [B, W, max_len + 1]
    finished_flags: Array   # [B, W] slot holds a finished beam (not a filler)
    cache: Any              # the step function's cache over B * W rows


def brevity_penalty(alpha, length) -> Array:
    """T5X's length normalization ((5 + length) / 6) ** alpha."""
    return jnp.power((5.0 + length) / 6.0, alpha)


def gather_beams(x: Array, idx: Array) -> Array:
    """x [B, K, ...] at per-row beam indices idx [B, W] -> [B, W, ...]."""
    return jax.vmap(lambda xb, ib: xb[ib])(x, idx)


def top_beams(scores: Array, k: int) -> Array:
    """Indices [B, k] of the k best of scores [B, K], ascending (best last), as T5X takes them."""
    return jnp.flip(jax.lax.top_k(scores, k)[1], axis=1)


def gather_cache(cache: Any, parents: Array) -> Any:
    """Every cache leaf [B * W, ...] reordered by parent beam: new beam j of row b takes
    old beam parents[b, j]'s rows."""
    B, W = parents.shape

    def one(x):
        return gather_beams(x.reshape((B, W) + x.shape[1:]), parents).reshape(x.shape)
    return jax.tree_util.tree_map(one, cache)


def beam_search(step: StepFn, cache: Any, batch: int, beam_size: int, max_len: int, eos_id,
                alpha, start: Any = None, offset: Any = None,
                min_log_prob: float = NEG_INF):
    """T5X beam search over `batch` rows of `beam_size` beams. cache: over B * W rows (each
    row's cache repeated per beam). start [B]: each row's first decoder token (default 0,
    T5's start token; a decoder-only model's last prompt token). offset [B]: tokens before
    the decode counted in the brevity penalty (a decoder-only model's prompt lengths, as
    T5X's initial_index; default 0). eos_id, alpha: may be traced.
    -> (tokens int32 [B, W, max_len] best first, 0 after EOS; scores float32 [B, W];
    lengths int32 [B, W] (through EOS, else the steps run); steps int32 [])."""
    B, W, L = batch, beam_size, max_len + 1
    offset = jnp.zeros((B,), jnp.int32) if offset is None else offset.astype(jnp.int32)
    seqs = jnp.zeros((B, W, L), jnp.int32)
    if start is not None:
        seqs = seqs.at[:, :, 0].set(start.astype(jnp.int32)[:, None])
    live0 = jnp.tile(jnp.array([0.0] + [NEG_INF] * (W - 1), jnp.float32), (B, 1))  # [B, W]
    state = BeamState(jnp.int32(0), live0, jnp.full((B, W), NEG_INF, jnp.float32), seqs,
                      jnp.zeros_like(seqs), jnp.zeros((B, W), bool), cache)
    # the best any live beam can still score, its log-prob over the largest penalty
    most_penalty = brevity_penalty(alpha, (jnp.max(offset) + L).astype(jnp.float32))

    def running(s: BeamState) -> Array:
        best_live = s.live_logprobs[:, -1:] / most_penalty                     # [B, 1]
        worst_finished = jnp.min(s.finished_scores, axis=1, keepdims=True)     # [B, 1]
        worst_finished = jnp.where(s.finished_flags, worst_finished, NEG_INF)  # [B, W]
        terminated = jnp.all(worst_finished > best_live)
        hopeless = jnp.all(best_live < min_log_prob / most_penalty) & (s.step > 0)
        return (s.step < max_len) & ~terminated & ~hopeless

    def body(s: BeamState) -> BeamState:
        t = s.step
        tokens = jax.lax.dynamic_index_in_dim(s.live_seqs, t, axis=2)          # [B, W, 1]
        logits, cache = step(s.cache, tokens.reshape(B * W, 1), jnp.full((B * W,), t))
        logits = logits.reshape(B, W, -1).astype(jnp.float32)                  # [B, W, V]
        V = logits.shape[-1]
        log_probs = jax.nn.log_softmax(logits) + s.live_logprobs[:, :, None]   # [B, W, V]
        top_lp, top_idx = jax.lax.top_k(log_probs.reshape(B, W * V), 2 * W)    # [B, 2W]
        ids, parents = top_idx % V, top_idx // V                               # [B, 2W]
        top_seqs = gather_beams(s.live_seqs, parents)                          # [B, 2W, L]
        top_seqs = jax.lax.dynamic_update_index_in_dim(top_seqs, ids[:, :, None], t + 1, 2)
        ended = ids == eos_id                                                  # [B, 2W]

        # live: the best W candidates that did not end
        live_lp = top_lp + ended * NEG_INF                                     # [B, 2W]
        keep = top_beams(live_lp, W)                                           # [B, W]
        cache = gather_cache(cache, jnp.take_along_axis(parents, keep, axis=1))

        # finished: the best W of the old finished and the candidates that ended
        scores = top_lp / brevity_penalty(alpha, (offset[:, None] + t + 1).astype(jnp.float32))
        scores = scores + (~ended) * NEG_INF                                   # [B, 2W]
        all_scores = jnp.concatenate([s.finished_scores, scores], axis=1)      # [B, 3W]
        best = top_beams(all_scores, W)                                        # [B, W]
        return BeamState(
            t + 1, jnp.take_along_axis(live_lp, keep, axis=1), gather_beams(all_scores, best),
            gather_beams(top_seqs, keep),
            gather_beams(jnp.concatenate([s.finished_seqs, top_seqs], axis=1), best),
            gather_beams(jnp.concatenate([s.finished_flags, ended], axis=1), best), cache)

    s = jax.lax.while_loop(running, body, state)
    any_finished = jnp.any(s.finished_flags, axis=1)                           # [B]
    seqs = jnp.where(any_finished[:, None, None], s.finished_seqs, s.live_seqs)
    scores = jnp.where(any_finished[:, None], s.finished_scores, s.live_logprobs)
    tokens = jnp.flip(seqs[:, :, 1:], axis=1)                                  # [B, W, max_len]
    is_eos = tokens == eos_id
    lengths = jnp.where(jnp.any(is_eos, 2), jnp.argmax(is_eos, 2) + 1, s.step)
    return tokens, jnp.flip(scores, axis=1), lengths.astype(jnp.int32), s.step
