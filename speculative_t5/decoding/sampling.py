"""Sampling rules shared by target and draft, and the speculative accept/reject rules.

`adjust` turns logits into the distribution a token is actually sampled from
(temperature, top-k, top-p). Speculative decoding applies the same adjustment to the
target's p and the draft's q, so `q` in the accept test is exactly what the draft sampled
from (HF #32867 is the bug this avoids). Two verifications (`VERIFIERS`), same inputs and
outputs: token-wise `verify` (Leviathan et al., Algorithm 1) and `verify_block` (Sun et
al. 2025, Algorithm 2: the whole draft block judged jointly, never fewer accepted).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class SamplingConfig(NamedTuple):
    """Sampling settings; temperature 0 means argmax. Each may be a Python number (decided
    when tracing) or a traced scalar, so one compiled program serves every setting: every
    temperature, 0 included (see `greedy`), every top-k and top-p (see `truncate`)."""
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
    logits (ties at the k-th value kept); top-p then keeps the smallest prefix of the sorted
    distribution whose mass reaches p (the top token always kept)."""
    def argmax(logits):
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)

    def sampled(logits):
        t = jnp.asarray(cfg.temperature, jnp.float32)
        logits = logits / jnp.where(t > 0, t, 1.0)
        V = logits.shape[-1]
        truncating = ((cfg.top_k > 0) & (cfg.top_k < V)) | (cfg.top_p < 1.0)
        logits = branch(truncating, lambda x: truncate(x, cfg.top_k, cfg.top_p),
                        lambda x: x, logits)
        return jax.nn.softmax(logits, axis=-1)

    return branch(cfg.greedy, argmax, sampled, logits.astype(jnp.float32))


def truncate(logits: Array, top_k, top_p) -> Array:
    """logits [..., V] with the tokens top-k and top-p cut set to -inf. top_k (0 or >= V:
    off) and top_p (1: off) may be traced, so one program serves every setting; one sort of
    the values serves both, and top-p's cut runs only where it is on."""
    V = logits.shape[-1]
    ranked = jnp.flip(jnp.sort(logits, axis=-1), axis=-1)                      # [..., V] descending
    k = jnp.where((top_k > 0) & (top_k < V), top_k, V)
    kth = jax.lax.dynamic_index_in_dim(ranked, k - 1, ranked.ndim - 1)         # [..., 1]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)                # ties at the k-th kept
    ranked = jnp.where(ranked >= kth, ranked, -jnp.inf)
    return branch(top_p < 1.0, lambda x: _nucleus(x, ranked, top_p), lambda x: x, logits)


def _nucleus(logits: Array, ranked: Array, top_p) -> Array:
    """Top-p over logits [..., V] whose values sorted descending are ranked [..., V]: the
    smallest prefix of the sorted distribution whose mass reaches top_p. No scatter: kept is
    every logit above the prefix's last value and, of those equal to it, the first by index
    (the sorted order's ties)."""
    probs = jax.nn.softmax(ranked, axis=-1)                                    # [..., V] ranked
    m = jnp.sum((jnp.cumsum(probs, axis=-1) - probs) < top_p, -1, keepdims=True)  # [..., 1] >= 1
    last = jnp.take_along_axis(ranked, m - 1, axis=-1)                         # [..., 1]
    above = logits > last                                                      # [..., V]
    tied = logits == last
    first_ties = jnp.cumsum(tied, axis=-1) <= m - jnp.sum(above, -1, keepdims=True)
    return jnp.where(above | (tied & first_ties), logits, -jnp.inf)


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


VERIFICATIONS = ("token", "block")


def check_verification(verification, lenience: float = 1.0) -> str:
    """`verification` validated: "token" (Algorithm 1) or "block" (Sun et al. 2025); block
    verification is exact only, so lenience < 1 (token-wise, inexact) is refused with it."""
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {verification!r}")
    if verification == "block" and lenience != 1.0:
        raise ValueError(f"lenience {lenience} < 1 is token-wise only; use verification='token' "
                         "with lenience, or lenience=1 with verification='block'")
    return verification


