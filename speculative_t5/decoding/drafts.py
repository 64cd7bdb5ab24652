"""Drafts: what proposes the gamma tokens of a speculative round, behind one protocol.

A draft is an object with
    state = init(input_ids [B, S], length)          once per decode (a pytree)
    xs [B, G] int32, qs [B, G, V] float32, state = propose(state, seq [B, N], m [B],
                                                          swept [B], gamma, sampling, keys [B])
where seq is the loop's token buffer (seq[:, 0] the start token, seq[:, j] = y_j), m [B]
the tokens emitted so far, swept [B] the rows whose last round accepted every draft (still
running), keys [B] one PRNG key per row for this round. qs[:, i] must be EXACTLY the
distribution xs[:, i] was drawn from: the accept test divides by it, so any q the draft
really sampled from keeps the decode exact (a one-hot q for a deterministic proposal too).
Greedy decoding (`sampling.greedy`) compares drafts with the target's argmax and ignores qs.

Three drafts:
  ModelDraft     a smaller model's step function and cache (built by `generate`)
  PromptLookup   copies what followed the last n-gram's most recent earlier occurrence in
                 the input and the output so far (no model, one-hot q)
  Bigram         a sparse next-token table fitted on token sequences (`Bigram.fit`)
The two zero-cost drafts are pytrees (their settings static), so they pass through `jit`.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.sampling import SamplingConfig, adjust, choose, fold_rows

Array = jax.Array
StepFn = Callable[[Any, Array, Array], Tuple[Array, Any]]


def _take(seq: Array, cols: Array) -> Array:
    """seq [B, N] at per-row columns cols [B, K] -> [B, K]."""
    return jnp.take_along_axis(seq, cols, axis=1)


def one_hot_proposal(xs: Array, vocab_size: int) -> Tuple[Array, Array]:
    """Deterministic drafts xs [B, G] -> (xs int32, their one-hot q [B, G, V] float32)."""
    xs = xs.astype(jnp.int32)
    return xs, jax.nn.one_hot(xs, vocab_size, dtype=jnp.float32)


class ModelDraft(NamedTuple):
    """A draft model as the loop sees it: its step function
    logits [B, K, V], cache = step(cache, tokens [B, K], pos [B]) and a cache builder
    cache(input_ids, length) (None when the caller passes the cache itself)."""
    step: StepFn
    cache: Optional[Callable[[Array, int], Any]] = None

    def init(self, input_ids: Array, length: int):
        return self.cache(input_ids, length)

    def propose(self, dcache, seq: Array, m: Array, swept: Array, gamma: int,
                sampling: SamplingConfig, keys: Array):
        """gamma serial draft steps; step i samples x_i from q_i = adjust(logits_i). After a
        round that accepted every draft, the draft never saw x_gamma (position m-1): then
        the first call feeds positions m-1 and m."""
        draft, greedy, batch = self.step, sampling.greedy, seq.shape[0]

        def feed_two(dcache):
            start = jnp.maximum(m - 1, 0)                                      # [B]
            logits, dcache = draft(dcache, _take(seq, start[:, None] + jnp.arange(2)[None, :]),
                                   start)
            return jnp.take_along_axis(logits, (m - start)[:, None, None], 1)[:, 0], dcache

        def feed_one(dcache):
            logits, dcache = draft(dcache, _take(seq, m[:, None]), m)
            return logits[:, 0], dcache

        logits, dcache = jax.lax.cond(jnp.any(swept), feed_two, feed_one, dcache)
        q1 = adjust(logits, sampling)                                          # [B, V]
        x1 = choose(fold_rows(keys, 0), q1, greedy)                            # [B]
        qs = jnp.zeros((batch, gamma) + q1.shape[-1:], jnp.float32).at[:, 0].set(q1)
        xs = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x1)

        def draft_step(i, carry):                      # feeds x_i at m+i, samples x_{i+1}
            dcache, qs, xs = carry
            logits, dcache = draft(dcache, jax.lax.dynamic_slice_in_dim(xs, i - 1, 1, 1), m + i)
            q = adjust(logits[:, 0], sampling)                                 # [B, V]
            x = choose(fold_rows(keys, i), q, greedy)
            return dcache, qs.at[:, i].set(q), xs.at[:, i].set(x)

        dcache, qs, xs = jax.lax.fori_loop(1, gamma, draft_step, (dcache, qs, xs))
        return xs, qs, dcache


def as_draft(draft):
    """A Draft as is; a bare step function as the model draft it is."""
    return draft if hasattr(draft, "propose") else ModelDraft(draft)


@jax.tree_util.register_pytree_node_class
class PromptLookup:
    """Prompt-lookup drafting (Saxena 2023): for each row, the last n emitted tokens (n from
    max_ngram down to min_ngram, n <= m) are looked up in the row's history -- its input
    tokens (pads dropped) followed by its emitted tokens, the query's own position
    excluded; at the most recent occurrence of the longest n that occurs, the gamma tokens
    that followed it are proposed (a continuation that runs into the query repeats with the
    occurrence's period). No match: the last token, repeated. q is one-hot on each
    proposal, so the decode stays exact. Needs no model; vocab_size is the target's."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: Optional[int] = None):
        for name, v in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PromptLookup {name} must be an int >= 1, got {v!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"PromptLookup min_ngram {min_ngram} > max_ngram {max_ngram}")
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)
        self.vocab_size = vocab_size

    def __repr__(self):
        return f"PromptLookup(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"

    def tree_flatten(self):
        return (), (self.max_ngram, self.min_ngram, self.vocab_size)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*aux)

    def for_vocab(self, vocab_size: int) -> "PromptLookup":
        return type(self)(self.max_ngram, self.min_ngram, int(vocab_size))

    def init(self, input_ids: Array, length: int):
        """(input tokens with pads moved to the end [B, S], non-pad count [B])."""
        is_pad = input_ids == 0
        order = jnp.argsort(is_pad, axis=1, stable=True)                       # non-pad first
        return _take(input_ids, order).astype(jnp.int32), jnp.sum(~is_pad, 1).astype(jnp.int32)

    def history(self, state, seq: Array, m: Array) -> Tuple[Array, Array]:
        """(row history [B, S + N - 1]: the input tokens then y_1..y_m then -1, its length
        [B])."""
        inputs, n_in = state                                                   # [B, S], [B]
        S, N = inputs.shape[1], seq.shape[1]
        j = jnp.arange(S + N - 1)[None, :]                                     # [1, H]
        from_seq = _take(seq, jnp.clip(j - n_in[:, None] + 1, 0, N - 1))
        from_in = _take(inputs, jnp.clip(j, 0, S - 1))
        h = jnp.where(j < n_in[:, None], from_in,
                      jnp.where(j < (n_in + m)[:, None], from_seq, -1))
        return h, n_in + m

    def lookup(self, h: Array, length: Array, m: Array, gamma: int) -> Tuple[Array, Array]:
        """(proposals [B, G], found [B]) for histories h [B, H] of lengths length [B]."""
        B, H = h.shape
        i = jnp.arange(H)[None, :]                                             # [1, H] starts
        start = jnp.full((B,), -1, jnp.int32)                                  # chosen match
        size = jnp.zeros((B,), jnp.int32)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):               # longest first
            match = (i < (length - n)[:, None]) & (n <= m)[:, None]           # earlier starts
            for k in range(n):
                query = _take(h, jnp.maximum(length - n + k, 0)[:, None])      # [B, 1]
                match &= _take(h, jnp.clip(i + k, 0, H - 1)) == query
            last = jnp.max(jnp.where(match, i, -1), axis=1)                    # most recent
            take = (start < 0) & (last >= 0)
            start, size = jnp.where(take, last, start), jnp.where(take, n, size)
        found = start >= 0
        after = start + size                                                   # [B] < length
        period = jnp.maximum(length - after, 1)
        cols = after[:, None] + jnp.arange(gamma)[None, :] % period[:, None]   # [B, G]
        last_token = _take(h, jnp.maximum(length - 1, 0)[:, None])             # [B, 1]
        xs = jnp.where(found[:, None], _take(h, jnp.clip(cols, 0, H - 1)), last_token)
        return jnp.maximum(xs, 0), found

    def propose(self, state, seq: Array, m: Array, swept: Array, gamma: int,
                sampling: SamplingConfig, keys: Array):
        h, length = self.history(state, seq, m)
        xs, _ = self.lookup(h, length, m, gamma)
        xs, qs = one_hot_proposal(xs, self.vocab_size)
        return xs, qs, state


