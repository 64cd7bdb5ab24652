"""Token trees' acceptance rule (decoding/trees.py) against exact enumeration.

A target and a draft that are tables over a 5-token vocabulary (a distribution for every
prefix up to the tree's depth), so the target's distribution of the first D + 1 tokens is a
product enumerated exactly. Each of 60,000 rows drafts its tree with `draw_children` from
the draft's table, `verify_tree` accepts a path and a next token, and the row is finished
to D + 1 tokens by sampling the target's table (exact by construction). Chi-square of the
rows against the enumeration, per tree shape, drawn and deterministic children, and
temperature, top-k and top-p (applied to both tables, as a decode adjusts p and q); the
same test must reject two wrong rules."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
import test_exactness as tx
from speculative_t5.decoding import trees
from speculative_t5.decoding.sampling import adjust
from speculative_t5.decoding.trees import TreeShape, draw_children, verify_tree

V, N = 5, 60_000
SHAPES = [(2, 1), (2, 2), (3, 1, 1)]


def _tables(depth: int, sampling, seed: int):
    """(P, Q): adjusted distributions [M, V] for every prefix of 0..depth tokens (row
    `_index`), the draft's a blurred copy of the target's so both rules' branches run."""
    rng = np.random.RandomState(seed)
    rows = sum(V ** d for d in range(depth + 1))
    target = rng.normal(0.0, 1.5, (rows, V))
    draft = 0.5 * target + rng.normal(0.0, 1.2, (rows, V))
    return (np.asarray(adjust(jnp.asarray(x, jnp.float32), sampling), np.float64)
            for x in (target, draft))


def _index(prefix) -> int:
    """A prefix's row in the tables: prefixes of each length in itertools.product order."""
    offset = sum(V ** d for d in range(len(prefix)))
    return offset + int(sum(t * V ** (len(prefix) - 1 - i) for i, t in enumerate(prefix)))


def _enumerate(P, length: int):
    """{sequence of `length` tokens: its probability under the table P}."""
    dist = {}
    for seq in itertools.product(range(V), repeat=length):
        dist[seq] = float(np.prod([P[_index(seq[:t]), seq[t]] for t in range(length)]))
    return dist


@functools.lru_cache(maxsize=None)
def _runner(tree: TreeShape, deterministic: bool, greedy: bool):
    """One compiled program per tree kind: (P, Q, keys) -> (the trees' tokens, the verdict)."""
    n, D, off = tree.num_nodes, tree.depth, tree.offsets

    @jax.jit
    def run(Pj, Qj, keys):
        tokens = jnp.zeros((N, n), jnp.int32)
        rows = jnp.zeros((N, n), jnp.int32)               # each node's table row
        for d in range(D):
            nodes = jnp.arange(off[d], off[d + 1])
            q = Qj[rows[:, nodes]].reshape(-1, V)            # [N * n_d, V]
            k = jax.vmap(lambda key: jax.random.split(jax.random.fold_in(key, d),
                                                      len(nodes)))(keys)
            k = k.reshape((-1,) + k.shape[2:])                # [N * n_d] keys
            x = draw_children(k, q, tree.branching[d], deterministic)   # [N * n_d, b]
            kids = np.arange(off[d + 1], off[d + 2])
            tokens = tokens.at[:, kids].set(x.reshape(N, -1))
            base = (rows[:, nodes] - sum(V ** j for j in range(d)))[:, :, None]
            child_rows = sum(V ** j for j in range(d + 1)) + base * V + x.reshape(N, len(nodes), -1)
            rows = rows.at[:, kids].set(child_rows.reshape(N, -1))
        verdict = verify_tree(jax.vmap(lambda key: jax.random.fold_in(key, 99))(keys),
                              Pj[rows], Qj[rows], tokens, tree, greedy, deterministic)
        return tokens, verdict
    return run


