"""alpha as the paper measures it (Table 3): E[sum_x min(p(x), q(x))] over positions of
target-generated text, with p and q the target's and draft's adjusted distributions
(temperature 0: one-hot argmaxes, so alpha is the argmax agreement rate).

Zero-cost drafts, teacher-forced along the same text: a PromptLookup is run at every
position j on the input and y_1..y_j (what the decode's lookup would see with j tokens
emitted); where it finds a match, q is one-hot on the token it copies and the overlap is
p(that token); where it finds none there is no proposal and the overlap is 0 (a round
there emits the target's one token, as at alpha 0). The fraction of positions with a
proposal is reported apart as `coverage`, with `alpha_covered` the mean overlap there.
A Bigram: q is its table's row for the token before each position (the decoder's start
token first, as `Bigram.fit` counts it; a GPT-2's last prompt token), adjusted as its
proposals are. A Fallback(PromptLookup, model or Bigram): the lookup's one-hot q where it
matches, the other's q elsewhere. Only a round's first draft is judged this way: the decode copies a span from
one match, the teacher-forced lookup looks anew at each position."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.drafts import Bigram, Fallback, PromptLookup
from speculative_t5.decoding.sampling import SamplingConfig, adjust
from speculative_t5.model.api import Model, forward

Array = jax.Array


def _lm_logits(model: Model, prompts, lengths, out) -> jnp.ndarray:
    """A decoder-only model's logits [B, T, V] predicting out [B, T] after each row's prompt
    (right-padded prompts [B, S], lengths [B]): one causal pass over prompt + output."""
    prompts, out = np.asarray(prompts), np.asarray(out)
    B, S = prompts.shape
    T = out.shape[1]
    seq = np.full((B, S + T), model.config.pad_id, np.int32)                   # [B, S + T]
    for b, n in enumerate(np.asarray(lengths)):
        seq[b, :n], seq[b, n:n + T] = prompts[b, :n], out[b]
    at = np.asarray(lengths)[:, None] - 1 + np.arange(T)[None, :]              # [B, T]
    logits = forward(model, seq)                                               # [B, S + T, V]
    return jnp.take_along_axis(logits, jnp.asarray(at)[..., None], 1)          # [B, T, V]


def lookup_along(lookup: PromptLookup, input_ids, input_mask, output_tokens) -> Tuple[Array, Array]:
    """(the token `lookup` proposes first at each position j [B, T], whether it proposes
    [B, T]): its history there is the input's real tokens (input_mask [B, S]) and
    output_tokens[:, :j], as in a decode that has emitted j tokens."""
    out = jnp.asarray(output_tokens, jnp.int32)
    B, T = out.shape
    seq = jnp.pad(out, ((0, 0), (1, 0)))                                       # [B, T + 1]
    inputs, n_in = lookup.init(jnp.asarray(input_ids), T + 1, jnp.asarray(input_mask))
    rep = lambda a: jnp.repeat(a, T, axis=0)                                   # noqa: E731
    m = jnp.tile(jnp.arange(T, dtype=jnp.int32), B)                            # [B T] row b*T+j: j
    h, length = lookup.history((rep(inputs), rep(n_in)), rep(seq), m)
    xs, found = lookup.lookup(h, length, m, 1)                                 # [B T, 1], [B T]
    return xs[:, 0].reshape(B, T), found.reshape(B, T)


def overlap_per_token(target: Model, draft, input_ids, output_tokens,
                      sampling: SamplingConfig, prompt_lengths=None):
    """(sum_x min(p, q) [B, T], mask [B, T], covered [B, T] or None) along output_tokens
    (EOS included, padding after it excluded). A decoder-only pair reads input_ids as
    prompts with prompt_lengths. draft: a Model or a Bigram; a PromptLookup or
    Fallback(PromptLookup, Model or Bigram), teacher-forced (module docstring): covered
    says where the lookup proposes."""
    out = jnp.asarray(output_tokens, jnp.int32)
    lookup, model = _parts(draft)
    if target.decoder_only:
        lengths = np.full(out.shape[0], np.shape(input_ids)[1]) if prompt_lengths is None \
            else np.asarray(prompt_lengths)
        logits = lambda m: _lm_logits(m, input_ids, lengths, out)              # noqa: E731
        eos = np.asarray(out) == target.config.eos_id
        mask = np.cumsum(eos, 1) - eos == 0                                    # up to EOS
        input_mask = np.arange(np.shape(input_ids)[1])[None, :] < lengths[:, None]
        last = np.take_along_axis(np.asarray(input_ids), lengths[:, None] - 1, 1)
        prev = jnp.concatenate([jnp.asarray(last, jnp.int32), out[:, :-1]], 1)  # [B, T]
    else:
        dec = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))                           # start token 0
        logits = lambda m: forward(m, input_ids, dec)                          # noqa: E731
        mask = np.asarray(out != 0)
        input_mask = np.asarray(input_ids) != target.config.pad_id
        prev = dec                                                             # [B, T]
    p = adjust(logits(target), sampling)                                       # [B, T, V]
    if isinstance(model, Bigram):
        B, T = out.shape
        q = adjust(jnp.log(model.table(prev.reshape(-1))).reshape(B, T, -1), sampling)
    else:
        q = None if model is None else adjust(logits(model), sampling)        # [B, T, V]
    overlap = jnp.zeros(out.shape, jnp.float32) if q is None else \
        jnp.sum(jnp.minimum(p, q), axis=-1)                                    # [B, T]
    if lookup is None:
        return np.asarray(overlap), mask, None
    x, found = lookup_along(lookup, input_ids, input_mask, out)                # [B, T]
    copied = jnp.take_along_axis(p, x[..., None], -1)[..., 0]                  # p(x) [B, T]
    return np.asarray(jnp.where(found, copied, overlap)), mask, np.asarray(found)


def _parts(draft) -> Tuple[Optional[PromptLookup], Any]:
    """(lookup, the Model or Bigram beside or instead of it) of a draft alpha can be
    measured for."""
    if isinstance(draft, (Model, Bigram)):
        return None, draft
    if isinstance(draft, PromptLookup):
        return draft, None
    if isinstance(draft, Fallback) and isinstance(draft.first, PromptLookup) \
            and isinstance(draft.then, (Model, Bigram)):
        return draft.first, draft.then
    raise ValueError(f"alpha is measured for a draft Model, a Bigram, a PromptLookup or "
                     f"Fallback(PromptLookup, Model or Bigram), not {draft!r}")


def overlap_sums(target: Model, draft, input_ids, output_tokens,
                 sampling: SamplingConfig, prompt_lengths=None) -> List[Dict[str, Any]]:
    """Per row: the sum and sum of squares of the overlaps along its output, and the number
    of positions; `alpha_of` combines them over any set of rows (so a run can be resumed)."""
    overlap, mask, covered = overlap_per_token(target, draft, input_ids, output_tokens,
                                               sampling, prompt_lengths)
    out = []
    for b, (vals, m) in enumerate(zip(overlap.astype(np.float64), mask)):      # [T], [T]
        row = {"overlap_sum": float(vals[m].sum()), "overlap_sq": float((vals[m] ** 2).sum()),
               "positions": int(m.sum())}
        if covered is not None:
            c = covered[b] & m
            row.update(covered=int(c.sum()), overlap_covered_sum=float(vals[c].sum()))
        out.append(row)
    return out


def alpha_of(sums: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """alpha = mean overlap over all positions, with a 95% normal half-width (nan for fewer
    than two positions)."""
    n = sum(r["positions"] for r in sums)
    if n == 0:
        return {"alpha": float("nan"), "alpha_ci95": float("nan"), "positions": 0}
    mean = sum(r["overlap_sum"] for r in sums) / n
    if n == 1:
        return {"alpha": mean, "alpha_ci95": float("nan"), "positions": 1}
    var = max(sum(r["overlap_sq"] for r in sums) / n - mean ** 2, 0.0) * n / (n - 1)
    out = {"alpha": mean, "alpha_ci95": 1.96 * float(np.sqrt(var / n)), "positions": n}
    return dict(out, **coverage_of(sums)) if "covered" in sums[0] else out


def coverage_of(sums: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    """A zero-cost draft's coverage (the fraction of positions where it proposes) and the
    mean overlap there (alpha_covered; nan where it never proposes)."""
    covered = sum(r["covered"] for r in sums)
    return {"coverage": covered / sum(r["positions"] for r in sums),
            "alpha_covered": (sum(r["overlap_covered_sum"] for r in sums) / covered
                              if covered else float("nan"))}


def measure_alpha(target: Model, draft, input_ids, output_tokens,
                  sampling: SamplingConfig, prompt_lengths=None) -> Tuple[float, float, int]:
    """(alpha, 95% confidence half-width, number of positions) over all rows."""
    a = alpha_of(overlap_sums(target, draft, input_ids, output_tokens, sampling, prompt_lengths))
    return a["alpha"], a["alpha_ci95"], a["positions"]
