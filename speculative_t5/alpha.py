"""alpha as the paper measures it (Table 3): E[sum_x min(p(x), q(x))] over positions of
target-generated text, with p and q the target's and draft's adjusted distributions
(temperature 0: one-hot argmaxes, so alpha is the argmax agreement rate)."""
from __future__ import annotations

from typing import Tuple

import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.sampling import SamplingConfig, adjust
from speculative_t5.model.api import Model, forward


def overlap_per_token(target: Model, draft: Model, input_ids, output_tokens,
                      sampling: SamplingConfig) -> Tuple[np.ndarray, np.ndarray]:
    """(sum_x min(p, q) [B, T], mask [B, T]) along output_tokens (EOS included, 0 after)."""
    out = jnp.asarray(output_tokens, jnp.int32)
    dec = jnp.pad(out[:, :-1], ((0, 0), (1, 0)))                               # start token 0
    p = adjust(forward(target, input_ids, dec), sampling)                      # [B, T, V]
    q = adjust(forward(draft, input_ids, dec), sampling)
    overlap = jnp.sum(jnp.minimum(p, q), axis=-1)                              # [B, T]
    return np.asarray(overlap), np.asarray(out != 0)


def measure_alpha(target: Model, draft: Model, input_ids, output_tokens,
                  sampling: SamplingConfig) -> Tuple[float, float, int]:
    """(alpha, 95% confidence half-width, number of positions)."""
    overlap, mask = overlap_per_token(target, draft, input_ids, output_tokens, sampling)
    values = overlap[mask]
    n = int(values.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    half = 1.96 * float(values.std(ddof=1)) / np.sqrt(n) if n > 1 else float("nan")
    return float(values.mean()), half, n
