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
import numpy as np

Array = jax.Array


class SamplingConfig(NamedTuple):
    """Sampling settings; temperature 0 means argmax. top_k and top_p are static; the
    temperature may also be a traced scalar, so one compiled program serves every
    temperature, 0 included (see `greedy`)."""
    temperature: Any = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self):
        """Argmax: a Python bool for a Python temperature (decided when tracing), a traced
        bool for a traced one (decided at run time by `branch`, so a shared program's greedy
        decodes skip the sampling work)."""
        if isinstance(self.temperature, (int, float)):
            return self.temperature == 0.0
        return jnp.asarray(self.temperature) == 0

    def validate(self) -> "SamplingConfig":
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = argmax), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        return SamplingConfig(float(self.temperature), int(self.top_k), float(self.top_p))


def branch(greedy, if_greedy, if_sampled, *args):
    """if_greedy(*args) for argmax decoding, if_sampled(*args) otherwise: chosen when
    tracing for a Python bool, at run time for a traced one (`lax.cond`: one branch runs)."""
    if isinstance(greedy, (bool, np.bool_)):
        return if_greedy(*args) if greedy else if_sampled(*args)
    return jax.lax.cond(greedy, if_greedy, if_sampled, *args)


def adjust(logits: Array, cfg: SamplingConfig) -> Array:
    """float32 logits [..., V] -> probabilities [..., V] that sampling draws from.

    Greedy gives a one-hot of the argmax (lowest index on ties). top-k keeps the k largest
    logits (ties at the k-th value kept); top-p keeps the smallest prefix of the sorted
    distribution whose mass reaches p (the top token always kept)."""
    def argmax(logits):
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)

    def sampled(logits):
        t = jnp.asarray(cfg.temperature, jnp.float32)
        logits = logits / jnp.where(t > 0, t, 1.0)
        if 0 < cfg.top_k < logits.shape[-1]:
            kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]                # [..., 1]
            logits = jnp.where(logits < kth, -jnp.inf, logits)
        if cfg.top_p < 1.0:
            probs = jax.nn.softmax(logits, axis=-1)
            order = jnp.argsort(-probs, axis=-1)
            sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
            keep_sorted = (jnp.cumsum(sorted_probs, axis=-1) - sorted_probs) < cfg.top_p
            keep = jnp.zeros_like(keep_sorted).at[
                tuple(jnp.indices(order.shape)[:-1]) + (order,)].set(keep_sorted)
            logits = jnp.where(keep, logits, -jnp.inf)
        return jax.nn.softmax(logits, axis=-1)

    return branch(cfg.greedy, argmax, sampled, logits.astype(jnp.float32))


def row_keys(rng: Array, batch: int) -> Array:
    """One PRNG key per row [B]: `rng` split `batch` ways, or `rng` itself when it already
    holds one key per row (then a row's samples depend on its own key alone, not on the
    batch it is decoded in)."""
    return rng if keys_per_row(rng, batch) else jax.random.split(rng, batch)


def keys_per_row(rng, batch: int) -> bool:
    """Whether `rng` holds one PRNG key per row (else one key); any other shape is an error."""
    typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
    shape = tuple(rng.shape)
    if len(shape) == (0 if typed else 1):
        return False
    if len(shape) != (1 if typed else 2) or shape[0] != batch:
        raise ValueError(f"rng must be one PRNG key or one per row ({batch}), got shape {shape}")
    return True


def split_rows(keys: Array, num: int) -> Tuple[Array, ...]:
    """keys [B] -> `num` new keys [B] each, row by row."""
    split = jax.vmap(lambda k: jax.random.split(k, num))(keys)                 # [B, num]
    return tuple(split[:, i] for i in range(num))


def fold_rows(keys: Array, data) -> Array:
    return jax.vmap(lambda k: jax.random.fold_in(k, data))(keys)


def sample(keys: Array, probs: Array) -> Array:
    """One token per row from probabilities [B, V] with that row's key [B] -> int32 [B]."""
    return jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys, probs).astype(jnp.int32)


def choose(rng: Array, probs: Array, greedy) -> Array:
    """One token per row of probs [B, V] (keys rng [B]): its argmax when greedy, else a sample."""
    return branch(greedy, lambda p: jnp.argmax(p, axis=-1).astype(jnp.int32),
                  lambda p: sample(rng, p), probs)


def verify(rng: Array, p: Array, q: Array, drafts: Array, greedy,
           lenience: float = 1.0) -> Tuple[Array, Array, Array]:
    """Algorithm 1's accept/reject for a batch of rows.

    rng [B]: one key per row. p [B, G+1, V] target distributions, q [B, G, V] the draft
    distributions the drafts [B, G] were sampled from. Accept draft i with probability min(1, p_i(x)/(l q_i(x))),
    left to right, stopping at the first rejection (greedy: accept iff x_i is p_i's argmax).
    Returns (n [B] accepted drafts, next token [B], accepted mask [B, G]): the next token
    comes from norm(max(0, p_{n+1} - q_{n+1})) after a rejection, from p_{G+1} otherwise."""
    B, G = drafts.shape
    k_accept, k_next = split_rows(rng, 2)

    def prefix(ok):                                                            # [B, G] -> n, mask
        accepted = jnp.cumprod(ok.astype(jnp.int32), axis=1)                   # [B, G]
        return jnp.sum(accepted, axis=1), accepted.astype(bool)

    def at(dist, n):                                                           # [B, K, V] -> [B, V]
        return jnp.take_along_axis(dist, n[:, None, None], axis=1)[:, 0]

    def argmax_rule(p, q):
        n, accepted = prefix(drafts == jnp.argmax(p[:, :G], axis=-1))
        return n, jnp.argmax(at(p, n), axis=-1).astype(jnp.int32), accepted

    def sampled_rule(p, q):
        p_x = jnp.take_along_axis(p[:, :G], drafts[..., None], axis=-1)[..., 0]  # [B, G]
        q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]       # [B, G]
        u = jax.vmap(lambda k: jax.random.uniform(k, (G,)))(k_accept)          # [B, G]
        n, accepted = prefix(u * lenience * q_x < p_x)  # u < min(1, p/(l q)), not dividing by q
        p_next = at(p, n)                                                      # [B, V]
        q_next = at(jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1), n)  # 0 when n == G
        residual = jnp.maximum(p_next - q_next, 0.0)
        # after a rejection the residual has positive mass; guard float round-off anyway
        residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_next)
        return n, sample(k_next, residual), accepted

    return branch(greedy, argmax_rule, sampled_rule, p, q)
