"""Token trees: a static tree shape, the draft's children drawn without replacement, and
exact recursive rejection sampling over the tree (SpecInfer, Miao et al. 2024; RSD, Jeon et
al. 2024), so one target call can check many continuations and stay exact.

A shape is the children per node at each depth: (3, 2, 1, 1) is a root (the row's last
emitted token) with 3 children, each with 2, then chains: 1 + 3 + 6 + 6 + 6 = 22 nodes.
Nodes are numbered level by level, a level ordered by parent, then by the child's rank, so
node i's children are consecutive and every ancestor comes before its descendants.

Acceptance at a node with target distribution p and children x_1..x_k, x_i drawn from q_i
(the draft's q with x_1..x_{i-1} removed and renormalised; a one-hot for deterministic
children such as top-k or prompt-lookup ones): r = p; for i = 1..k accept x_i with
probability min(1, r(x_i) / q_i(x_i)) and descend to it; else r <- norm(max(r - q_i, 0)).
If every child is rejected the round ends with y ~ r; a fully accepted leaf ends it with
y ~ its p. Each level outputs exactly p (the recursive argument of Algorithm 1), so the
emitted tokens are distributed as the target's. Greedy: descend while the target's argmax
is a child, then emit the argmax.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.sampling import branch, sample, split_rows

Array = jax.Array


class TreeShape(NamedTuple):
    """A static token tree (hashable: a jit's static argument). branching[d] is the number
    of children of every node at depth d; node 0 is the root."""
    branching: Tuple[int, ...]

    @classmethod
    def of(cls, branching: Sequence[int]) -> "TreeShape":
        """A shape checked: a non-empty sequence of ints >= 1."""
        b = tuple(branching) if isinstance(branching, (tuple, list)) else None
        if not b or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                            and k >= 1 for k in b):
            raise ValueError(f"tree must be a non-empty sequence of children per depth, each an "
                             f"int >= 1 (e.g. (3, 2, 1, 1)), got {branching!r}")
        return cls(tuple(int(k) for k in b))

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def level_sizes(self) -> Tuple[int, ...]:
        """Nodes at depth 0..D: 1, b_1, b_1 b_2, ..."""
        return tuple(int(np.prod(self.branching[:d])) for d in range(self.depth + 1))

    @property
    def offsets(self) -> Tuple[int, ...]:
        """The first node of each depth 0..D, and the node count last."""
        return tuple(int(x) for x in np.cumsum((0,) + self.level_sizes))

    @property
    def num_nodes(self) -> int:
        """Nodes with the root: what one target call over the tree reads."""
        return self.offsets[-1]

    def depths(self) -> np.ndarray:
        """Each node's depth [N]."""
        return np.repeat(np.arange(self.depth + 1), self.level_sizes)

    def parents(self) -> np.ndarray:
        """Each node's parent [N] (the root's is -1)."""
        off = self.offsets
        return np.concatenate([[-1]] + [off[d] + np.arange(self.level_sizes[d + 1]) // self.branching[d]
                                        for d in range(self.depth)]).astype(np.int32)

    def ancestors(self) -> np.ndarray:
        """[N, N] bool: node j is node i or one of its ancestors (what node i attends to)."""
        parents, n = self.parents(), self.num_nodes
        mask = np.eye(n, dtype=bool)
        for i in range(1, n):
            mask[i] |= mask[parents[i]]
        return mask

    def children(self, node: Array, depth: int) -> Array:
        """The children [B, b] of nodes [B] at `depth` (static)."""
        off, b = self.offsets, self.branching[depth]
        return off[depth + 1] + (node - off[depth])[:, None] * b + jnp.arange(b)[None, :]


class TreeNodes(NamedTuple):
    """Nodes start..start + K - 1 of a tree written by one model step (static): the step's
    K tokens go to cache slots pos + start.., each at position pos + its depth, each seeing
    the slots before pos and its ancestors' slots (`model.api.decode`'s `tree`)."""
    depths: Tuple[int, ...]                  # [N] every node's depth
    ancestors: Tuple[Tuple[bool, ...], ...]  # [N, N] ancestor-or-self
    start: int = 0

    @classmethod
    def of(cls, tree: TreeShape, start: int = 0) -> "TreeNodes":
        return cls(tuple(int(d) for d in tree.depths()),
                   tuple(tuple(bool(a) for a in row) for row in tree.ancestors()), start)

    def attention(self, pos: Array, K: int, L: int) -> Tuple[Array, Array, Array, Array]:
        """For K tokens written at pos [B] into a cache of L slots: (slots [B, K] they are
        written to, their positions [B, K], every slot's position [B, L], visible [B, K, L])."""
        depths, anc = np.asarray(self.depths), np.asarray(self.ancestors)
        N = len(depths)
        nodes = self.start + np.arange(K)
        rel = jnp.arange(L)[None, :] - pos[:, None]                            # [B, L]
        in_tree = (rel >= 0) & (rel < N)
        node = jnp.clip(rel, 0, N - 1)
        k_pos = jnp.where(in_tree, pos[:, None] + jnp.asarray(depths)[node], jnp.arange(L)[None, :])
        sees = jnp.asarray(anc[nodes])[:, node]                                # [K, B, L]
        visible = (rel < 0)[:, None, :] | (in_tree[:, None, :] & jnp.transpose(sees, (1, 0, 2)))
        return (pos[:, None] + jnp.asarray(nodes)[None, :],
                pos[:, None] + jnp.asarray(depths[nodes])[None, :], k_pos, visible)


def _at(x: Array, node: Array) -> Array:
    """x [B, N, ...] at per-row nodes [B] -> [B, ...]."""
    return jnp.take_along_axis(x, node.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def _normalise(r: Array, fallback: Array) -> Array:
    """r / sum(r) over the last axis, `fallback` where r has no mass (round-off only)."""
    total = jnp.sum(r, axis=-1, keepdims=True)
    return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), fallback)


