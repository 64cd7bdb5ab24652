"""Drafts: what proposes the gamma tokens of a speculative round, behind one protocol.

A draft is an object with
    state = init(input_ids [B, S], length, mask [B, S])   once per decode (a pytree; mask:
                                                          the input's real tokens)
    Proposal(xs [B, G], qs [B, G, V], count [B], wide_first [B], state[, model_steps [B]])
          = propose(state, seq [B, N], m [B], active [B], gamma, sampling, keys [B], limit)
where seq is the loop's token buffer (seq[:, 0] the start token, seq[:, j] = y_j), m [B]
the tokens emitted so far, active [B] the rows still decoding, keys [B] one PRNG key per
row for this round, limit None or a traced int in 1..gamma (adaptive gamma: this round's
most). count [B] <= limit is how many drafts a row proposes (xs[:, count:] are not
proposals; 0 makes the round a plain target step); the decision to draft x_{i+1} may
depend on x_1..x_i and anything before, never on x_{i+1} itself. qs[:, i] must be EXACTLY
the distribution xs[:, i] was drawn from: the accept test divides by it, so any q the draft
really sampled from keeps the decode exact (a one-hot q for a deterministic proposal too).
Greedy decoding (`sampling.greedy`) compares drafts with the target's argmax and ignores qs.
model_steps: the draft-model steps the round ran for each row (counted in the statistics,
so a cost model charges a fallback's model only for the rounds it drafted); None: no model.

Four drafts:
  ModelDraft     a smaller model's step function and cache (built by `generate`);
                 `stop`: end a row's drafting once its draft is unsure (draft_stop)
  PromptLookup   copies what followed the last n-gram's most recent earlier occurrence in
                 the input and the output so far (no model, one-hot q)
  Bigram         a sparse next-token table fitted on token sequences (`Bigram.fit`)
  Fallback       per row, the first draft where it proposes, else the second
The zero-cost drafts and Fallback are pytrees (their settings static), so they pass
through `jit`.
"""
from __future__ import annotations

import contextlib
import os
import zipfile
import zlib
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.sampling import SamplingConfig, adjust, branch, choose, fold_rows

Array = jax.Array
StepFn = Callable[[Any, Array, Array], Tuple[Array, Any]]


class Proposal(NamedTuple):
    xs: Array           # [B, G] int32 drafted tokens
    qs: Array           # [B, G, V] float32 the distribution each was drawn from
    count: Array        # [B] int32 drafts proposed (<= G)
    wide_first: Array   # [B] bool a draft model's first call fed more than one token
    state: Any          # the draft's state for the next round
    model_steps: Any = None  # [B] int32 draft-model steps run for the row (None: no model)


def _take(seq: Array, cols: Array) -> Array:
    """seq [B, N] at per-row columns cols [B, K] -> [B, K]."""
    return jnp.take_along_axis(seq, cols, axis=1)


def one_hot_proposal(xs: Array, vocab_size: int) -> Tuple[Array, Array]:
    """Deterministic drafts xs [B, G] -> (xs int32, their one-hot q [B, G, V] float32)."""
    xs = xs.astype(jnp.int32)
    return xs, jax.nn.one_hot(xs, vocab_size, dtype=jnp.float32)


def _full(count, batch: int) -> Array:
    return jnp.full((batch,), count, jnp.int32)


class ModelState(NamedTuple):
    cache: Any          # the draft model's cache
    fed: Array          # [B, L] the token written at each cache position (-1: none valid)