def _prefix(ok: Array) -> Tuple[Array, Array]:
    """ok [B, G] -> (n [B] leading True count, accepted mask [B, G])."""
    accepted = jnp.cumprod(ok.astype(jnp.int32), axis=1)                       # [B, G]
    return jnp.sum(accepted, axis=1), accepted.astype(bool)


def _at(dist: Array, n: Array) -> Array:
    """dist [B, K, V] at per-row positions n [B] -> [B, V]."""
    return jnp.take_along_axis(dist, n[:, None, None], axis=1)[:, 0]


def _drafted(dist: Array, drafts: Array) -> Array:
    """dist [B, G, V] at the drafted tokens drafts [B, G] -> [B, G]."""
    return jnp.take_along_axis(dist, drafts[..., None], axis=-1)[..., 0]


def _uniform(keys: Array, num: int) -> Array:
    """num U[0, 1) draws per row with that row's key [B] -> [B, num]."""
    return jax.vmap(lambda k: jax.random.uniform(k, (num,)))(keys)


def _divide(a: Array, b: Array) -> Array:
    """a / b where b > 0, else 0 (no inf or nan from an empty denominator)."""
    return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)


def _proposed(q: Array, count) -> Tuple[Array, Array]:
    """(q with the rows beyond each row's count [B] zeroed, proposed mask [B, G]). A zero q
    is 'nothing proposed': it is never accepted and leaves p itself as the residual."""
    G = q.shape[1]
    if count is None:
        return q, jnp.ones(q.shape[:2], bool)
    proposed = jnp.arange(G)[None, :] < count[:, None]                         # [B, G]
    return jnp.where(proposed[..., None], q, 0.0), proposed


def _argmax_rule(p: Array, drafts: Array, proposed: Array) -> Tuple[Array, Array, Array]:
    """Greedy verification (token and block alike): the longest prefix of proposed drafts
    equal to the target's argmaxes, then the target's argmax after it."""
    n, accepted = _prefix((drafts == jnp.argmax(p[:, :drafts.shape[1]], axis=-1)) & proposed)
    return n, jnp.argmax(_at(p, n), axis=-1).astype(jnp.int32), accepted


def _correction(key: Array, p: Array, q: Array, n: Array, weight: Array) -> Array:
    """The token after n accepted drafts, from norm(max(0, w p_{n+1} - q_{n+1})) with q_{G+1}
    = 0 (so from p_{G+1} when all G were accepted). Token-wise w = 1; block w = p_n of
    Sun et al. keys [B], p [B, G+1, V], q [B, G, V], n [B], weight [B] -> int32 [B]."""
    p_next = _at(p, n)                                                         # [B, V]
    q_next = _at(jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1), n)    # 0 when n == G
    residual = jnp.maximum(weight[:, None] * p_next - q_next, 0.0)
    # a stop (a rejection) happens only where the residual has mass; guard round-off anyway
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_next)
    return sample(key, residual)


def verify(rng: Array, p: Array, q: Array, drafts: Array, greedy,
           lenience: float = 1.0, count: Array | None = None) -> Tuple[Array, Array, Array]:
    """Algorithm 1's accept/reject for a batch of rows.

    rng [B]: one key per row. p [B, G+1, V] target distributions, q [B, G, V] the draft
    distributions the drafts [B, G] were sampled from. Accept draft i with probability
    min(1, p_i(x)/(l q_i(x))), left to right, stopping at the first rejection (greedy:
    accept iff x_i is p_i's argmax). Returns (n [B] accepted drafts, next token [B], accepted
    mask [B, G]): the next token comes from norm(max(0, p_{n+1} - q_{n+1})) after a
    rejection, from p_{n+1} when all proposed were accepted. count [B]: drafts each row
    proposed (default G); drafts[:, count:] are never accepted."""
    G = drafts.shape[1]
    k_accept, k_next = split_rows(rng, 2)
    q, proposed = _proposed(q, count)

    def sampled_rule(p, q):
        u = _uniform(k_accept, G)                                              # [B, G]
        # u < min(1, p/(l q)), not dividing by q
        ok = u * lenience * _drafted(q, drafts) < _drafted(p[:, :G], drafts)
        n, accepted = _prefix(ok & proposed)
        return n, _correction(k_next, p, q, n, jnp.ones(n.shape, p.dtype)), accepted

    return branch(greedy, lambda p, q: _argmax_rule(p, drafts, proposed), sampled_rule, p, q)


