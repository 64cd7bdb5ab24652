"""alpha as the paper measures it (Table 3): E[sum_x min(p(x), q(x))] over positions of
target-generated text, with p and q the target's and draft's adjusted distributions
(temperature 0: one-hot argmaxes, so alpha is the argmax agreement rate)."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.sampling import SamplingConfig, adjust
from speculative_t5.model.api import Model, forward


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


def overlap_per_token(target: Model, draft: Model, input_ids, output_tokens,
                      sampling: SamplingConfig, prompt_lengths=None) -> Tuple[np.ndarray, np.ndarray]:
    """(sum_x min(p, q) [B, T], mask [B, T]) along output_tokens (EOS included, padding
    after it excluded). A decoder-only pair reads input_ids as prompts with prompt_lengths."""
    out = jnp.asarray(output_tokens, jnp.int32)
    if target.decoder_only:
        lengths = np.full(out.shape[0], np.shape(input_ids)[1]) if prompt_lengths is None \
            else np.asarray(prompt_lengths)
        lp, lq = (_lm_logits(m, input_ids, lengths, out) for m in (target, draft))
        eos = np.asarray(out) == target.config.eos_id
        mask = np.cumsum(eos, 1) - eos == 0                                    # up to EOS
    else:
        dec = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))                           # start token 0
        lp, lq = forward(target, input_ids, dec), forward(draft, input_ids, dec)
        mask = np.asarray(out != 0)
    p, q = adjust(lp, sampling), adjust(lq, sampling)                          # [B, T, V]
    overlap = jnp.sum(jnp.minimum(p, q), axis=-1)                              # [B, T]
    return np.asarray(overlap), mask


def overlap_sums(target: Model, draft: Model, input_ids, output_tokens,
                 sampling: SamplingConfig, prompt_lengths=None) -> List[Dict[str, Any]]:
    """Per row: the sum and sum of squares of the overlaps along its output, and the number
    of positions; `alpha_of` combines them over any set of rows (so a run can be resumed)."""
    overlap, mask = overlap_per_token(target, draft, input_ids, output_tokens, sampling,
                                      prompt_lengths)
    out = []
    for vals, m in zip(overlap.astype(np.float64), mask):                      # [T], [T]
        vals = vals[m]
        out.append({"overlap_sum": float(vals.sum()), "overlap_sq": float((vals ** 2).sum()),
                    "positions": int(vals.size)})
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
    return {"alpha": mean, "alpha_ci95": 1.96 * float(np.sqrt(var / n)), "positions": n}


def measure_alpha(target: Model, draft: Model, input_ids, output_tokens,
                  sampling: SamplingConfig, prompt_lengths=None) -> Tuple[float, float, int]:
    """(alpha, 95% confidence half-width, number of positions) over all rows."""
    a = alpha_of(overlap_sums(target, draft, input_ids, output_tokens, sampling, prompt_lengths))
    return a["alpha"], a["alpha_ci95"], a["positions"]