class ModelDraft(NamedTuple):
    """A draft model as the loop sees it: its step function
    logits [B, K, V], cache = step(cache, tokens [B, K], pos [B]) and a cache builder
    cache(input_ids, length) (None when the caller passes the cache itself).

    The state remembers which token each cache position was written with, so a round
    first feeds exactly the positions whose tokens differ from the accepted ones, up to
    y_m: one token after a rejection, two after a round that accepted every draft (the
    draft never fed x_gamma), more after rounds another draft proposed (`catch_up`, set by
    `Fallback`: a loop of (gamma + 1)-token feeds; without it that branch is not compiled).
    stop: draft_stop -- a row stops drafting after a token its draft gave probability
    below `stop` (q when sampling, the softmax when greedy); the token itself is proposed,
    so the decision to draft the next depends only on tokens already drafted (exact). The
    draft calls end when every active row has stopped.
    feed_two: every round's first call feeds two tokens, y_{m-1} again where only y_m is new
    (the same token at the same position: the same keys and values). No branch then picks
    the width, and XLA copies a conditional's operands -- on a TPU the draft's whole cache
    each round (`speculative-t5 compile`). `generate` sets it off CPUs, where a two-token
    step costs more than a one-token one."""
    step: StepFn
    cache: Optional[Callable[[Array, int], Any]] = None
    stop: Optional[float] = None
    catch_up: bool = False
    keep: Optional[Callable] = None  # keep(cache, pos, path, depth): a token tree's path kept
    feed_two: bool = False

    def init(self, input_ids: Array, length: int, mask: Optional[Array] = None) -> ModelState:
        return ModelState(self.cache(input_ids, length),
                          jnp.full((input_ids.shape[0], length), -1, jnp.int32))

    def _feed(self, state: ModelState, seq: Array, m: Array, valid: Array, width: int):
        """Feed seq at positions max(m - width + 1, 0) .. (width tokens) -> (logits at m
        [B, V], state). A row whose first invalid position valid [B] the window covers is
        then valid through m; another (a row the caller does not draft for) keeps only its
        valid prefix, and its logits mean nothing."""
        start = jnp.maximum(m - width + 1, 0)                                  # [B]
        logits, cache = self.step(state.cache, _take(seq, start[:, None] + jnp.arange(width)),
                                  start)
        N, L = seq.shape[1], state.fed.shape[1]
        j = jnp.arange(L)[None, :]
        valid = jnp.where(start <= valid, m + 1, valid)
        fed = jnp.where(j < valid[:, None], _take(seq, jnp.minimum(j, N - 1)), -1)
        return jnp.take_along_axis(logits, (m - start)[:, None, None], 1)[:, 0], ModelState(cache, fed)

    def _catch_up(self, state: ModelState, seq: Array, m: Array, valid: Array, active: Array,
                  width: int):
        """Feed width-token chunks from each active row's first invalid position while any is
        more than `width` positions behind y_m; then `_feed`."""
        def lagging(valid):
            return active & (m - valid + 1 > width)                            # [B]

        def chunk(c):
            state, valid = c
            late = lagging(valid)
            at = jnp.where(late, valid, jnp.maximum(m - width + 1, 0))
            _, cache = self.step(state.cache, _take(seq, at[:, None] + jnp.arange(width)), at)
            return ModelState(cache, state.fed), jnp.where(late, valid + width, valid)

        state, valid = jax.lax.while_loop(lambda c: jnp.any(lagging(c[1])), chunk, (state, valid))
        return self._feed(state, seq, m, valid, width)

    def reach(self, state: ModelState, seq: Array, m: Array, active: Array, gamma: int):
        """Catch the cache up to y_m -> (the draft's logits after y_m [B, V], state, how
        many positions each row was behind [B])."""
        N = min(seq.shape[1], state.fed.shape[1])  # the cache may end before the buffer
        j = jnp.arange(N)[None, :]
        same = (state.fed[:, :N] == seq[:, :N]) & (j <= m[:, None])            # [B, N]
        valid = jnp.minimum(jnp.sum(jnp.cumprod(same, axis=1), axis=1), m)     # [B] <= m
        behind = jnp.where(active, m - valid + 1, 1)                           # [B] >= 1
        one = lambda s: self._feed(s, seq, m, valid, 1)                        # noqa: E731
        two = lambda s: self._feed(s, seq, m, valid, 2)                        # noqa: E731
        if self.catch_up:
            more = lambda s: self._catch_up(s, seq, m, valid, active, gamma + 1)  # noqa: E731
            reach_two = lambda s: jax.lax.cond(jnp.all(behind <= 2), two, more, s)  # noqa: E731
            logits, state = reach_two(state) if self.feed_two else jax.lax.cond(
                jnp.all(behind <= 1), one, reach_two, state)
        elif self.feed_two:  # alone, a model draft is at most two positions behind
            logits, state = two(state)
        else:
            logits, state = jax.lax.cond(jnp.any(behind > 1), two, one, state)
        return logits, state, behind

    def propose(self, state: ModelState, seq: Array, m: Array, active: Array, gamma: int,
                sampling: SamplingConfig, keys: Array, limit=None) -> Proposal:
        """Catch the cache up to y_m, then gamma serial draft steps; step i samples x_i from
        q_i = adjust(logits_i)."""
        greedy, batch = sampling.greedy, seq.shape[0]
        logits, state, behind = self.reach(state, seq, m, active, gamma)

        def draw(i, logits):                         # x_i, q_i, and whether the row goes on
            q = adjust(logits, sampling)                                       # [B, V]
            x = choose(fold_rows(keys, i), q, greedy)                          # [B]
            if self.stop is None:
                return x, q, jnp.ones((batch,), bool)
            sure = branch(greedy, lambda: jax.nn.softmax(logits.astype(jnp.float32)), lambda: q)
            return x, q, jnp.take_along_axis(sure, x[:, None], 1)[:, 0] >= self.stop

        x1, q1, going = draw(0, logits)
        qs = jnp.zeros((batch, gamma) + q1.shape[-1:], jnp.float32).at[:, 0].set(q1)
        xs = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x1)
        rows = jnp.arange(batch)

        def draft_step(c):                             # feeds x_i at m+i, samples x_{i+1}
            i, state, qs, xs, count, going = c
            x = jax.lax.dynamic_slice_in_dim(xs, i - 1, 1, 1)                  # [B, 1]
            logits, cache = self.step(state.cache, x, m + i)
            fed = state.fed.at[rows, m + i].set(x[:, 0], mode="drop")
            x, q, sure = draw(i, logits[:, 0])
            return (i + 1, ModelState(cache, fed), qs.at[:, i].set(q), xs.at[:, i].set(x),
                    count + going, going & sure)

        def drafting(c):
            return (c[0] < (gamma if limit is None else limit)) & jnp.any(c[5] & active)

        c = (1, state, qs, xs, jnp.ones((batch,), jnp.int32), going)
        if self.stop is None and limit is None:   # a fixed gamma: a fori_loop
            c = jax.lax.fori_loop(1, gamma, lambda i, c: draft_step(c), c)
        else:
            c = jax.lax.while_loop(drafting, draft_step, c)
        steps, state, qs, xs, count, _ = c
        return Proposal(xs, qs, count, active & ((behind > 1) | self.feed_two), state,
                        jnp.where(active, steps, 0).astype(jnp.int32))