def _rows(P, Q, tree: TreeShape, deterministic: bool, seed: int, greedy=False):
    """Each row's tree drafted from Q, verified against P: (tokens [N, D + 1] finished by
    sampling P, the verdict, the trees' tokens [N, nodes])."""
    D = tree.depth
    keys = jax.random.split(jax.random.PRNGKey(seed), N)
    run = _runner(tree, deterministic, greedy)
    Pj, Qj = jnp.asarray(P, jnp.float32), jnp.asarray(Q, jnp.float32)
    tokens, v = jax.tree_util.tree_map(np.asarray, run(Pj, Qj, keys))
    out = np.zeros((N, D + 1), np.int64)
    for d in range(D):
        out[:, d] = np.where(v.depth > d, np.take_along_axis(tokens, v.path[:, d:d + 1], 1)[:, 0], 0)
    out[np.arange(N), v.depth] = v.next_token
    rng = np.random.RandomState(seed + 1)
    for t in range(1, D + 1):                               # finish each row from P
        todo = v.depth < t
        index = sum(V ** d for d in range(t)) + out[todo, :t] @ (V ** np.arange(t - 1, -1, -1))
        probs = P[index]                                    # _index of each row's prefix
        cdf = np.cumsum(probs, 1)
        out[todo, t] = np.minimum((rng.rand(todo.sum(), 1) > cdf).sum(1), V - 1)
    return out, v, tokens


def _pvalue(samples, P, depth):
    pvalue, cells = tx.chi_square_pvalue(samples, _enumerate(P, depth + 1))
    assert cells >= 12  # top-p 0.8 over 5 tokens leaves ~2 a prefix: 16 cells at depth 2
    return pvalue