@jax.tree_util.register_pytree_node_class
class Bigram:
    """A bigram draft: q(. | previous token) from a sparse table [V, top] -- each token's
    `top` most frequent successors with their probabilities, the remaining mass spread
    uniformly over the other V - top tokens. Memory V * top, never V x V.
    propose: x_1 ~ adjust(log q(. | y_m)), x_{i+1} ~ adjust(log q(. | x_i)); qs are those
    adjusted distributions (the same temperature / top-k / top-p rule as a model draft)."""

    def __init__(self, successors, probs, rest):
        self.successors = successors      # int32 [V, top]  distinct per row
        self.probs = probs                # float32 [V, top]
        self.rest = rest                  # float32 [V]     each other token's probability

    @property
    def vocab_size(self) -> int:
        return int(self.rest.shape[0])

    def __repr__(self):
        return f"Bigram(vocab_size={self.vocab_size}, top={self.successors.shape[1]})"

    def tree_flatten(self):
        return (self.successors, self.probs, self.rest), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @classmethod
    def fit(cls, token_sequences: Sequence[Sequence[int]], vocab_size: int, top: int = 16,
            smoothing: float = 0.01) -> "Bigram":
        """Count successor pairs in token_sequences (each preceded by the start token 0, so
        q(. | 0) is the first token's distribution; pads inside are counted as tokens).
        q(b | a) = (count(a, b) + smoothing) / (count(a) + smoothing * V) for a's `top`
        most frequent successors (ties: lower id), the rest of a's mass uniform over the
        other tokens; a token never followed by anything gets a uniform row."""
        V = int(vocab_size)
        if V < 2:
            raise ValueError(f"Bigram vocab_size must be >= 2, got {vocab_size!r}")
        if not isinstance(top, (int, np.integer)) or isinstance(top, bool) or top < 1:
            raise ValueError(f"Bigram top must be an int >= 1, got {top!r}")
        if not smoothing >= 0:
            raise ValueError(f"Bigram smoothing must be >= 0, got {smoothing!r}")
        top = min(int(top), V)
        pairs = [np.stack([np.concatenate([[0], s[:-1]]), s], 1)
                 for s in (np.asarray(s, np.int64).reshape(-1) for s in token_sequences) if len(s)]
        pairs = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)
        if pairs.size and (pairs.min() < 0 or pairs.max() >= V):
            raise ValueError(f"Bigram.fit: token ids in [{pairs.min()}, {pairs.max()}], "
                             f"outside [0, {V})")
        codes, counts = np.unique(pairs[:, 0] * V + pairs[:, 1], return_counts=True)
        a, b = codes // V, codes % V
        order = np.lexsort((b, -counts, a))                 # by a, then most frequent first
        a, b, counts = a[order], b[order], counts[order]
        rank = np.arange(len(a)) - np.searchsorted(a, a)    # position among a's successors
        keep = rank < top
        successors = np.full((V, top), -1, np.int64)
        kept = np.zeros((V, top), np.float64)
        successors[a[keep], rank[keep]] = b[keep]
        kept[a[keep], rank[keep]] = counts[keep]
        for row in np.nonzero((successors < 0).any(1))[0]:  # fill with unseen ids, count 0
            free = successors[row] < 0
            used = set(successors[row][~free].tolist())
            successors[row, free] = [t for t in range(V) if t not in used][:int(free.sum())]
        total = np.bincount(pairs[:, 0], minlength=V).astype(np.float64)      # [V]
        denom = total + smoothing * V
        probs = np.where(denom[:, None] > 0, (kept + smoothing) / np.maximum(denom, 1e-300)[:, None],
                         1.0 / V)
        others = V - top
        rest = np.where(others > 0, (1.0 - probs.sum(1)) / max(others, 1), 0.0)
        rest = np.maximum(rest, 0.0)
        return cls(jnp.asarray(successors, jnp.int32), jnp.asarray(probs, jnp.float32),
                   jnp.asarray(rest, jnp.float32))

    def table(self, prev: Array) -> Array:
        """q(. | prev) for prev [B] -> [B, V]."""
        q = jnp.broadcast_to(self.rest[prev][:, None], prev.shape + (self.vocab_size,))
        rows = jnp.arange(prev.shape[0])[:, None]
        return q.at[rows, self.successors[prev]].set(self.probs[prev])

    def init(self, input_ids: Array, length: int):
        return ()

    def propose(self, state, seq: Array, m: Array, swept: Array, gamma: int,
                sampling: SamplingConfig, keys: Array):
        prev = _take(seq, m[:, None])[:, 0]                                   # [B] y_m
        xs, qs = [], []
        for i in range(gamma):                                  # gamma table look-ups
            q = adjust(jnp.log(self.table(prev)), sampling)                    # [B, V]
            prev = choose(fold_rows(keys, i), q, sampling.greedy)
            xs.append(prev)
            qs.append(q)
        return jnp.stack(xs, 1), jnp.stack(qs, 1), state
