"""Exact speculative beam search: T5X's beam search (`beam`) with several beam steps per
target call, the same beams, scores and lengths as the plain loop.

A round, per batch row (B rows of W live beams; P >= W path rows each):
1. Draft (`propose`): the draft model runs a beam search D = max(W, P - W) wide (T5X's
   candidates, `beam.expand`, the top D that do not end in EOS) for gamma steps from the
   live beams, on P path rows (wider than W: the target's next beams are then among the
   draft's far more often; on the demo pair at beam 4, 16 rows took 1.6 beam steps a call
   against 1.2 for a W-wide search). A path row starts at a live beam (row j at live beam j, the rest free) and is
   extended by one draft beam: a beam's best child continues its parent's row, each other
   child takes a free row, copied from the parent's (tokens and draft cache); a row whose
   beam has no child keeps its prefix (the draft beam search still passed through it) and
   goes on with the draft's argmax. A child with no free row left is not drafted further.
   -> paths [B, P, gamma + 1]: a live beam's last token, then gamma drafted tokens.
2. Verify: ONE target call over the B * P path rows, tokens [last, x_1..x_gamma] at each
   row's position t, each row's target cache gathered from its live beam: the target's
   logits for every prefix on a path.
3. Replay (`replay`): T5X's `beam.beam_step` on those logits, step after step, while every
   live beam of the row is a prefix on some path (step s reads the logits at position s of
   a path through it: the first step always is, so >= 1 step per call), with T5X's
   termination test before each step. So the beams are the plain loop's whatever the
   draft proposes; the draft only decides how many steps a call covers (up to gamma + 1).
4. Each new live beam's target and draft caches are gathered from the path row holding its
   parent: that row's positions before the beam's last token hold the beam's prefix (later
   ones are stale and overwritten next round, as the speculative loop rolls back). The
   draft's first call of a round feeds two tokens (positions t - 1 and t), since a beam
   whose parent was a path's last node left position t - 1 unfed.

Rows step independently (each has its own step count t); a row stops at its own
termination test. T5X's test is batch-wide, but a terminated row's finished set no longer
changes (no later candidate can beat its worst finished beam), except that each further
step re-sorts it, which swaps finished beams of exactly equal scores; `finish` replays that
(the parity of the steps the batch ran after the row stopped). min_log_prob's test is per
row here (the engine never sets it).
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple

import jax
import jax.numpy as jnp

from speculative_t5.decoding.beam import (NEG_INF, Beams, beam_step, expand, gather_beams,
                                          gather_cache, init_beams, most_penalty, results,
                                          row_tests, top_beams)
from speculative_t5.decoding.loops import StepFn

Array = jax.Array


class Paths(NamedTuple):
    tokens: Array       # [B, P, G + 1] the root beam's last token, then x_1..x_G
    root: Array         # [B, P] the live beam each path starts from
    cache: Any          # the draft's cache over B * P rows, fed along each path


class SpeculativeBeamState(NamedTuple):
    t: Array            # [B] beam steps each row has taken
    beams: Beams
    target_cache: Any   # over B * W rows (the live beams)
    draft_cache: Any    # over B * W rows
    stats: Dict[str, Array]


def _scatter_rows(x: Array, rows: Array, values: Array) -> Array:
    """x [B, P] with x[b, rows[b, i]] = values[b, i] where rows >= 0 (others dropped)."""
    rows = jnp.where(rows >= 0, rows, x.shape[1])
    return x.at[jnp.arange(x.shape[0])[:, None], rows].set(values, mode="drop")


def _take(x: Array, idx: Array) -> Array:
    """x [B, K, ...] at per-row indices idx [B, W] (negative: clamped to 0)."""
    return gather_beams(x, jnp.maximum(idx, 0))


def assign_rows(parents: Array, parent_row: Array, free: Array):
    """Path rows for the draft's new beams (parents [B, W]: each one's parent beam, ascending
    as T5X keeps them; parent_row [B, W]: the parent's row, -1 for none): a parent's best
    child (the last of its children) continues the parent's row, the others take free rows
    (free [B, P]), best first, while any is left -> (row [B, W], -1 for none; src [B, P]:
    the row each path row copies, itself where it keeps its own)."""
    B, W = parents.shape
    P = free.shape[1]
    i = jnp.arange(W)
    later = (parents[:, :, None] == parents[:, None, :]) & (i[None, :] > i[:, None])
    best = ~jnp.any(later, 2) & (parent_row >= 0)                              # [B, W]
    need = ~best & (parent_row >= 0)
    before = jnp.flip(jnp.cumsum(jnp.flip(need, 1), 1), 1) - need              # better ones needing
    free_rows = jnp.argsort(~free, axis=1, stable=True)                        # the free ones first
    got = need & (before < jnp.sum(free, 1, keepdims=True))
    new_row = jnp.where(got, jnp.take_along_axis(free_rows, jnp.minimum(before, P - 1), 1), -1)
    src = _scatter_rows(jnp.broadcast_to(jnp.arange(P), (B, P)), new_row, parent_row)
    return jnp.where(best, parent_row, new_row), src


def propose(draft: StepFn, cache: Any, beams: Beams, t: Array, gamma: int, paths: int,
            eos_id) -> Paths:
    """The draft's beam search from the live beams (cache over B * W rows), gamma steps
    on `paths` rows (see the module's docstring) -> Paths."""
    B, W, L = beams.live_seqs.shape
    P, rows = paths, jnp.arange(paths)[None, :]                                # [1, P]
    root = jnp.tile(jnp.minimum(jnp.arange(P), W - 1), (B, 1))                 # [B, P]
    cache = gather_cache(cache, root, W)                                       # B * P rows
    seqs = gather_beams(beams.live_seqs, root)                                 # [B, P, L]
    first = jnp.maximum(t - 1, 0)                                              # [B]
    cols = jnp.minimum(first[:, None, None] + jnp.arange(2), L - 1)            # [B, 1, 2]
    two = jnp.take_along_axis(seqs, jnp.broadcast_to(cols, (B, P, 2)), axis=2)  # [B, P, 2]
    logits, cache = draft(cache, two.reshape(B * P, 2), jnp.repeat(first, P))
    logits = logits.reshape(B, P, 2, -1)
    logits = jnp.take_along_axis(logits, (t - first)[:, None, None, None], axis=2)[:, :, 0]
    last = jnp.take_along_axis(seqs, jnp.broadcast_to(t[:, None, None], (B, P, 1)), axis=2)
    tokens = jnp.zeros((B, P, gamma + 1), jnp.int32).at[:, :, :1].set(last)
    # the draft's beam search is D wide: the live beams, then the best D children at each
    # depth (D = P - W: a parent's best child keeps its row, the others fill the free ones)
    D = max(W, P - W)
    row0 = jnp.where(jnp.arange(D) < W, jnp.arange(D), -1)                      # [D]
    lp0 = jnp.full((B, D), 2 * NEG_INF, jnp.float32).at[:, :W].set(beams.live_logprobs)
    c = (logits, cache, tokens, root, jnp.tile(row0, (B, 1)),               # row of each beam
         lp0, jnp.broadcast_to(rows >= W, (B, P)))                            # free rows

    def grow(k, c):  # the draft's beam step k: the children at depth k + 1 and their rows
        logits, cache, tokens, root, row, lp, free = c
        lp = jnp.where(row >= 0, lp, 2 * NEG_INF)   # a beam left without a row: its children last
        top_lp, ids, parents = expand(_take(logits, row), lp)                   # [B, 2W]
        live_lp = top_lp + (ids == eos_id) * NEG_INF
        keep = top_beams(live_lp, D)                                            # [B, D] ascending
        lp, parents, ids = (jnp.take_along_axis(x, keep, axis=1) for x in (live_lp, parents, ids))
        row, src = assign_rows(parents, jnp.take_along_axis(row, parents, axis=1), free)
        free = free & (src == rows)
        tokens, root = gather_beams(tokens, src), jnp.take_along_axis(root, src, 1)
        nxt = _scatter_rows(jnp.argmax(logits, -1).astype(jnp.int32), row, ids)  # [B, P]
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, nxt[:, :, None], k + 1, 2)
        return logits, gather_cache(cache, src), tokens, root, row, lp, free

    def depth(k, c):  # grow, then the draft's logits for the new depth
        logits, cache, tokens, *rest = grow(k, c)
        nxt = jax.lax.dynamic_index_in_dim(tokens, k + 1, 2, keepdims=False)  # [B, P]
        logits, cache = _feed(draft, cache, nxt, t + k + 1)
        return (logits, cache, tokens, *rest)

    _, cache, tokens, root, *_ = grow(gamma - 1, jax.lax.fori_loop(0, gamma - 1, depth, c))
    return Paths(tokens, root, cache)


