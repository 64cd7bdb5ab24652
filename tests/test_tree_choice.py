"""Choosing a token tree's shape (measure/tree_choice.py): the price of a round worked out
by hand, the choice flipping with the costs, plain decoding when nothing pays, and the
measured chooser's rates and costs taken from a real probe decode and real step timings."""
import numpy as np
import pytest

import speculative_t5 as st
from speculative_t5.measure.tree_choice import choose, choose_tree, probe_shape, round_cost
from speculative_t5.decoding.trees import TreeShape


def test_round_cost_and_choice_by_hand():
    # rates 0.5 then 0.3: (1, 1) emits 1 + .5 + .25 = 1.75; (2, 1) passes depth 1 with
    # 1 - .5 * .7 = .65 and emits 1 + .65 + .65 * .5 = 1.975
    rates = [0.5, 0.3]
    target = {1: 1.0, 3: 1.2, 5: 1.5}
    draft = {1: 0.1, 2: 0.15}
    # (1, 1): draft over the root, then over the 1 node of depth 1; target over 3 nodes
    assert round_cost(TreeShape.of((1, 1)), target, draft) == pytest.approx(0.1 + 0.1 + 1.2)
    # (2, 1): draft over the root, then over depth 1's 2 nodes; target over 1 + 2 + 2
    assert round_cost(TreeShape.of((2, 1)), target, draft) == pytest.approx(0.1 + 0.15 + 1.5)
    c = choose([(1, 1), (2, 1)], rates, target, draft)
    speedups = {r["tree"]: r["speedup"] for r in c.table}
    assert speedups[(1, 1)] == pytest.approx(1.75 / 1.4)
    assert speedups[(2, 1)] == pytest.approx(1.975 / 1.75)
    assert c.tree == (1, 1) and [r["tree"] for r in c.table] == [(1, 1), (2, 1)]
    assert c.table[1]["nodes"] == 4 and c.rank_alpha == (0.5, 0.3)
    # a flat verify pass (an accelerator's) makes the wider tree pay: 1.975 / 1.45 > 1.75 / 1.4
    c = choose([(1, 1), (2, 1)], rates, {1: 1.0, 3: 1.2, 5: 1.2}, draft)
    assert c.tree == (2, 1)
    # nothing beats a plain step when the draft is never accepted
    assert choose([(1, 1), (2, 1)], [0.0], target, draft).tree is None


def test_probe_shape_covers_the_menu():
    assert probe_shape([(1, 1, 1, 1), (3, 2, 1), (2, 1, 1, 1, 1)]) == (3, 1, 1, 1, 1)


def test_choose_tree_measures_on_the_inputs():
    from helpers import tiny_config
    cfg = tiny_config()
    target, draft = st.init_model(cfg, seed=0), st.init_model(cfg, seed=1)
    ids = np.random.RandomState(0).randint(2, cfg.vocab_size, (2, 6)).astype(np.int32)
    menu = [(1, 1), (2, 1)]
    c = choose_tree(target, draft, ids, menu=menu, max_decode_len=12, rounds=2)
    probe = st.generate(target, ids, draft=draft, tree=(2, 1), max_decode_len=12)
    assert c.rank_alpha == pytest.approx(probe.summary()["acceptance_rate_by_rank"])
    assert sorted(r["tree"] for r in c.table) == menu
    for r in c.table:
        assert r["cost"] > 0
        assert r["speedup"] == pytest.approx(r["expected_tokens"] / r["cost"])
    best = max(c.table, key=lambda r: r["speedup"])
    assert c.tree == (best["tree"] if best["speedup"] > 1 else None)
    with pytest.raises(ValueError, match="needs a draft model"):
        choose_tree(target, st.drafts.PromptLookup(), ids)
    with pytest.raises(ValueError, match="tree must be"):
        choose_tree(target, draft, ids, menu=[(2, 0)])
