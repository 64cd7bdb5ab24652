"""Choosing a token tree's shape for a pair on its own inputs (issue #42): the shape from a
small menu with the most expected tokens per unit of time.

A round of shape b = (b_1, ..., b_D) emits `trees.expected_tokens(b, rank_alpha)` tokens
on average, where rank_alpha[i] is the rate at which a node's i-th child is accepted once
its earlier siblings are rejected -- measured by one probe decode on these inputs
(`acceptance_rate_by_rank`), so one decode prices every shape. It costs, in one-token
target steps T,

    cost(b) = sum_{d < D} c(n_d) + v(N)

where n_d is the number of nodes at depth d (the draft's call at depth d feeds them, the
first call the row's last token), N the tree's node count with the root (the target's one
call), c(n) = a draft step over n tokens / T and v(N) = a target step over N tokens / T,
each timed inside a compiled loop of steps as the decode pays them
(`calibration.step_times`). A chain of gamma is the shape (1,) * gamma; plain decoding
emits 1 token for cost 1, so a shape is chosen only if it beats that.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from speculative_t5.calibration import step_times
from speculative_t5.decoding.sampling import SamplingConfig
from speculative_t5.decoding.trees import TreeShape, expected_tokens
from speculative_t5.engine import cache_positions, generate
from speculative_t5.model.api import Model

# Shapes of at most 16 nodes below the root (the chain of 4 among them), the width a verify
# pass still costs about one step on an accelerator at small batches.
MENU: Tuple[Tuple[int, ...], ...] = (
    (1, 1, 1, 1), (1, 1, 1, 1, 1, 1, 1), (2, 1, 1, 1), (2, 1, 1, 1, 1, 1), (2, 2, 1, 1),
    (2, 2, 2), (3, 1, 1, 1), (3, 1, 1, 1, 1), (3, 2, 1), (4, 1, 1, 1))


class TreeChoice(NamedTuple):
    """tree: the chosen shape (None: plain decoding beats every shape); rank_alpha: the
    probe's rates; table: a row per shape (tree, nodes below the root, expected tokens,
    cost in target steps, expected speedup over plain), best first."""
    tree: Optional[Tuple[int, ...]]
    rank_alpha: Tuple[float, ...]
    table: List[Dict]


def round_cost(tree: TreeShape, target_cost: Dict[int, float], draft_cost: Dict[int, float]) -> float:
    """A round's cost in target steps: the draft's call at each depth < D over that depth's
    nodes, then the target's call over every node (`target_cost[K]`, `draft_cost[K]`: a
    step over K tokens in target steps)."""
    sizes = tree.level_sizes
    return sum(draft_cost[sizes[d]] for d in range(tree.depth)) + target_cost[tree.num_nodes]


def choose(menu: Sequence[Sequence[int]], rank_alpha: Sequence[float],
           target_cost: Dict[int, float], draft_cost: Dict[int, float]) -> TreeChoice:
    """The shape of `menu` with the most expected tokens per target step (module docstring),
    or None where none beats plain decoding (1 token a step)."""
    rows = []
    for b in menu:
        tree = TreeShape.of(b)
        tokens = expected_tokens(tree.branching, rank_alpha)
        cost = round_cost(tree, target_cost, draft_cost)
        rows.append(dict(tree=tree.branching, nodes=tree.num_nodes - 1, expected_tokens=tokens,
                         cost=cost, speedup=tokens / cost))
    rows.sort(key=lambda r: -r["speedup"])
    best = rows[0]["tree"] if rows and rows[0]["speedup"] > 1.0 else None
    return TreeChoice(best, tuple(float(a) for a in rank_alpha), rows)


def probe_shape(menu: Sequence[Sequence[int]]) -> Tuple[int, ...]:
    """The tree that measures every rank the menu needs: as wide at the root as the widest
    node of the menu, then a chain as deep as its deepest shape (a rank's rate is pooled
    over depths, as `expected_tokens` takes it)."""
    return (max(max(b) for b in menu),) + (1,) * (max(len(b) for b in menu) - 1)


def tree_costs(target: Model, draft: Model, menu: Sequence[Sequence[int]], batch: int, width: int,
               max_decode_len: int = 64, rounds: int = 5) -> Tuple[Dict[int, float], Dict[int, float]]:
    """(target_cost, draft_cost): a step over K tokens in one-token target steps, for every
    K a round of the menu's shapes feeds either model, at this batch and input width."""
    trees = [TreeShape.of(b) for b in menu]
    L = cache_positions(max_decode_len + max(t.num_nodes for t in trees),
                        width if target.decoder_only else 0)
    target_k = sorted({1} | {t.num_nodes for t in trees})
    draft_k = sorted({n for t in trees for n in t.level_sizes[:-1]})
    t = step_times({**{("target", k): (target, k) for k in target_k},
                    **{("draft", k): (draft, k) for k in draft_k}},
                   batch, width, L, L // 2, rounds=rounds, steps=8, warmup=1)
    step = t["target", 1]
    return ({k: t["target", k] / step for k in target_k},
            {k: t["draft", k] / step for k in draft_k})


def choose_tree(target: Model, draft: Model, input_ids, menu: Sequence[Sequence[int]] = MENU,
                max_decode_len: int = 64, sampling: SamplingConfig = SamplingConfig(),
                prompt_lengths=None, rounds: int = 5, rng=None) -> TreeChoice:
    """Measure the rank rates with one probe decode of these inputs (`probe_shape`) and the
    steps' costs at these inputs' batch and width (`tree_costs`), then `choose` from `menu`."""
    if not isinstance(draft, Model):
        raise ValueError(f"choose_tree needs a draft model (a tree is a model's proposal), got {draft!r}")
    menu = [TreeShape.of(b).branching for b in menu]
    if not menu:
        raise ValueError("menu must hold at least one tree shape")
    ids = np.asarray(input_ids)
    probe = generate(target, ids, draft=draft, tree=probe_shape(menu), max_decode_len=max_decode_len,
                     sampling=sampling, prompt_lengths=prompt_lengths, rng=rng)
    costs = tree_costs(target, draft, menu, ids.shape[0], ids.shape[1], max_decode_len, rounds)
    return choose(menu, probe.summary()["acceptance_rate_by_rank"], *costs)