def _feed(step: StepFn, cache: Any, tokens: Array, pos: Array):
    """One token per path row (tokens [B, P]) at each batch row's position pos [B]."""
    B, P = tokens.shape
    logits, cache = step(cache, tokens.reshape(B * P, 1), jnp.repeat(pos, P))
    return logits.reshape(B, P, -1), cache


def replay(beams: Beams, t: Array, paths: Paths, logits: Array, active: Array, offset: Array,
           eos_id, alpha, bound: Array, max_len: int, min_log_prob: float):
    """T5X's beam steps on the target's path logits [B, P, G + 1, V] while each row is
    active, not stopped (T5X's test) and covered (every live beam a prefix on a path)
    -> (beams, t, steps [B] taken, parent_row [B, W]: the path row holding each live beam's
    parent, or the beam's own row where the row took no step)."""
    B, W = beams.live_logprobs.shape
    G = paths.tokens.shape[2] - 1
    # same[b, p, q, k]: paths p and q agree through depth k (same root, same tokens)
    same = jnp.cumprod(paths.tokens[:, :, None, :] == paths.tokens[:, None, :, :], axis=3)
    same = same.astype(bool) & (paths.root[:, :, None] == paths.root[:, None, :])[..., None]
    node = jnp.tile(jnp.arange(W), (B, 1))   # a path row through each live beam (-1: none)

    def going(c):
        k, _, _, _, _, on = c
        return (k <= G) & jnp.any(on)

    def step(c):
        k, beams, t, node, parent_row, on = c
        terminated, hopeless = row_tests(beams, bound, min_log_prob)
        on = on & (t < max_len) & ~terminated & ~(hopeless & (t > 0)) & jnp.all(node >= 0, 1)
        at_k = jax.lax.dynamic_index_in_dim(logits, k, axis=2, keepdims=False)  # [B, P, V]
        new, parents, ids = beam_step(beams, _take(at_k, node), t, offset, eos_id, alpha)
        beams = jax.tree_util.tree_map(
            lambda a, b: jnp.where(on.reshape((B,) + (1,) * (a.ndim - 1)), a, b), new, beams)
        prow = jnp.take_along_axis(node, parents, axis=1)                      # [B, W]
        # the child's path: one through its parent whose next token is the child's
        through = _take(jax.lax.dynamic_index_in_dim(same, k, axis=3, keepdims=False), prow)
        nxt = jax.lax.dynamic_index_in_dim(paths.tokens, jnp.minimum(k + 1, G), 2, False)
        match = through & (nxt[:, None, :] == ids[:, :, None]) & (k < G)       # [B, W, P]
        child = jnp.where(jnp.any(match, 2), jnp.argmax(match, 2), -1)
        return (k + 1, beams, t + on, jnp.where(on[:, None], child, node),
                jnp.where(on[:, None], prow, parent_row), on)

    c = (jnp.int32(0), beams, t, node, node, active)
    _, beams, t_new, _, parent_row, _ = jax.lax.while_loop(going, step, c)
    return beams, t_new, t_new - t, parent_row