def draw_children(key: Array, q: Array, k: int, deterministic: bool) -> Array:
    """k distinct children [B, k] of each row's node from the draft's q [B, V] (keys [B]):
    drawn without replacement (Gumbel top-k: the first a draw from q, each next a draw from
    q without the ones before), or q's top k when deterministic. Where fewer than k tokens
    have mass the rest are tokens q cannot give, which verification never accepts."""
    logq = jnp.log(q)
    if not deterministic:
        logq = logq + jax.vmap(lambda kk: jax.random.gumbel(kk, q.shape[-1:]))(key)  # [B, V]
    return jax.lax.top_k(logq, k)[1].astype(jnp.int32)                       # [B, k]


def child_distribution(q: Array, removed: Array, x: Array, deterministic: bool) -> Array:
    """q_i [B, V]: what child x [B] was drawn from -- q [B, V] without the earlier children
    (`removed` [B, V] bool), renormalised; a one-hot of x when deterministic."""
    if deterministic:
        return jax.nn.one_hot(x, q.shape[-1], dtype=q.dtype)
    kept = jnp.where(removed, 0.0, q)
    return _normalise(kept, jnp.zeros_like(q))


def residual(r: Array, q_i: Array) -> Array:
    """What the node's next child is judged against after x_i (drawn from q_i) is rejected:
    norm(max(r - q_i, 0)) [B, V]."""
    return _normalise(jnp.maximum(r - q_i, 0.0), r)


def expected_tokens(branching: Sequence[int], rank_alpha: Sequence[float]) -> float:
    """Tokens a round of this shape emits on average if a node's i-th child is accepted with
    probability rank_alpha[i] once its earlier siblings are rejected (past the ranks given,
    the last), the same at every depth: depth d is passed with s_d = 1 - prod_{i < b_d}
    (1 - a_i), and a round emits 1 + sum_d s_1 ... s_d tokens. A chain, (1,) * gamma with
    [alpha], is eq. (1). Rank rates come from a tree decode's summary
    (`acceptance_rate_by_rank`), so one decode prices the shapes it did not run."""
    a = list(rank_alpha)
    if not a:
        raise ValueError("rank_alpha must hold at least one rate")
    total, reach = 1.0, 1.0
    for b in branching:
        miss = float(np.prod([1.0 - a[min(i, len(a) - 1)] for i in range(b)]))
        reach *= 1.0 - miss
        total += reach
    return total


class TreeVerdict(NamedTuple):
    depth: Array      # [B] accepted nodes (the accepted path's length)
    path: Array       # [B, D] the accepted nodes, depth 1..D (0 past `depth`)
    next_token: Array  # [B] the token after the path
    accepted: Array   # [B, D] bool: a node at depth d + 1 was accepted
    reached: Array    # [B, D] bool: depth d + 1 was tried (its parent accepted, drafted)
    rank_tried: Array     # [B, b] children of rank i judged, over the depths
    rank_accepted: Array  # [B, b] children of rank i accepted (a rank's acceptance rate:
                          # given every earlier sibling rejected; `expected_tokens`)