@pytest.mark.parametrize("deterministic", [False, True], ids=["drawn", "deterministic"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tree_sampling_matches_target_exactly(shape, deterministic):
    tree = TreeShape.of(shape)
    for i, name in enumerate(sorted(tx.SETTINGS)):
        P, Q = _tables(tree.depth, tx.SETTINGS[name], seed=i)
        samples, v, _ = _rows(P, Q, tree, deterministic, seed=10 * i)
        depths = np.bincount(v.depth, minlength=tree.depth + 1)
        # rejections and full paths both common (with top-k 3 three children cover every
        # token, so depth 0 never ends a round there)
        assert min(depths[-1], depths[:-1].sum()) > 200, (name, depths)
        pvalue = _pvalue(samples, P, tree.depth)
        assert pvalue > 1e-3, (shape, deterministic, name, pvalue)


def test_exactness_test_detects_wrong_tree_rules(monkeypatch):
    """Two wrong rules the same test rejects: every child judged against p itself (no
    residual after a rejection: SpecInfer's rule without its recursion), and later children
    judged against q as if drawn with replacement (not renormalised). (Judging drawn
    children as fixed guesses, q_i one-hot, is no such control: sampling r one guess at a
    time is exact whatever the guesses.)"""
    tree = TreeShape.of((3, 1, 1))
    P, Q = _tables(tree.depth, tx.SETTINGS["T=1"], seed=0)
    pvalues = {}
    for name, (attr, rule) in {"no residual": ("residual", lambda r, q_i: r),
                               "not renormalised": ("child_distribution",
                                                    lambda q, removed, x, d: q)}.items():
        _runner.cache_clear()
        with monkeypatch.context() as m:
            m.setattr(trees, attr, rule)
            samples, _, _ = _rows(P, Q, tree, False, seed=3)
        pvalues[name] = _pvalue(samples, P, tree.depth)
    _runner.cache_clear()
    assert all(p < 1e-6 for p in pvalues.values()), pvalues


def test_greedy_tree_follows_the_targets_argmax():
    """Greedy (one-hot p; children the draft's top k): the accepted path is the target's
    argmax chain for as long as the tree holds it, then the target's argmax; checked row
    by row against a walk over the tables."""
    tree = TreeShape.of((2, 2, 1))
    P, Q = _tables(tree.depth, tx.SETTINGS["T=1"], seed=5)
    chain = []
    for t in range(tree.depth + 1):
        chain.append(int(np.argmax(P[_index(chain)])))
    # children drawn (so trees differ row to row), verified greedily
    samples, v, tokens = _rows(np.eye(V)[np.argmax(P, 1)], Q, tree, False, seed=0, greedy=True)
    assert (samples == np.array(chain)[None, :]).all()
    expected = np.zeros(N, int)
    for row in range(N):
        node = 0
        for d in range(tree.depth):
            off, b = tree.offsets, tree.branching[d]
            kids = off[d + 1] + (node - off[d]) * b + np.arange(b)
            hit = [k for k in kids if tokens[row, k] == chain[d]]
            if not hit:
                break
            node, expected[row] = hit[0], d + 1
    np.testing.assert_array_equal(v.depth, expected)
    assert len(set(expected)) > 1, np.bincount(expected)     # trees that hold more and less


def test_tree_shape():
    tree = TreeShape.of([3, 2, 1, 1])
    assert tree.num_nodes == 1 + 3 + 6 + 6 + 6 and tree.depth == 4
    parents = tree.parents()
    assert list(parents[:10]) == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert (parents[1:] < np.arange(1, tree.num_nodes)).all()
    anc = tree.ancestors()
    assert anc[21].sum() == 5 and anc[21, 0] and anc[21, 15] and anc[21, 9] and anc[21, 3]
    assert list(tree.depths()[[0, 1, 4, 10, 16]]) == [0, 1, 2, 3, 4]
    kids = np.asarray(tree.children(jnp.array([0]), 0)), np.asarray(tree.children(jnp.array([3, 1]), 1))
    assert kids[0].tolist() == [[1, 2, 3]] and kids[1].tolist() == [[8, 9], [4, 5]]
    for bad in ((), (2, 0), "3,2", (2.0,), (True,), None):
        with pytest.raises(ValueError, match="tree must be"):
            TreeShape.of(bad)


def _tree_models():
    from helpers import gpt2_pair, tiny_config
    t5 = st.init_model(tiny_config(), seed=0)
    gpt2 = gpt2_pair(20)[0]
    return {"t5": t5, "gpt2": gpt2}


@pytest.mark.parametrize("beside", [False, True])  # attention beside the cache: as on a TPU
@pytest.mark.parametrize("family", ["t5", "gpt2"])
def test_a_step_over_a_tree_equals_teacher_forcing_along_each_path(family, beside):
    """One decode step over a whole tree (and the same tree written level by level, as a
    draft expands it) gives each node the logits teacher forcing gives its path; after
    `keep_path` the cache continues as if the path had been fed as a chain. Rows of
    different prefix lengths (and a GPT-2's prompts of different lengths)."""
    from speculative_t5.decoding.trees import TreeNodes
    from speculative_t5.model.api import decode, init_cache, keep_path, prefill_cache
    model = _tree_models()[family]
    V = model.config.vocab_size
    rng = np.random.RandomState(0)
    tree = TreeShape.of((3, 2, 1))
    n, B, L = tree.num_nodes, 3, 32
    pos = np.array([0, 4, 2], np.int32)                     # tokens already decoded per row
    ids = rng.randint(2, V - 1, (B, 7)).astype(np.int32)
    history = rng.randint(2, V - 1, (B, 6)).astype(np.int32)  # history[:, 0]: start token
    nodes = rng.randint(2, V - 1, (B, n)).astype(np.int32)
    if family == "t5":
        history[:, 0] = 0
        cache = init_cache(model, ids, L)
        lengths = None
    else:
        lengths = np.array([7, 3, 5], np.int32)
        cache = prefill_cache(model, ids, lengths, L)
    # the history fed as a chain: history[b, :pos[b]] is row b's (the tree's root is
    # history[b, pos[b]]; what a row was fed past its pos is overwritten or never seen)
    for t in range(int(pos.max())):
        _, cache = decode(model, cache, history[:, t:t + 1], np.full(B, t, np.int32))
    nodes[:, 0] = history[np.arange(B), pos]
    whole, whole_cache = decode(model, cache, nodes, pos, tree=TreeNodes.of(tree),
                                 beside_cache=beside)
    level, off = cache, tree.offsets
    parts = []
    for d in range(tree.depth + 1):
        logits, level = decode(model, level, nodes[:, off[d]:off[d + 1]], pos,
                               tree=TreeNodes.of(tree, off[d]), beside_cache=beside)
        parts.append(logits)
    np.testing.assert_allclose(np.concatenate(parts, 1), whole, atol=1e-5, rtol=1e-5)

    def forced(rows_seqs):
        """The teacher-forced logits after each (row, sequence) [n, V], in one forward pass
        (causal: each sequence padded to one width, read at its own last position)."""
        if family == "t5":
            dec = np.array([seq + [2] * (16 - len(seq)) for _, seq in rows_seqs])
            full = np.asarray(st.forward(model, ids[[b for b, _ in rows_seqs]], dec))
            return full[np.arange(len(dec)), [len(seq) - 1 for _, seq in rows_seqs]]
        full_seqs = [list(ids[b, :lengths[b] - 1]) + seq for b, seq in rows_seqs]
        full = np.asarray(st.forward(model, np.array([x + [2] * (24 - len(x)) for x in full_seqs])))
        return full[np.arange(len(full_seqs)), [len(x) - 1 for x in full_seqs]]
    parents = tree.parents()
    cases = []
    for b in range(B):
        for i in range(n):
            path, j = [], i
            while j > 0:
                path.insert(0, int(nodes[b, j]))
                j = parents[j]
            cases.append((b, list(history[b, :pos[b] + 1]) + path))
    np.testing.assert_allclose(whole.reshape(B * n, -1), forced(cases), atol=1e-4, rtol=1e-4,
                               err_msg=family)
    # keep a path of each depth 0..3, then one chain step after it
    chosen = np.array([[1, 4, 10], [3, 8, 0], [0, 0, 0]], np.int32)
    depth = np.array([3, 2, 0], np.int32)
    kept = keep_path(model, whole_cache, pos, chosen, depth)
    nxt = rng.randint(2, V - 1, (B, 1)).astype(np.int32)
    after, _ = decode(model, kept, nxt, pos + depth + 1, beside_cache=beside)
    cases = [(b, list(history[b, :pos[b] + 1]) + [int(nodes[b, k]) for k in chosen[b, :depth[b]]]
              + [int(nxt[b, 0])]) for b in range(B)]
    np.testing.assert_allclose(after[:, 0], forced(cases), atol=1e-4, rtol=1e-4,
                               err_msg=f"{family} after keep_path")


# --- token trees through st.generate ---------------------------------------------------

def _perturbed(target, scale=0.05):
    return st.Model(target.config, jax.tree_util.tree_map(
        lambda x: x + scale * jax.random.normal(jax.random.PRNGKey(1), x.shape), target.params))


@pytest.fixture(scope="module")
def greedy_case():
    import test_drafts as td
    return td.make_greedy_case()


@pytest.mark.parametrize("children", ["drawn", "top_k"])
def test_greedy_tree_equals_plain(greedy_case, children):
    """Rows of different lengths, an EOS greedy emits mid-sequence (rows stop inside a
    tree's path), outputs much longer than the tree: the same tokens as plain greedy, and
    more tokens per call than a chain of the tree's depth where the draft is close."""
    import test_drafts as td
    import test_generate as tg
    target, inputs, plain, _ = greedy_case
    draft = _perturbed(target)
    out = st.generate(target, inputs, draft=draft, tree=(3, 2, 1), tree_children=children,
                      max_decode_len=td.MAX_LEN)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    tg._check_stats(out, 3, fixed_model_draft=False)
    assert (out.lengths < td.MAX_LEN).sum() >= 2 and (out.lengths > 4).sum() >= 4
    summary = out.summary()
    assert summary["tree"] == [3, 2, 1] and summary["nodes_per_target_call"] == 3 + 6 + 6
    # every accepted depth was one rank's acceptance; a rank is judged after earlier ones fail
    s = out.stats
    np.testing.assert_array_equal(s["rank_accepted"].sum(1), s["accepted_at"].sum(1))
    assert (s["rank_tried"][:, 1:] <= s["rank_tried"][:, :1]).all()
    assert len(summary["acceptance_rate_by_rank"]) == 3
    chain = st.generate(target, inputs, draft=draft, gamma=3, max_decode_len=td.MAX_LEN)
    assert summary["tokens_per_target_call"] >= chain.summary()["tokens_per_target_call"]


def test_greedy_tree_equals_plain_gpt2():
    """GPT-2: prompts of lengths 1..9 right-padded, each row continuing at its own position."""
    from helpers import gpt2_pair
    target, draft, prompts, lengths = gpt2_pair(20)
    plain = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=20)
    out = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=20, draft=draft,
                      tree=(2, 2, 1))
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    assert (plain.lengths < 20).any()


