"""Beam search with T5X's semantics (`t5x.decoding.beam_search`), as one `lax.while_loop`.

Model-agnostic like the other loops: a model is a step function
    logits [N, K, V], cache = step(cache, tokens [N, K], pos [N])
over N = B * W rows (row b's W beams at rows b*W .. b*W + W - 1, each starting from a copy
of the row's cache), and the opaque cache is reordered by parent beam along axis 0 of every
leaf. As in T5X the live and finished sets are kept in ascending order (the best beam last:
`lax.top_k`'s ties to the lower index then fall exactly where T5X's do); the output is
flipped to best first.

Each step (t = 0, 1, ...; `beam_step`): the live beams' log_softmax + their log-probs, the
top 2W of the flattened [W, V] candidates; the live set is the top W of those not ending in
EOS (EOS ones get -1e7); a candidate ending in EOS scores log-prob /
brevity_penalty(offset + t + 1) (others -1e7) and the finished set is the top W of old and
new. The loop stops after max_len steps, or when every row's finished slots are all filled
and its worst finished score beats its best live log-prob / brevity_penalty(max offset +
max_len + 1) (batch-wide; `row_tests`), or when no live beam is above min_log_prob. A row
with no finished beam returns its live ones. `speculative_beam` replays the same
`beam_step` on a target's logits for drafted paths.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Tuple

import jax
import jax.numpy as jnp

from speculative_t5.decoding.loops import StepFn

Array = jax.Array
NEG_INF = -1.0e7  # T5X's NEG_INF: what a dead or empty slot scores


class Beams(NamedTuple):
    """T5X's beam state (without the model's cache)."""
    live_logprobs: Array    # [B, W] ascending: the best live beam last
    finished_scores: Array  # [B, W] ascending
    live_seqs: Array        # [B, W, max_len + 1] the start token, then the beam's tokens
    finished_seqs: Array    # [B, W, max_len + 1]
    finished_flags: Array   # [B, W] slot holds a finished beam (not a filler)


class BeamState(NamedTuple):
    step: Array             # [] steps taken (T5X's cur_index); the next token goes to step + 1
    beams: Beams
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


def gather_cache(cache: Any, idx: Array, width: int | None = None) -> Any:
    """Every cache leaf [B * K, ...] (K = width, default idx's W) reordered by beam: new row
    j of batch row b takes old row idx[b, j] -> leaves [B * W, ...]."""
    B, W = idx.shape
    K = W if width is None else width

    def one(x):
        return gather_beams(x.reshape((B, K) + x.shape[1:]), idx).reshape((B * W,) + x.shape[1:])
    return jax.tree_util.tree_map(one, cache)


def init_beams(batch: int, beam_size: int, max_len: int, start: Any = None) -> Beams:
    """The first live beam of each row (log-prob 0, the others -1e7 as in T5X), holding the
    start token [B] (default 0); no finished beam."""
    B, W = batch, beam_size
    seqs = jnp.zeros((B, W, max_len + 1), jnp.int32)
    if start is not None:
        seqs = seqs.at[:, :, 0].set(start.astype(jnp.int32)[:, None])
    live0 = jnp.tile(jnp.array([0.0] + [NEG_INF] * (W - 1), jnp.float32), (B, 1))  # [B, W]
    return Beams(live0, jnp.full((B, W), NEG_INF, jnp.float32), seqs, jnp.zeros_like(seqs),
                 jnp.zeros((B, W), bool))


def most_penalty(alpha, offset: Array, max_len: int) -> Array:
    """The largest brevity penalty any beam of the batch can reach (T5X's termination
    bound): brevity_penalty(max offset + max_len + 1)."""
    return brevity_penalty(alpha, (jnp.max(offset) + max_len + 1).astype(jnp.float32))


def row_tests(b: Beams, bound: Array, min_log_prob: float = NEG_INF) -> Tuple[Array, Array]:
    """Each row's half of T5X's stopping test -> (terminated [B]: every finished slot filled
    and the worst finished score beats the best live log-prob / bound; hopeless [B]: the
    best live log-prob / bound is below min_log_prob / bound). T5X stops when every row is
    terminated, or every row hopeless after the first step."""
    best_live = b.live_logprobs[:, -1:] / bound                                # [B, 1]
    worst_finished = jnp.min(b.finished_scores, axis=1, keepdims=True)         # [B, 1]
    worst_finished = jnp.where(b.finished_flags, worst_finished, NEG_INF)      # [B, W]
    return (jnp.all(worst_finished > best_live, axis=1),
            best_live[:, 0] < min_log_prob / bound)


def expand(logits: Array, live_logprobs: Array) -> Tuple[Array, Array, Array]:
    """T5X's candidates: the top 2W of log_softmax(logits [B, W, V]) + live_logprobs [B, W]
    over the flattened [W, V] -> (log-probs [B, 2W], token ids [B, 2W], parent beams [B, 2W])."""
    B, W, V = logits.shape
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32)) + live_logprobs[:, :, None]
    top_lp, top_idx = jax.lax.top_k(log_probs.reshape(B, W * V), 2 * W)        # [B, 2W]
    return top_lp, top_idx % V, top_idx // V


def beam_step(b: Beams, logits: Array, t: Array, offset: Array, eos_id, alpha):
    """One T5X beam step on the live beams' logits [B, W, V] at steps t [B] (their tokens'
    count) -> (Beams, parents [B, W]: the old live beam each new one extends, ids [B, W]:
    the token it adds)."""
    B, W, L = b.live_seqs.shape
    top_lp, ids, parents = expand(logits, b.live_logprobs)                     # [B, 2W]
    top_seqs = gather_beams(b.live_seqs, parents)                              # [B, 2W, L]
    at = jnp.arange(L)[None, None, :] == (t + 1)[:, None, None]                # [B, 1, L]
    top_seqs = jnp.where(at, ids[:, :, None], top_seqs)
    ended = ids == eos_id                                                      # [B, 2W]

    # live: the best W candidates that did not end
    live_lp = top_lp + ended * NEG_INF                                         # [B, 2W]
    keep = top_beams(live_lp, W)                                               # [B, W]

    # finished: the best W of the old finished and the candidates that ended
    scores = top_lp / brevity_penalty(alpha, (offset + t + 1)[:, None].astype(jnp.float32))
    scores = scores + (~ended) * NEG_INF                                       # [B, 2W]
    all_scores = jnp.concatenate([b.finished_scores, scores], axis=1)          # [B, 3W]
    best = top_beams(all_scores, W)                                            # [B, W]
    new = Beams(
        jnp.take_along_axis(live_lp, keep, axis=1), gather_beams(all_scores, best),
        gather_beams(top_seqs, keep),
        gather_beams(jnp.concatenate([b.finished_seqs, top_seqs], axis=1), best),
        gather_beams(jnp.concatenate([b.finished_flags, ended], axis=1), best))
    return new, jnp.take_along_axis(parents, keep, axis=1), jnp.take_along_axis(ids, keep, axis=1)


def results(b: Beams, steps: Array, eos_id):
    """-> (tokens int32 [B, W, max_len] best first, 0 after EOS; scores float32 [B, W];
    lengths int32 [B, W]: through EOS, else steps [B]): a row's finished beams, or its live
    ones where none finished."""
    any_finished = jnp.any(b.finished_flags, axis=1)                           # [B]
    seqs = jnp.where(any_finished[:, None, None], b.finished_seqs, b.live_seqs)
    scores = jnp.where(any_finished[:, None], b.finished_scores, b.live_logprobs)
    tokens = jnp.flip(seqs[:, :, 1:], axis=1)                                  # [B, W, max_len]
    is_eos = tokens == eos_id
    lengths = jnp.where(jnp.any(is_eos, 2), jnp.argmax(is_eos, 2) + 1, steps[:, None])
    return tokens, jnp.flip(scores, axis=1), lengths.astype(jnp.int32)


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
    B, W = batch, beam_size
    offset = jnp.zeros((B,), jnp.int32) if offset is None else offset.astype(jnp.int32)
    bound = most_penalty(alpha, offset, max_len)

    def running(s: BeamState) -> Array:
        terminated, hopeless = row_tests(s.beams, bound, min_log_prob)
        return (s.step < max_len) & ~jnp.all(terminated) & ~(jnp.all(hopeless) & (s.step > 0))

    def body(s: BeamState) -> BeamState:
        t = jnp.full((B,), s.step)                                             # [B]
        tokens = jax.lax.dynamic_index_in_dim(s.beams.live_seqs, s.step, axis=2)  # [B, W, 1]
        logits, cache = step(s.cache, tokens.reshape(B * W, 1), jnp.full((B * W,), s.step))
        beams, parents, _ = beam_step(s.beams, logits.reshape(B, W, -1), t, offset, eos_id, alpha)
        return BeamState(s.step + 1, beams, gather_cache(cache, parents))

    s = jax.lax.while_loop(running, body, BeamState(jnp.int32(0), init_beams(B, W, max_len, start),
                                                     cache))
    return results(s.beams, jnp.full((B,), s.step), eos_id) + (s.step,)