def verify_tree(rng: Array, p: Array, q: Array, tokens: Array, tree: TreeShape, greedy,
                deterministic: bool = False, count: Array | None = None) -> TreeVerdict:
    """Recursive rejection sampling over a batch of token trees (module docstring).

    rng [B]: a key per row. p [B, N, V]: the target's distribution after each node (the
    tree's positions), q [B, N, V]: the draft's distribution each node's children were
    drawn from (leaves' unused), tokens [B, N]: each node's token (the root's unused).
    deterministic: the children are q's top-k / fixed guesses (q_i one-hot), else draws
    without replacement (`draw_children`). count [B]: the depth each row drafted to
    (default D); deeper nodes are never accepted."""
    B, N, V = p.shape
    D = tree.depth
    widest = max(tree.branching)
    k_accept, k_next = split_rows(rng, 2)
    limit = jnp.full((B,), D, jnp.int32) if count is None else count
    u = jax.vmap(lambda k: jax.random.uniform(k, (D, widest)))(k_accept)      # [B, D, b]

    def descend(p, q):
        node = jnp.zeros((B,), jnp.int32)
        alive = jnp.ones((B,), bool)
        final = jnp.zeros((B, V), p.dtype)                 # where each row's round ends
        path, accepted, reached = [], [], []
        tried_at = accepted_at = jnp.zeros((B, widest), jnp.int32)
        for d in range(D):
            kids = tree.children(node, d)                                      # [B, b]
            x = jnp.take_along_axis(tokens, kids, axis=1)                      # [B, b]
            tries = alive & (d < limit)
            r, q_node = _at(p, node), _at(q, node)                             # [B, V]
            removed = jnp.zeros((B, V), bool)
            found, chosen = jnp.zeros((B,), bool), node
            for i in range(tree.branching[d]):
                q_i = child_distribution(q_node, removed, x[:, i], deterministic)
                q_x = jnp.take_along_axis(q_i, x[:, i:i + 1], axis=-1)[:, 0]      # [B]
                r_x = jnp.take_along_axis(r, x[:, i:i + 1], axis=-1)[:, 0]
                live = tries & ~found & (q_x > 0)       # q_i(x_i) = 0: never drawn, skipped
                ok = live & (u[:, d, i] * q_x < r_x)    # u < min(1, r / q_i), not dividing
                tried_at = tried_at.at[:, i].add(live.astype(jnp.int32))
                accepted_at = accepted_at.at[:, i].add(ok.astype(jnp.int32))
                chosen, found = jnp.where(ok, kids[:, i], chosen), found | ok
                rejected = live & ~ok
                r = jnp.where(rejected[:, None], residual(r, q_i), r)
                removed = removed | jax.nn.one_hot(x[:, i], V, dtype=bool)
            stop = alive & ~found
            final = jnp.where(stop[:, None], r, final)
            reached.append(tries)
            accepted.append(found)
            alive, node = found, chosen
            path.append(jnp.where(found, chosen, 0))
        final = jnp.where(alive[:, None], _at(p, node), final)               # a leaf: its p
        return (jnp.stack(path, 1), sample(k_next, final), jnp.stack(accepted, 1),
                jnp.stack(reached, 1), tried_at, accepted_at)

    def argmax_rule(p, q):
        node = jnp.zeros((B,), jnp.int32)
        alive = jnp.ones((B,), bool)
        path, accepted, reached = [], [], []
        tried_at = accepted_at = jnp.zeros((B, widest), jnp.int32)
        for d in range(D):
            kids = tree.children(node, d)                                      # [B, b]
            x = jnp.take_along_axis(tokens, kids, axis=1)                      # [B, b]
            best = jnp.argmax(_at(p, node), axis=-1).astype(jnp.int32)         # [B]
            tries = alive & (d < limit)
            match = (x == best[:, None]) & tries[:, None]                      # [B, b]
            before = jnp.cumsum(match, axis=1) - match                         # matches before i
            tried = tries[:, None] & (before == 0)                             # [B, b]
            pad = ((0, 0), (0, widest - x.shape[1]))
            tried_at = tried_at + jnp.pad(tried, pad).astype(jnp.int32)
            accepted_at = accepted_at + jnp.pad(match & tried, pad).astype(jnp.int32)
            found = jnp.any(match, axis=1)
            node = jnp.where(found, jnp.take_along_axis(kids, jnp.argmax(match, 1)[:, None], 1)[:, 0], node)
            path.append(jnp.where(found, node, 0))
            accepted.append(found)
            reached.append(tries)
            alive = found
        nxt = jnp.argmax(_at(p, node), axis=-1).astype(jnp.int32)
        return (jnp.stack(path, 1), nxt, jnp.stack(accepted, 1), jnp.stack(reached, 1),
                tried_at, accepted_at)

    path, nxt, accepted, reached, tried_at, accepted_at = branch(greedy, argmax_rule, descend, p, q)
    return TreeVerdict(jnp.sum(accepted, axis=1).astype(jnp.int32), path, nxt, accepted, reached,
                       tried_at, accepted_at)