@jax.tree_util.register_pytree_node_class
class Fallback:
    """Per row and round, `first`'s proposal where it proposes anything (count > 0; e.g. a
    prompt-lookup match), `then`'s otherwise (e.g. the draft model). `then` is not run in a
    round where every active row has `first`'s proposal. Exact: which draft a row uses is
    decided by its history alone, and each proposal carries the q it was drawn from.
    Give Models as `then` (or `first`) to `st.generate`; it builds their step functions."""

    def __init__(self, first, then):
        self.first, self.then = first, then

    def __repr__(self):
        return f"Fallback({self.first!r}, {self.then!r})"

    def tree_flatten(self):
        return (self.first, self.then), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def init(self, input_ids: Array, length: int, mask: Optional[Array] = None):
        return (self.first.init(input_ids, length, mask),
                self.then.init(input_ids, length, mask))

    def propose(self, state, seq: Array, m: Array, active: Array, gamma: int,
                sampling: SamplingConfig, keys: Array, limit=None) -> Proposal:
        k_first, k_then = fold_rows(keys, 1 << 20), fold_rows(keys, (1 << 20) + 1)
        a = self.first.propose(state[0], seq, m, active, gamma, sampling, k_first, limit)
        use = a.count > 0                                                      # [B]

        z = _full(0, seq.shape[0])

        def steps(p: Proposal) -> Array:
            return z if p.model_steps is None else p.model_steps

        def skip(then_state):
            return Proposal(a.xs, a.qs, z, z.astype(bool), then_state, z)

        def then(then_state):
            b = self.then.propose(then_state, seq, m, active & ~use, gamma, sampling, k_then, limit)
            return b._replace(model_steps=steps(b))

        b = jax.lax.cond(jnp.all(use | ~active), skip, then, state[1])
        pick = lambda x, y: jnp.where(use.reshape(use.shape + (1,) * (x.ndim - 1)), x, y)  # noqa: E731
        return Proposal(pick(a.xs, b.xs), pick(a.qs, b.qs), pick(a.count, b.count),
                        b.wide_first, (a.state, b.state), steps(a) + b.model_steps)