@pytest.mark.parametrize("shape,children,setting", [  # the rule's every setting: above
    ((2, 2), "drawn", "T=1"),
    pytest.param((3, 1), "top_k", "T=1", marks=pytest.mark.slow),
    pytest.param((2, 1), "drawn", "top-p 0.8", marks=pytest.mark.slow),
    pytest.param((3, 1), "drawn", "top-k 3", marks=pytest.mark.slow)], ids=str)
def test_tree_decode_sampling_is_exact(shape, children, setting):
    """The first tokens of a tree decode (T5, EOS inside) against the target's exact
    distribution (test_exactness's enumeration), as the chain decodes are tested."""
    sampling = tx.SETTINGS[setting]
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    out = st.generate(target, np.repeat(tx.INPUT, tx.N, 0), draft=draft, tree=shape,
                      tree_children=children, max_decode_len=tx.STEPS, sampling=sampling,
                      rng=jax.random.PRNGKey(7))
    rate = out.summary()["acceptance_rate"]
    assert 0.1 < rate < 0.95, rate                       # both branches exercised
    pvalue, cells = tx.chi_square_pvalue(out.tokens, tx.exact_distribution(target, sampling))
    assert cells >= 20 and pvalue > 1e-3, (shape, children, setting, pvalue)


def test_expected_tokens_against_simulation():
    """`expected_tokens` against eq. (1) for chains and a Monte Carlo walk over trees whose
    i-th child is accepted with rank_alpha[i] once the earlier ones are rejected."""
    from speculative_t5.decoding.trees import expected_tokens
    from speculative_t5.measure.analysis import expected_tokens_per_call
    for a in (0.3, 0.7, 0.9):
        assert expected_tokens((1,) * 4, [a]) == pytest.approx(expected_tokens_per_call(a, 4))
    rng = np.random.RandomState(0)
    for shape, rates in (((3, 2, 1), [0.5, 0.3, 0.2]), ((2, 2, 2, 1), [0.6, 0.25])):
        n = 200_000
        tokens = np.ones(n)
        alive = np.ones(n, bool)
        for b in shape:
            passed = np.zeros(n, bool)
            for i in range(b):
                passed |= ~passed & (rng.rand(n) < rates[min(i, len(rates) - 1)])
            alive &= passed
            tokens += alive
        assert expected_tokens(shape, rates) == pytest.approx(tokens.mean(), abs=0.01)
    with pytest.raises(ValueError, match="at least one"):
        expected_tokens((2, 1), [])


def test_tree_options_are_checked():
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    cases = {"tree needs a draft model": dict(draft=st.drafts.PromptLookup(), tree=(2, 1)),
             "block verification is chain-only": dict(draft=draft, tree=(2, 1), verification="block"),
             "trees are exact only": dict(draft=draft, tree=(2, 1), lenience=0.5),
             "draft_stop": dict(draft=draft, tree=(2, 1), draft_stop=0.3),
             "adaptive_gamma": dict(draft=draft, tree=(2, 1), adaptive_gamma=True),
             "tree_children must be": dict(draft=draft, tree=(2, 1), tree_children="best"),
             "tree must be": dict(draft=draft, tree=(2, 0))}
    for message, kw in cases.items():
        with pytest.raises(ValueError, match=message):
            st.generate(target, tx.INPUT, **kw)
