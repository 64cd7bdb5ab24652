"""The token-tree decode loop: each round a draft model expands a static tree of
continuations level by level, the target scores every node in one call (tree attention),
and `trees.verify_tree` accepts a path exactly. One `lax.while_loop` over a batch of rows,
like `loops.speculative_decode`, whose state and statistics it shares (gamma = the tree's
depth: accepted_at / reached_at count depths).

The models are step functions that take `tree=` (`model.api.decode`) and a keep function
`keep(cache, pos, path, depth)` (`model.api.keep_path`) that moves the accepted nodes' keys
and values to the chain's slots after the round.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from speculative_t5.decoding.drafts import ModelDraft, ModelState
from speculative_t5.decoding.loops import SpeculativeState, _buffer, _running, _take
from speculative_t5.decoding.output import emit, init_stats, record_call
from speculative_t5.decoding.sampling import SamplingConfig, adjust, branch, fold_rows, split_rows
from speculative_t5.decoding.trees import TreeNodes, TreeShape, draw_children, verify_tree

Array = jax.Array


class TreeProposal(NamedTuple):
    tokens: Array       # [B, N] each node's token (node 0: y_m)
    qs: Array           # [B, N, V] the draft's distribution each node's children came from
    count: Array        # [B] depths drafted
    wide_first: Array   # [B] bool the draft model's first call fed two tokens
    state: Any
    model_steps: Array  # [B] draft-model calls


def propose_tree(draft: ModelDraft, state: ModelState, seq: Array, m: Array, active: Array,
                 tree: TreeShape, sampling: SamplingConfig, keys: Array,
                 deterministic: bool) -> TreeProposal:
    """Catch the draft up to y_m, then one draft call per depth over that depth's nodes
    (the leaves are never fed): each node's children are drawn from its q without
    replacement (or its top k when deterministic; when greedy, the top k of the draft's
    softmax, since its adjusted q is a one-hot)."""
    B, D, off = seq.shape[0], tree.depth, tree.offsets
    logits, state, behind = draft.reach(state, seq, m, active, 1)
    V = logits.shape[-1]
    tokens = jnp.zeros((B, tree.num_nodes), jnp.int32).at[:, 0].set(_take(seq, m[:, None])[:, 0])
    qs = jnp.zeros((B, tree.num_nodes, V), jnp.float32)
    cache = state.cache
    for d in range(D):
        level = slice(off[d], off[d + 1])
        q = adjust(logits, sampling)                                           # [B, n_d, V]
        qs = qs.at[:, level].set(q.reshape(B, -1, V))
        k = jax.vmap(lambda key: jax.random.split(key, off[d + 1] - off[d]))(fold_rows(keys, d))
        k = k.reshape((-1,) + k.shape[2:])                                     # [B n_d] keys
        b = tree.branching[d]
        kids = branch(sampling.greedy,
                      lambda: draw_children(k, jax.nn.softmax(logits.reshape(-1, V)), b, True),
                      lambda: draw_children(k, q.reshape(-1, V), b, deterministic))  # [B n_d, b]
        tokens = tokens.at[:, off[d + 1]:off[d + 2]].set(kids.reshape(B, -1))
        if d + 1 < D:
            logits, cache = draft.step(cache, tokens[:, off[d + 1]:off[d + 2]], m,
                                       tree=TreeNodes.of(tree, off[d + 1]))    # [B, n_d+1, V]
    model_steps = jnp.where(active, D, 0).astype(jnp.int32)   # the catch-up call + D - 1 levels
    wide = active & ((behind > 1) | draft.feed_two)                          # [B]
    return TreeProposal(tokens, qs, jnp.full((B,), D, jnp.int32), wide,
                        ModelState(cache, state.fed), model_steps)


def keep_tree(draft: ModelDraft, state: ModelState, m: Array, path: Array, depth: Array,
              tokens: Array, D: int) -> ModelState:
    """The draft's cache after a round: the accepted nodes it fed (depths < D) moved to the
    chain's slots, and `fed` saying so (the tree's other slots invalid)."""
    fed_depth = jnp.minimum(depth, D - 1)                                      # [B]
    cache = draft.keep(state.cache, m, path, fed_depth)
    L = state.fed.shape[1]
    j = jnp.arange(L)[None, :]
    rel = j - m[:, None] - 1                                                   # [B, L]
    path_tokens = jnp.take_along_axis(tokens, path, axis=1)                    # [B, D]
    kept = jnp.take_along_axis(path_tokens, jnp.clip(rel, 0, D - 1), axis=1)   # [B, L]
    fed = jnp.where((rel >= 0) & (rel < fed_depth[:, None]), kept,
                    jnp.where(rel >= 0, -1, state.fed))
    return ModelState(cache, fed)


def tree_decode(target: Callable, keep_target: Callable, target_cache: Any, draft: ModelDraft,
                draft_state: Any, batch: int, max_len: int, eos_id: int, tree: TreeShape,
                sampling: SamplingConfig, rng: Array, deterministic: bool = False,
                start: Any = None):
    """Speculative decoding over token trees (module docstring); every row emits >= 1 token
    a round. rng [B]: a key per row; start [B]: each row's first token (`loops._buffer`)."""
    D = tree.depth
    nodes = TreeNodes.of(tree)
    ranks = jnp.zeros((batch, max(tree.branching)), jnp.int32)
    state = SpeculativeState(_buffer(batch, max_len, start), jnp.zeros((batch,), jnp.int32),
                             jnp.zeros((batch,), bool), target_cache, draft_state, rng,
                             dict(init_stats(batch, D), rank_tried=ranks, rank_accepted=ranks))

    def round_(s: SpeculativeState) -> SpeculativeState:
        rng, k_draft, k_verify = split_rows(s.rng, 3)
        d = propose_tree(draft, s.draft_state, s.seq, s.m, ~s.done, tree, sampling, k_draft,
                         deterministic)
        logits, tcache = target(s.target_cache, d.tokens, s.m, tree=nodes)     # [B, N, V]
        v = verify_tree(k_verify, adjust(logits, sampling), d.qs, d.tokens, tree,
                        sampling.greedy, deterministic, d.count)
        tcache = keep_target(tcache, s.m, v.path, v.depth)
        dstate = keep_tree(draft, d.state, s.m, v.path, v.depth, d.tokens, D)
        steps = jnp.arange(D + 1)[None, :]                                     # [1, D+1]
        path_tokens = jnp.pad(jnp.take_along_axis(d.tokens, v.path, axis=1), ((0, 0), (0, 1)))
        new = jnp.where(steps < v.depth[:, None], path_tokens,
                        jnp.where(steps == v.depth[:, None], v.next_token[:, None], 0))
        seq, m, done, emitted = emit(s.seq, s.m, s.done, new, v.depth + 1, eos_id, max_len)
        stats = record_call(s.stats, ~s.done, emitted, d.count, v.accepted, v.reached,
                            d.wide_first, d.model_steps)
        active = (~s.done).astype(jnp.int32)[:, None]
        stats.update(rank_tried=stats["rank_tried"] + v.rank_tried * active,
                     rank_accepted=stats["rank_accepted"] + v.rank_accepted * active)
        return SpeculativeState(seq, m, done, tcache, dstate, rng, stats)

    s = jax.lax.while_loop(_running, round_, state)
    return s.seq[:, 1:max_len + 1], s.m, s.stats