@jax.tree_util.register_pytree_node_class
class PromptLookup:
    """Prompt-lookup drafting (Saxena 2023): for each row, the last n emitted tokens (n from
    max_ngram down to min_ngram, n <= m) are looked up in the row's history -- its input
    tokens (pads dropped) followed by its emitted tokens, the query's own position
    excluded; at the most recent occurrence of the longest n that occurs, the gamma tokens
    that followed it are proposed (a continuation that runs into the query repeats with the
    occurrence's period). No match: no proposal (count 0). q is one-hot on each
    proposal, so the decode stays exact. Needs no model; vocab_size is the target's.
    max_ngram is at most MAX_NGRAM (the compiled lookup grows with max_ngram^2), and n-grams
    longer than a history cannot match, so the compiled lookup stops at the history's length."""

    MAX_NGRAM = 32  # ~10 s to compile over a 640-token history; 3 to 10 is the usual choice

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: Optional[int] = None):
        for name, v in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PromptLookup {name} must be an int >= 1, got {v!r}")
        if max_ngram > self.MAX_NGRAM:
            raise ValueError(f"PromptLookup max_ngram {max_ngram} is above {self.MAX_NGRAM}, the "
                             "most it compiles in reasonable time (its program grows with "
                             "max_ngram^2; 3 to 10 is usual)")
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

    def init(self, input_ids: Array, length: int, mask: Optional[Array] = None):
        """(input tokens with pads moved to the end [B, S], non-pad count [B]); pads are
        where mask is False (default: token 0, T5's pad)."""
        is_pad = input_ids == 0 if mask is None else ~mask
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
        top = min(self.max_ngram, H - 1)                  # a longer n-gram has no earlier start
        for n in range(top, self.min_ngram - 1, -1):                          # longest first
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

    def propose(self, state, seq: Array, m: Array, active: Array, gamma: int,
                sampling: SamplingConfig, keys: Array, limit=None) -> Proposal:
        """The lookup's continuation (count gamma, or limit) where it finds one, nothing
        (count 0) where it does not."""
        h, length = self.history(state, seq, m)
        xs, found = self.lookup(h, length, m, gamma)
        xs, qs = one_hot_proposal(xs, self.vocab_size)
        count = jnp.where(found, gamma if limit is None else limit, 0).astype(jnp.int32)
        return Proposal(xs, qs, count, jnp.zeros_like(found), state)


BIGRAM_KIND = "speculative_t5.Bigram"
BIGRAM_ARRAYS = ("kind", "successors", "probs", "rest")
DEFLATE_MOST = 1100  # deflate expands a member at most ~1032 times


class _NotATable(Exception):
    """An .npz without a Bigram's members (args[0]: the ones it has)."""