def finish(beams: Beams, t: Array) -> Beams:
    """A row that stopped before the batch's last step: each step T5X ran after it re-sorts
    its finished set with `top_beams` (which swaps tied scores), so it is sorted once more
    where that count is odd."""
    odd = ((jnp.max(t) - t) % 2 == 1)                                          # [B]
    W = beams.finished_scores.shape[1]
    order = jnp.where(odd[:, None], top_beams(beams.finished_scores, W), jnp.arange(W)[None, :])
    return beams._replace(finished_scores=jnp.take_along_axis(beams.finished_scores, order, 1),
                          finished_seqs=gather_beams(beams.finished_seqs, order),
                          finished_flags=jnp.take_along_axis(beams.finished_flags, order, 1))


def speculative_beam_search(target: StepFn, target_cache: Any, draft: StepFn, draft_cache: Any,
                            batch: int, beam_size: int, max_len: int, eos_id, alpha,
                            gamma: int, paths: int, start: Any = None, offset: Any = None,
                            min_log_prob: float = NEG_INF):
    """T5X beam search (`beam.beam_search`'s arguments and results) with a draft model:
    target_cache and draft_cache over B * W rows (each row's cache repeated per beam),
    gamma draft steps a round on `paths` >= W path rows per batch row.
    -> (tokens [B, W, max_len], scores [B, W], lengths [B, W], stats: per row target_calls
    (rounds the row took part in, one target call each), draft_calls (draft-model calls),
    beam_steps (the row's steps), steps_per_call_hist [B, gamma + 2] (rounds by steps
    covered); rounds [B]: the loop's rounds, the batch's target calls)."""
    B, W, G, P = batch, beam_size, gamma, paths
    if P < W:
        raise ValueError(f"paths ({P}) must be >= beam_size ({W}): every live beam needs a path")
    offset = jnp.zeros((B,), jnp.int32) if offset is None else offset.astype(jnp.int32)
    bound = most_penalty(alpha, offset, max_len)
    zeros = jnp.zeros((B,), jnp.int32)
    stats = {"target_calls": zeros, "draft_calls": zeros, "rounds": zeros,
             "steps_per_call_hist": jnp.zeros((B, G + 2), jnp.int32)}
    state = SpeculativeBeamState(zeros, init_beams(B, W, max_len, start), target_cache,
                                 draft_cache, stats)

    def active(s: SpeculativeBeamState) -> Array:
        terminated, hopeless = row_tests(s.beams, bound, min_log_prob)
        return (s.t < max_len) & ~terminated & ~(hopeless & (s.t > 0))        # [B]

    def round_(s: SpeculativeBeamState) -> SpeculativeBeamState:
        on = active(s)
        p = propose(draft, s.draft_cache, s.beams, s.t, G, P, eos_id)
        tcache = gather_cache(s.target_cache, p.root, W)                       # B * P rows
        logits, tcache = target(tcache, p.tokens.reshape(B * P, G + 1), jnp.repeat(s.t, P))
        logits = logits.reshape(B, P, G + 1, -1)
        beams, t, steps, parent_row = replay(s.beams, s.t, p, logits, on, offset, eos_id,
                                             alpha, bound, max_len, min_log_prob)
        a = on.astype(jnp.int32)
        st = s.stats
        stats = {"target_calls": st["target_calls"] + a, "rounds": st["rounds"] + 1,
                 "draft_calls": st["draft_calls"] + G * a,
                 "steps_per_call_hist": st["steps_per_call_hist"]
                 + jax.nn.one_hot(steps, G + 2, dtype=jnp.int32) * a[:, None]}
        return SpeculativeBeamState(t, beams, gather_cache(tcache, parent_row, P),
                                    gather_cache(p.cache, parent_row, P), stats)

    s = jax.lax.while_loop(lambda s: jnp.any(active(s)), round_, state)
    tokens, scores, lengths = results(finish(s.beams, s.t), s.t, eos_id)
    return tokens, scores, lengths, dict(s.stats, beam_steps=s.t)