def block_weights(p: Array, q: Array, drafts: Array) -> Tuple[Array, Array]:
    """Sun et al. (2025), Algorithm 2's weights and stop probabilities for a batch of rows.

    p [B, G+1, V], q [B, G, V], drafts [B, G] as in `verify`. Returns
      w [B, G+1]: w_0 = 1, w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1)       (their p_i)
      h [B, G]:   column i-1 holds h_i, the probability of stopping at i (i accepted):
                  h_i = r_i / (r_i + 1 - w_i), r_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0)
                  for i < G (0 where r_i = 0: no residual to sample), h_G = w_G.
    Here p_i, q_i are the distributions of draft i given the i-1 before it (the paper's
    M_b(. | c, X^{i-1}), M_s(. | c, X^{i-1}))."""
    B, G = drafts.shape
    p_x, q_x = _drafted(p[:, :G], drafts), _drafted(q, drafts)                 # [B, G]

    def weight(w, pq):                                                         # w [B]
        p_x, q_x = pq
        w = _divide(jnp.minimum(w * p_x, q_x), q_x)  # q_x > 0: the draft sampled x
        return w, w

    _, w = jax.lax.scan(weight, jnp.ones((B,), p.dtype), (p_x.T, q_x.T))       # [G, B]
    w = jnp.concatenate([jnp.ones((B, 1), p.dtype), w.T], axis=1)              # [B, G+1]
    r = jnp.sum(jnp.maximum(w[:, :G, None] * p[:, :G] - q, 0.0), axis=-1)      # [B, G] r_0..r_{G-1}
    h = _divide(r, r + (1.0 - w[:, :G]))                                       # h_0..h_{G-1}
    return w, jnp.concatenate([h[:, 1:], w[:, G:]], axis=1)                    # h_1..h_G


def verify_block(rng: Array, p: Array, q: Array, drafts: Array, greedy,
                 lenience: float = 1.0, count: Array | None = None) -> Tuple[Array, Array, Array]:
    """Block verification: Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh, "Block
    Verification Accelerates Speculative Decoding" (ICLR 2025, arXiv 2403.10444), Algorithm 2.
    Same inputs and outputs as `verify`; exact, and never fewer accepted drafts on average.

    With w, h from `block_weights`: draw eta_1..eta_G ~ U(0, 1) and accept
    n = max{i : eta_i < h_i} (0 if none) drafts -- read backward, stop at i with probability
    h_i given no stop after i. The next token comes from
      p_res(x) = norm(max(w_n p_{n+1}(x) - q_{n+1}(x), 0))   for n < G,  p_{G+1} for n = G.
    G = 1 is exactly Algorithm 1. Greedy (one-hot p, q) is exactly token-wise: the longest
    argmax-matching prefix, then the target's argmax. lenience must be 1 (see
    `check_verification`). count [B]: drafts each row proposed; with q zero beyond it,
    w and h vanish there and h_count = w_count: Algorithm 2 on the shorter block."""
    check_verification("block", lenience)
    G = drafts.shape[1]
    k_accept, k_next = split_rows(rng, 2)
    q, proposed = _proposed(q, count)

    def sampled_rule(p, q):
        w, h = block_weights(p, q, drafts)                                     # [B, G+1], [B, G]
        eta = _uniform(k_accept, G)                                            # [B, G]
        n = jnp.max(jnp.where(eta < h, jnp.arange(1, G + 1), 0), axis=1)       # [B]
        accepted = jnp.arange(G)[None, :] < n[:, None]                         # [B, G]
        w_n = jnp.take_along_axis(w, n[:, None], axis=1)[:, 0]                 # [B]
        return n, _correction(k_next, p, q, n, w_n), accepted

    return branch(greedy, lambda p, q: _argmax_rule(p, drafts, proposed), sampled_rule, p, q)


VERIFIERS = {"token": verify, "block": verify_block}