def _npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, archive: int):
    """(shape, fortran_order, dtype, header bytes) of one .npy member of an .npz, from its
    header alone; its data must be exactly the bytes the header declares, which the member
    (at most the archive's size, or a deflated member's most expansion) holds."""
    name = info.filename
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(f"member {name} uses zip compression {info.compress_type}")
    most = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_MOST)
    if info.compress_size > archive or info.file_size > most:
        raise ValueError(f"member {name} declares {info.file_size} bytes in a file of {archive}")
    with zf.open(info) as fp:
        version = np.lib.format.read_magic(fp)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"member {name}: .npy format version {version}")
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(fp)
        offset = fp.tell()
    if dtype.hasobject:
        raise ValueError(f"member {name} holds Python objects (dtype {dtype})")
    nbytes = int(np.prod([int(n) for n in shape], dtype=object)) * dtype.itemsize
    if nbytes != info.file_size - offset:
        raise ValueError(f"member {name} declares shape {tuple(shape)} {dtype} ({nbytes} bytes) "
                         f"but holds {info.file_size - offset} bytes")
    return tuple(shape), fortran, dtype, offset


def _npy_data(zf: zipfile.ZipFile, info: zipfile.ZipInfo, header) -> np.ndarray:
    """The array of a member whose header `_npy_header` checked."""
    shape, fortran, dtype, offset = header
    with zf.open(info) as fp:
        fp.read(offset)
        data = fp.read(info.file_size - offset)
    if len(data) != info.file_size - offset:
        raise EOFError(f"member {info.filename} is truncated")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")


