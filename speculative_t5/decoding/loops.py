"""The decode loops: plain (one token per target call) and speculative (Algorithm 1, with
token-wise or block verification).

Each is one `lax.while_loop` (no host round-trip per token or round) over a batch of rows
with per-row state. The loops know nothing of T5: a model is a step function
    logits [B, K, V], cache = step(cache, tokens [B, K], pos [B])
that writes tokens at positions pos..pos+K-1 of an opaque cache by overwrite, so
positions beyond a row's accepted tokens are simply rewritten next round. The speculative
loop's drafts come from a `drafts` object (`propose` -> up to gamma tokens and the q each
was drawn from): a draft model's step function, prompt lookup, a bigram table, a fallback.

Token buffer: seq[:, 0] is the start token (0), seq[:, j] the j-th emitted token y_j; the
model's output at position j predicts y_{j+1}.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp

from speculative_t5.decoding.output import emit, init_stats, record_call
from speculative_t5.decoding.sampling import (VERIFIERS, SamplingConfig, adjust, choose,
                                              check_verification, split_rows)

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
    target_cache: Any
    draft_state: Any    # the draft's own state (a draft model's cache and what it holds)
    rng: Array          # [B]
    stats: Dict[str, Array]


def _running(state) -> Array:
    return ~jnp.all(state.done)


def _take(seq: Array, cols: Array) -> Array:
    """seq [B, N] at per-row columns cols [B, K] -> [B, K]."""
    return jnp.take_along_axis(seq, cols, axis=1)


def _plain_step(step: StepFn, s, key: Array, sampling: SamplingConfig, eos_id: int,
                max_len: int):
    """One target call at each row's position m, one token from it (keys [B]) ->
    (seq, m, done, emitted [B], the target's cache)."""
    cache = s.cache if isinstance(s, PlainState) else s.target_cache
    logits, cache = step(cache, _take(s.seq, s.m[:, None]), s.m)                # [B, 1, V]
    token = choose(key, adjust(logits[:, 0], sampling), sampling.greedy)       # [B]
    return emit(s.seq, s.m, s.done, token[:, None], jnp.ones_like(s.m), eos_id, max_len) + (cache,)


def adaptive_widths(gamma: int) -> Tuple[int, ...]:
    """The draft counts an adaptive decode compiles a round for: gamma, gamma // 2, ...,
    down to 1 (8 -> 1, 2, 4, 8). A round drafting g verifies at the narrowest that holds g."""
    return tuple(sorted({gamma >> k for k in range(gamma.bit_length())} - {0}))


def round_costs(costs: Array, gamma: int, widths: Tuple[int, ...] = (), idle: Any = 0) -> Array:
    """What a round drafting g = 0..gamma costs, in plain steps [..., G+1] (idle [...]):
    a plain step 1; else g c + the verify pass of the narrowest width in `widths` (and
    gamma) that holds g, v1 + (v - v1)(width - 1)/(gamma - 1), + the draft model's catch-up
    after `idle` plain rounds: (idle + 2) positions in (gamma + 1)-token feeds of w each,
    in place of one draft step c. costs: [c, v, v1, w] (`GammaCosts.resolved`)."""
    ws = sorted(set(widths) | {gamma})
    width = jnp.asarray([min(w for w in ws if w >= i) for i in range(gamma + 1)], jnp.float32)
    c, v, v1, w = costs[0], costs[1], costs[2], costs[3]
    verify = v1 + (v - v1) * (width - 1.0) / max(gamma - 1, 1)                # [G+1]
    idle = jnp.asarray(idle, jnp.float32)[..., None]                          # [..., 1]
    feeds = jnp.ceil((idle + 2.0) / (gamma + 1))                              # catch-up chunks
    catch_up = jnp.where(idle > 0, feeds * w - c, 0.0)                        # [..., 1]
    g = jnp.arange(gamma + 1, dtype=jnp.float32)                              # [G+1]
    return jnp.where(g == 0, 1.0, g * c + verify + catch_up)                  # [..., G+1]


def choose_gamma(alpha: Array, costs: Array, gamma: int, rows: Any = 1,
                 remaining: Any = None, widths: Tuple[int, ...] = (), idle: Any = 0) -> Array:
    """The round's gamma in 0..gamma that finishes the batch soonest per unit of target
    time, each count priced by `round_costs` (a plain step, g = 0, costs 1 and gives every
    row 1 token; the round that resumes drafting after `idle` plain rounds pays the draft
    model's catch-up: at batch 64 here, 44 plain rounds cost ~1.4 plain steps of it).

    One row (rows = 1) is eq. (5): the most expected tokens per unit of time,
    (1 - alpha^(g+1)) / ((1 - alpha)(g c + v)). A batch runs until its slowest row is
    done, so with `rows` active rows that each still need up to `remaining` tokens the
    batch advances at its unluckiest row's pace: a row's total after n rounds is about
    n mu_g - z sigma_g sqrt(n) at the expected minimum over the rows (z: the expected
    maximum of `rows` standard normals, Blom's approximation), i.e. mu_g - z sigma_g
    sqrt(mu_g / remaining) tokens a round (mu_g, sigma_g: the mean and spread of a round's
    tokens, 1 + a truncated geometric, at most `remaining`). At least 1 (every round gives
    every row a token) and never less than a smaller g's (more drafts accept a superset);
    ties go to the larger g."""
    g = jnp.arange(gamma + 1, dtype=jnp.float32)[:, None]                     # [G+1, 1]
    j = jnp.arange(gamma + 1, dtype=jnp.float32)[None, :]                     # [1, G+1]
    a = jnp.clip(alpha, 0.0, 0.999)
    p = jnp.where(j < g, a ** j * (1.0 - a), jnp.where(j == g, a ** g, 0.0))  # [G+1, G+1] P(j accepted)
    left = jnp.maximum(jnp.asarray(jnp.inf if remaining is None else remaining, jnp.float32), 1.0)
    tokens = jnp.minimum(j + 1.0, left)                                       # [1, G+1] a round's
    mean = jnp.sum(tokens * p, axis=1)                                        # [G+1]
    spread = jnp.sqrt(jnp.maximum(jnp.sum(tokens ** 2 * p, axis=1) - mean ** 2, 0.0))
    k = jnp.maximum(jnp.asarray(rows, jnp.float32), 1.0)
    z = jax.scipy.special.ndtri((k - 0.375) / (k + 0.25))                     # 0 for one row
    pace = jax.lax.cummax(jnp.maximum(mean - z * spread * jnp.sqrt(mean / left), 1.0))
    cost = round_costs(costs, gamma, widths, idle)                            # [G+1]
    return (gamma - jnp.argmax((pace / cost)[::-1])).astype(jnp.int32)


def running_alpha(stats: Dict[str, Array], active: Array) -> Array:
    """The acceptance rate the batch's slowest active row drafts at (a loop runs as long as
    its slowest row): each row's accepted / reached drafts shrunk toward the active rows'
    pooled rate, the least over the active rows [B]. How far to shrink is estimated from the
    rows themselves (empirical Bayes, a beta-binomial prior worth k drafts, k = p(1 - p) /
    tau^2 from the between-row variance tau^2 by the method of moments, at least 4): at
    T = 1, where rows differ mostly by chance, the least of lightly shrunk rates was biased
    low and chose too few drafts (adaptive gamma replayed on real decodes at T = 1, batch 8:
    0.943 of the best fixed gamma before, 1.013 with this); greedy rows that truly differ stay
    apart (batch 64: 1.01x plain before, 0.99x). The pooled rate starts from a prior of 3/4
    worth 16 drafts, so a short unlucky start does not end speculation (a plain round adds
    no evidence); one row is its pooled rate."""
    accepted = stats["accepted_at"].sum(1).astype(jnp.float32)                    # [B]
    reached = stats["reached_at"].sum(1).astype(jnp.float32)                      # [B]
    seen = active & (reached > 0)
    a, r = jnp.where(seen, accepted, 0.0), jnp.where(seen, reached, 0.0)          # [B]
    n, total = jnp.sum(seen), jnp.sum(r)
    pooled = (jnp.sum(a) + 12.0) / (total + 16.0)
    spread = jnp.sum(r * (a / jnp.maximum(r, 1.0) - pooled) ** 2)    # ~ chance + tau^2 dof
    chance = (n - 1.0) * pooled * (1.0 - pooled)
    dof = total - jnp.sum(r ** 2) / jnp.maximum(total, 1.0)          # > 0 once n > 1
    tau2 = jnp.where(n > 1, jnp.maximum(spread - chance, 0.0) / jnp.maximum(dof, 1e-6), 0.0)
    k = jnp.clip(pooled * (1.0 - pooled) / jnp.maximum(tau2, 1e-9), 4.0, 1e6)
    rows = (accepted + k * pooled) / (reached + k)                                # [B]
    return jnp.min(jnp.where(active, rows, 1.0))


def _buffer(batch: int, max_len: int, start) -> Array:
    """The token buffer [B, max_len + 2]: seq[:, 0] = start ([B]; 0, T5's start token, by
    default; a decoder-only model's last prompt token), the rest to be emitted."""
    seq = jnp.zeros((batch, max_len + 2), jnp.int32)
    return seq if start is None else seq.at[:, 0].set(start.astype(jnp.int32))


def plain_decode(step: StepFn, cache: Any, batch: int, max_len: int, eos_id: int,
                 sampling: SamplingConfig, rng: Array, start: Any = None):
    """T5X `temperature_sample` semantics: one target call per emitted token. rng [B]: a
    PRNG key per row; start [B]: each row's first token (see `_buffer`)."""
    state = PlainState(_buffer(batch, max_len, start), jnp.zeros((batch,), jnp.int32),
                       jnp.zeros((batch,), bool), cache, rng, init_stats(batch, 0))

    def body(s: PlainState) -> PlainState:
        rng, key = split_rows(s.rng, 2)
        seq, m, done, emitted, cache = _plain_step(step, s, key, sampling, eos_id, max_len)
        return PlainState(seq, m, done, cache, rng, record_call(s.stats, ~s.done, emitted, 0))

    s = jax.lax.while_loop(_running, body, state)
    return s.seq[:, 1:max_len + 1], s.m, s.stats


def speculative_decode(target: StepFn, target_cache: Any, draft, draft_state: Any,
                       batch: int, max_len: int, eos_id: int, gamma: int,
                       sampling: SamplingConfig, rng: Array, lenience: float = 1.0,
                       verification: str = "token", costs: Any = None, start: Any = None):
    """Algorithm 1 of Leviathan et al. (2023), batched; every row emits >= 1 token a round.
    rng [B]: a PRNG key per row. verification: "token" (`verify`) or "block" (`verify_block`,
    Sun et al. 2025) decides how many drafts a round accepts. draft: a draft (`drafts`: a
    `ModelDraft` around a draft model's step function, ...) whose `init` made draft_state.
    costs: adaptive gamma -- [c, v, v1, w] (traced): each round drafts at most `choose_gamma` of
    the running acceptance rate of the slowest active row (`running_alpha`; the first
    round drafts as if every draft were accepted), the active rows and their longest
    remaining budget; it verifies at the narrowest of `adaptive_widths(gamma)` that holds
    that count, and makes a plain target step when it is 0 (the draft then catches up
    later, priced by the plain rounds since it last drafted). Chosen from past rounds only,
    so still exact.
    start [B]: each row's first token (see `_buffer`)."""
    greedy = sampling.greedy
    widths = adaptive_widths(gamma)
    verify = VERIFIERS[check_verification(verification, lenience)]
    state = SpeculativeState(_buffer(batch, max_len, start),
                             jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool),
                             target_cache, draft_state, rng, init_stats(batch, gamma))

    def round_(s: SpeculativeState, limit=None, width: int = gamma) -> SpeculativeState:
        # width: the drafts this round's shapes hold (G below; gamma but in adaptive rounds)
        seq, m = s.seq, s.m
        rng, k_draft, k_verify = split_rows(s.rng, 3)
        steps = jnp.arange(width + 1)[None, :]                                 # [1, G+1]

        # 1. Draft up to G tokens x_1..x_count, each drawn from its q_i.
        d = draft.propose(s.draft_state, seq, m, ~s.done, width, sampling, k_draft, limit)
        xs, qs = d.xs, d.qs                                                    # [B, G], [B, G, V]

        # 2. Verify: one target call over [y_m, x_1..x_G] -> p_1..p_{G+1}.
        tokens = jnp.concatenate([_take(seq, m[:, None]), xs], axis=1)         # [B, G+1]
        logits, tcache = target(s.target_cache, tokens, m)                     # [B, G+1, V]
        p = adjust(logits, sampling)

        # 3-4. Accept a prefix of n drafts, then one token from the target's side.
        n, nxt, accepted = verify(k_verify, p, qs, xs, greedy, lenience, d.count)
        new = jnp.where(steps < n[:, None], jnp.pad(xs, ((0, 0), (0, 1))),
                        jnp.where(steps == n[:, None], nxt[:, None], 0))       # [B, G+1]
        seq, m, done, emitted = emit(seq, m, s.done, new, n + 1, eos_id, max_len)
        proposed = steps[:, :width] < d.count[:, None]                         # [B, G]
        reached = jnp.pad(accepted[:, :-1], ((0, 0), (1, 0)), constant_values=True) & proposed
        accepted, reached = (jnp.pad(x, ((0, 0), (0, gamma - width))) for x in (accepted, reached))
        stats = record_call(s.stats, ~s.done, emitted, d.count, accepted, reached, d.wide_first,
                            d.model_steps)
        return SpeculativeState(seq, m, done, tcache, d.state, rng, stats)

    def plain_round(s: SpeculativeState) -> SpeculativeState:
        rng, key = split_rows(s.rng, 2)
        seq, m, done, emitted, tcache = _plain_step(target, s, key, sampling, eos_id, max_len)
        no = jnp.zeros((batch, gamma), bool)
        stats = record_call(s.stats, ~s.done, emitted, 0, no, no, no[:, 0])
        return SpeculativeState(seq, m, done, tcache, s.draft_state, rng, stats)

    def gamma_now(s: SpeculativeState, idle: Array) -> Array:
        # the first round drafts as if every draft were accepted: speculation is tried
        # wherever it could pay (a plain round adds no evidence, so a cautious start would
        # never learn); later rounds go by the drafts so far
        first = jnp.all(s.stats["target_calls"] == 0)
        alpha = jnp.where(first, 1.0, running_alpha(s.stats, ~s.done))
        left = jnp.max(jnp.where(s.done, 0, max_len - s.m))                   # the longest budget
        return choose_gamma(alpha, costs, gamma, jnp.sum(~s.done), left, widths, idle)

    def adaptive_rounds(c):
        # c: (state, the count gamma_now chose for its next round -- chosen once a round and
        # carried, as the loops' conditions and the round all read it --, the plain rounds
        # since the last drafting round). Each round as chosen: plain rounds, then rounds of
        # each width (the narrowest that holds the count), in one inner loop per width rather
        # than a lax.cond per round (a cond's operands, the caches, were copied every round:
        # a plain round cost 1.6x a plain step at batch 32)
        def then(s, idle):
            return s, gamma_now(s, idle), idle
        c = jax.lax.while_loop(lambda c: _running(c[0]) & (c[1] == 0),
                               lambda c: then(plain_round(c[0]), c[2] + 1), c)
        for lo, w in zip((0,) + widths, widths):
            c = jax.lax.while_loop(lambda c, lo=lo, w=w: _running(c[0]) & (c[1] > lo) & (c[1] <= w),
                                   lambda c, w=w: then(round_(c[0], c[1], w), jnp.int32(0)), c)
        return c

    if costs is None:
        s = jax.lax.while_loop(_running, round_, state)
    else:
        none = jnp.int32(0)
        s, _, _ = jax.lax.while_loop(lambda c: _running(c[0]), adaptive_rounds,
                                     (state, gamma_now(state, none), none))
    return s.seq[:, 1:max_len + 1], s.m, s.stats
