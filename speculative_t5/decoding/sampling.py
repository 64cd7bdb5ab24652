"""Sampling rules shared by target and draft, and the speculative accept/reject rule.

`adjust` turns logits into the distribution a token is actually sampled from
(temperature, top-k, top-p). Speculative decoding applies the same adjustment to the
target's p and the draft's q, so `q` in the accept test is exactly what the draft sampled
from (HF #32867 is the bug this avoids).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array


class SamplingConfig(NamedTuple):
    """Sampling settings; temperature 0 means argmax. top_k and top_p are static; the
    temperature may also be a traced scalar, so one compiled program serves every
    temperature, 0 included (see `greedy`)."""
    temperature: Any = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        """Argmax known when tracing (a Python 0.0). A traced temperature takes the sampling
        path, which at temperature 0 is argmax too, token for token: `adjust` gives one-hot
        p and q, sampling a one-hot gives its token, and the accept test u q(x) < p(x)
        accepts exactly the drafts that are the target's argmax."""
        return isinstance(self.temperature, (int, float)) and self.temperature == 0.0

    def validate(self) -> "SamplingConfig":
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = argmax), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        return SamplingConfig(float(self.temperature), int(self.top_k), float(self.top_p))


def adjust(logits: Array, cfg: SamplingConfig) -> Array:
    """float32 logits [..., V] -> probabilities [..., V] that sampling draws from.

    Greedy gives a one-hot of the argmax (lowest index on ties). top-k keeps the k largest
    logits (ties at the k-th value kept); top-p keeps the smallest prefix of the sorted
    distribution whose mass reaches p (the top token always kept)."""
    logits = logits.astype(jnp.float32)
    argmax = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    if cfg.greedy:
        return argmax
    t = jnp.asarray(cfg.temperature, jnp.float32)
    logits = logits / jnp.where(t > 0, t, 1.0)
    if 0 < cfg.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]                    # [..., 1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if cfg.top_p < 1.0:
        probs = jax.nn.softmax(logits, axis=-1)
        order = jnp.argsort(-probs, axis=-1)
        sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
        keep_sorted = (jnp.cumsum(sorted_probs, axis=-1) - sorted_probs) < cfg.top_p
        keep = jnp.zeros_like(keep_sorted).at[
            tuple(jnp.indices(order.shape)[:-1]) + (order,)].set(keep_sorted)
        logits = jnp.where(keep, logits, -jnp.inf)
    return jnp.where(t > 0, jax.nn.softmax(logits, axis=-1), argmax)


def sample(rng: Array, probs: Array) -> Array:
    """One token per row from probabilities [..., V] -> int32 [...]."""
    return jax.random.categorical(rng, jnp.log(probs), axis=-1).astype(jnp.int32)


def choose(rng: Array, probs: Array, greedy: bool) -> Array:
    return jnp.argmax(probs, axis=-1).astype(jnp.int32) if greedy else sample(rng, probs)


def verify(rng: Array, p: Array, q: Array, drafts: Array, greedy: bool,
           lenience: float = 1.0) -> Tuple[Array, Array, Array]:
    """Algorithm 1's accept/reject for a batch of rows.

    p [B, G+1, V] target distributions, q [B, G, V] the draft distributions the drafts
    [B, G] were sampled from. Accept draft i with probability min(1, p_i(x)/(l q_i(x))),
    left to right, stopping at the first rejection (greedy: accept iff x_i is p_i's argmax).
    Returns (n [B] accepted drafts, next token [B], accepted mask [B, G]): the next token
    comes from norm(max(0, p_{n+1} - q_{n+1})) after a rejection, from p_{G+1} otherwise."""
    B, G = drafts.shape
    k_accept, k_next = jax.random.split(rng)
    p_x = jnp.take_along_axis(p[:, :G], drafts[..., None], axis=-1)[..., 0]    # [B, G]
    q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]           # [B, G]
    if greedy:
        ok = drafts == jnp.argmax(p[:, :G], axis=-1)
    else:
        u = jax.random.uniform(k_accept, (B, G))
        ok = u * lenience * q_x < p_x       # u < min(1, p/(l q)), without dividing by q
    accepted = jnp.cumprod(ok.astype(jnp.int32), axis=1)                       # [B, G]
    n = jnp.sum(accepted, axis=1)                                              # [B]
    p_next = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]            # [B, V]
    if greedy:
        return n, jnp.argmax(p_next, axis=-1).astype(jnp.int32), accepted.astype(bool)
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)             # [B, G+1, V]
    q_next = jnp.take_along_axis(q_pad, n[:, None, None], axis=1)[:, 0]        # 0 when n == G
    residual = jnp.maximum(p_next - q_next, 0.0)
    # after a rejection the residual has positive mass; guard float round-off anyway
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_next)
    return n, sample(k_next, residual), accepted.astype(bool)