def _read_table(path: str, vocab_size: Optional[int]):
    """(successors, probs, rest) of a table file, each member's header checked (shape,
    dtype, size against the file and vocab_size) before its data is read."""
    try:
        archive = os.path.getsize(path)
        with zipfile.ZipFile(path) as zf:
            members = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
            if not set(BIGRAM_ARRAYS) <= set(members):
                raise _NotATable(sorted(members))
            try:
                h = {k: _npy_header(zf, members[k], archive) for k in BIGRAM_ARRAYS}
            except (ValueError, TypeError, SyntaxError) as e:
                raise ValueError(f"{path}: not a Bigram table (.npz from Bigram.save): "
                                 f"{_first_line(e)}") from None
            _check_headers(path, h, vocab_size)
            kind = _npy_data(zf, members["kind"], h["kind"])
            if str(kind) != BIGRAM_KIND:
                raise _NotATable(sorted(members))
            return tuple(_npy_data(zf, members[k], h[k]) for k in BIGRAM_ARRAYS[1:])
    except _NotATable as e:
        raise ValueError(f"{path}: not a Bigram table (.npz from Bigram.save); it holds "
                         f"{e.args[0]}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError) as e:
        what = "not a whole zip archive (truncated or another file)" \
            if isinstance(e, (zipfile.BadZipFile, EOFError, zlib.error)) else "cannot read it"
        raise ValueError(f"{path}: not a Bigram table (.npz from Bigram.save): {what}: "
                         f"{_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _check_headers(path: str, h, vocab_size: Optional[int]) -> None:
    """The members' declared shapes and dtypes: kind a string, successors int [V, top],
    probs float [V, top], rest float [V], 2 <= V (== vocab_size if given), 1 <= top <= V."""
    (ks, _, kd, _), (ss, _, sd, _), (ps, _, pd, _), (rs, _, rd, _) = (h[k] for k in BIGRAM_ARRAYS)
    if ks != () or kd.kind != "U" or sd.kind not in "iu" or pd.kind != "f" or rd.kind != "f":
        raise ValueError(f"{path}: Bigram arrays have dtypes kind {kd}, successors {sd}, probs "
                         f"{pd}, rest {rd}; expected a string, int, float, float")
    V = rs[0] if len(rs) == 1 else -1
    if len(ss) != 2 or ss != ps or ss[0] != V:
        raise ValueError(f"{path}: Bigram arrays have shapes successors {ss}, probs {ps}, rest "
                         f"{rs}; expected [V, top], [V, top], [V]")
    if V < 2 or not 1 <= ss[1] <= V:
        raise ValueError(f"{path}: a Bigram table of vocab_size {V} and top {ss[1]}; expected "
                         "vocab_size >= 2 and 1 <= top <= vocab_size")
    if vocab_size is not None and V != vocab_size:
        raise ValueError(f"{path}: a Bigram table of vocab_size {V}, the target's is "
                         f"{vocab_size}: a draft must share the target's vocabulary")


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

    def save(self, path) -> None:
        """Write the table to an .npz file (`Bigram.load` reads it; the draft spec
        'bigram:PATH' of `decode --draft` and the paper cells), or to an open binary file;
        flushed and (a real file) fsynced."""
        arrays = dict(kind=np.array(BIGRAM_KIND), successors=np.asarray(self.successors),
                      probs=np.asarray(self.probs), rest=np.asarray(self.rest))
        with contextlib.nullcontext(path) if hasattr(path, "write") else open(path, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            try:
                fd = f.fileno()
            except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: in memory
                return
            os.fsync(fd)

    @classmethod
    def load(cls, path: str, vocab_size: Optional[int] = None) -> "Bigram":
        """A table `save` wrote; anything else (another file, a truncated one, a header
        declaring more than the file holds, vocab_size other than the given one, rows that
        are not distributions, repeated or out-of-range successors) is a one-line ValueError
        naming the file and the problem. Headers are checked before any data is read."""
        succ, probs, rest = _read_table(path, vocab_size)     # [V, top], [V, top], [V]
        V = rest.shape[0]
        if succ.min() < 0 or succ.max() >= V:
            raise ValueError(f"{path}: successor ids in [{succ.min()}, {succ.max()}], outside "
                             f"[0, {V})")
        ordered = np.sort(succ, 1)
        repeated = np.nonzero((ordered[:, 1:] == ordered[:, :-1]).any(1))[0]
        if repeated.size:
            raise ValueError(f"{path}: repeated successor ids in {repeated.size} rows (first: "
                             f"row {repeated[0]}); each row's successors must be distinct")
        bad = ~(np.isfinite(probs).all(1) & np.isfinite(rest))
        if bad.any():
            raise ValueError(f"{path}: non-finite probabilities (NaN or inf) in {bad.sum()} "
                             f"rows (first: row {np.nonzero(bad)[0][0]})")
        mass = probs.sum(1, dtype=np.float64) + rest.astype(np.float64) * (V - succ.shape[1])
        if (probs < 0).any() or (rest < 0).any() or np.abs(mass - 1).max() > 1e-3:
            raise ValueError(f"{path}: Bigram rows are not distributions (negative "
                             f"probabilities, or row sums in [{mass.min():.4f}, "
                             f"{mass.max():.4f}])")
        return cls(jnp.asarray(succ, jnp.int32), jnp.asarray(probs, jnp.float32),
                   jnp.asarray(rest, jnp.float32))

    def table(self, prev: Array) -> Array:
        """q(. | prev) for prev [B] -> [B, V]."""
        q = jnp.broadcast_to(self.rest[prev][:, None], prev.shape + (self.vocab_size,))
        rows = jnp.arange(prev.shape[0])[:, None]
        return q.at[rows, self.successors[prev]].set(self.probs[prev])

    def init(self, input_ids: Array, length: int, mask: Optional[Array] = None):
        return ()

    def propose(self, state, seq: Array, m: Array, active: Array, gamma: int,
                sampling: SamplingConfig, keys: Array, limit=None) -> Proposal:
        prev = _take(seq, m[:, None])[:, 0]                                   # [B] y_m
        xs, qs = [], []
        for i in range(gamma):                                  # gamma table look-ups
            q = adjust(jnp.log(self.table(prev)), sampling)                    # [B, V]
            prev = choose(fold_rows(keys, i), q, sampling.greedy)
            xs.append(prev)
            qs.append(q)
        B = seq.shape[0]
        return Proposal(jnp.stack(xs, 1), jnp.stack(qs, 1),
                        _full(gamma if limit is None else limit, B), jnp.zeros((B,), bool), state)
