"""Block verification (Sun et al., ICLR 2025, arXiv 2403.10444, Algorithm 2): exact by
enumeration, identical to token-wise when greedy, their motivating example's 11/9 accepted
tokens, never fewer accepted than token-wise, consistent statistics, and its options."""
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
import test_exactness as tx
import test_generate as tg
from helpers import random_ids, tiny_config, train_sentencepiece
from speculative_t5 import commands as cli
from speculative_t5.decoding import sampling
from speculative_t5.decoding.sampling import block_weights, verify, verify_block
from speculative_t5.engine import _generate

N = 60_000  # samples a run; one batch shape, so runs at one (top_k, top_p, gamma) share a program


@pytest.fixture(scope="module")
def pair():
    return st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)


def _block_sample(pair, s, gamma, seed, generate=_generate):
    """The first tx.STEPS tokens of N block-verified speculative samples [N, STEPS]."""
    target, draft = pair
    ids = jnp.asarray(np.repeat(tx.INPUT, N, 0))
    keys = jax.random.split(jax.random.PRNGKey(seed), N)
    tokens, _, stats = generate(target, draft, ids, keys, jnp.float32(s.temperature),
                                jnp.int32(target.config.eos_id), gamma=gamma,
                                max_decode_len=tx.STEPS, top_k=s.top_k, top_p=s.top_p,
                                lenience=1.0, recompute_cross_attention=False,
                                verification="block")
    return np.asarray(tokens), stats


# (setting, gamma, runs of N): 120k samples at T=1, 60k at each other setting
# top-k and top-p in the slow tier: the same adjustment feeds both rules, and token-wise
# verification's chi-squares check it in the default tier
CASES = [("T=1", 2, 2), ("T=0.6", 2, 1), pytest.param("top-k 3", 3, 1, marks=pytest.mark.slow),
         pytest.param("top-p 0.8", 3, 1, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name,gamma,runs", CASES)
def test_block_sampling_matches_target_exactly(pair, name, gamma, runs):
    s = tx.SETTINGS[name]
    samples = np.concatenate([_block_sample(pair, s, gamma, seed)[0] for seed in range(runs)])
    pvalue, cells = tx.chi_square_pvalue(samples, tx.exact_distribution(pair[0], s))
    assert cells >= 20 and pvalue > 1e-3, (name, pvalue, cells)


RIGHT_CORRECTION = sampling._correction
WRONG_RESIDUALS = {  # name: (a wrong next-token rule, runs of N)
    "p_{n+1}, the classic bug": (
        lambda key, p, q, n, w: sampling.sample(key, sampling._at(p, n)), 1),
    "max(p - q, 0): w_n left out": (
        lambda key, p, q, n, w: RIGHT_CORRECTION(key, p, q, n, jnp.ones_like(w)), 2)}


@pytest.mark.parametrize("wrong", [  # the second control in the slow tier
    w if w.startswith("p_") else pytest.param(w, marks=pytest.mark.slow)
    for w in sorted(WRONG_RESIDUALS)])
def test_exactness_test_detects_a_wrong_residual(pair, monkeypatch, wrong):
    """Negative controls: the same test, as many samples, on block verification with its
    residual replaced by a wrong one fails (p < 1e-3 where the test asks p > 1e-3). Traced
    anew under a fresh jit, so the patched rule stays in this test."""
    correction, runs = WRONG_RESIDUALS[wrong]
    monkeypatch.setattr(sampling, "_correction", correction)

    def traced_anew(*args, **kwargs):  # a new function: jax's trace caches miss it
        return _generate.__wrapped__(*args, **kwargs)

    wrong_generate = jax.jit(traced_anew, static_argnames=(
        "gamma", "max_decode_len", "lenience", "verification", "recompute_cross_attention"))
    s = tx.SETTINGS["T=1"]
    samples = np.concatenate([_block_sample(pair, s, 2, seed, generate=wrong_generate)[0]
                              for seed in range(runs)])
    pvalue, _ = tx.chi_square_pvalue(samples, tx.exact_distribution(pair[0], s))
    assert pvalue < 1e-3, (wrong, pvalue)


# the token this target's greedy decoding emits most often mid-sequence (as in
# test_generate's EOS test) becomes its EOS: rows stop inside draft windows (asserted below)
EOS = 38


@pytest.fixture(scope="module")
def greedy_setup():
    target = st.init_model(tiny_config(eos_id=EOS), seed=0)
    rng = np.random.RandomState(3)  # the draft: the target's weights plus 5% noise
    noisy = lambda x: x + 0.05 * np.std(x) * rng.standard_normal(x.shape).astype(x.dtype)
    draft = st.Model(target.config, jax.tree_util.tree_map(noisy, target.params))
    inputs = random_ids(np.random.RandomState(0), 8, 9, 53, pad_tail=[0, 1, 2, 3, 4, 5, 6, 7])
    return target, draft, inputs


def test_greedy_block_equals_token_and_plain(greedy_setup):
    """Batch 8, rows padded to 8 lengths, outputs up to 23 > gamma + 1 tokens, EOS inside
    draft windows: block == token-wise == plain greedy, statistics included."""
    target, draft, inputs = greedy_setup
    gamma = 3
    plain = st.generate(target, inputs, max_decode_len=tg.MAX_LEN)
    token, block = (st.generate(target, inputs, draft=draft, gamma=gamma, max_decode_len=tg.MAX_LEN,
                                verification=v) for v in ("token", "block"))
    for out in (token, block):
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        np.testing.assert_array_equal(out.lengths, plain.lengths)
    for key in ("target_calls", "tokens_per_call_hist", "accepted_at"):
        np.testing.assert_array_equal(block.stats[key], token.stats[key])
    stopped = block.lengths < tg.MAX_LEN
    assert stopped.sum() >= 2 and any(L % (gamma + 1) for L in block.lengths[stopped])
    assert (block.lengths > gamma + 1).sum() >= 4
    assert 0.3 < block.summary()["acceptance_rate"] < 0.97  # some drafts rejected, some not
    assert block.stats["verification"] == "block" and token.stats["verification"] == "token"


def test_sampled_block_rule_on_one_hot_is_the_argmax_rule():
    """The block formulas themselves (not the greedy branch) give the token-wise greedy result
    on one-hot p and q: the longest argmax-matching prefix, then the target's argmax."""
    B, G, V = 512, 4, 5
    rng = np.random.RandomState(0)
    target = rng.randint(V, size=(B, G + 1))
    drafts = np.where(rng.rand(B, G) < 0.7, target[:, :G], rng.randint(V, size=(B, G)))
    p = jax.nn.one_hot(target, V)                                              # [B, G+1, V]
    q = jax.nn.one_hot(drafts, V)                                              # [B, G, V]
    keys = jax.random.split(jax.random.PRNGKey(0), B)
    n, nxt, accepted = jax.jit(verify_block, static_argnames="greedy")(
        keys, p, q, jnp.asarray(drafts, jnp.int32), greedy=False)
    want = np.cumprod(drafts == target[:, :G], axis=1)
    np.testing.assert_array_equal(n, want.sum(1))
    np.testing.assert_array_equal(accepted, want.astype(bool))
    np.testing.assert_array_equal(nxt, target[np.arange(B), want.sum(1)])
    assert 0 < (want.sum(1) == G).sum() < B and (want.sum(1) == 0).any()


def _blocks(V, G):
    return np.array(list(itertools.product(range(V), repeat=G)), np.int32)    # [V^G, G]


def _expected_accepted(p, q, blocks):
    """E[accepted drafts] of block and of token verification for each case, exactly.

    p [C, V^G, G+1, V], q [C, V^G, G, V]: case c's distributions along each draft block
    blocks [V^G, G]. Block: P(n = i | block) = h_i prod_{j > i} (1 - h_j) with h from
    `block_weights`; token: P(n >= i | block) = prod_{j <= i} min(1, p_j(x_j) / q_j(x_j))."""
    C, K, G = p.shape[0], len(blocks), blocks.shape[1]
    drafts = np.broadcast_to(blocks, (C, K, G)).reshape(C * K, G)
    _, h = block_weights(jnp.asarray(p.reshape(C * K, G + 1, -1), jnp.float32),
                         jnp.asarray(q.reshape(C * K, G, -1), jnp.float32), jnp.asarray(drafts))
    h = np.asarray(h, np.float64).reshape(C, K, G)
    later = np.concatenate([np.cumprod((1 - h)[..., ::-1], -1)[..., ::-1][..., 1:],
                            np.ones((C, K, 1))], -1)              # prod_{j > i} (1 - h_j) [C, K, G]
    n_block = (h * later * np.arange(1, G + 1)).sum(-1)                        # [C, K]
    index = np.broadcast_to(blocks, (C, K, G))[..., None]
    take = lambda d: np.take_along_axis(d[:, :, :G], index, -1)[..., 0]        # [C, K, G]
    ratio = np.divide(take(p), take(q), out=np.zeros((C, K, G)), where=take(q) > 0)
    n_token = np.cumprod(np.minimum(1.0, ratio), -1).sum(-1)                   # [C, K]
    weight = np.prod(take(q), -1)                                              # P(block) [C, K]
    return (weight * n_block).sum(1), (weight * n_token).sum(1)


def test_sun_et_al_motivating_example():
    """Sun et al. Section 2: vocabulary {a, b}, context-independent M_b = (1/3, 2/3) (target),
    M_s = (2/3, 1/3) (draft), gamma = 2: token verification accepts 10/9 drafts on average,
    block verification 11/9. Exactly from the implementation's h, then by sampling both rules."""
    Mb, Ms, G = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3]), 2
    blocks = _blocks(2, G)
    p = np.broadcast_to(Mb, (1, len(blocks), G + 1, 2))
    q = np.broadcast_to(Ms, (1, len(blocks), G, 2))
    block, token = _expected_accepted(p, q, blocks)
    np.testing.assert_allclose([block[0], token[0]], [11 / 9, 10 / 9], atol=1e-6)
    B = 100_000
    k_draft, k_verify = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.categorical(k_draft, jnp.log(jnp.asarray(Ms)), shape=(B, G)).astype(jnp.int32)
    P = jnp.broadcast_to(jnp.asarray(Mb, jnp.float32), (B, G + 1, 2))
    Q = jnp.broadcast_to(jnp.asarray(Ms, jnp.float32), (B, G, 2))
    for rule, want in ((verify, 10 / 9), (verify_block, 11 / 9)):
        n, nxt, _ = jax.jit(rule, static_argnames="greedy")(
            jax.random.split(k_verify, B), P, Q, x, greedy=False)
        n, nxt = np.asarray(n), np.asarray(nxt)
        assert abs(n.mean() - want) < 5 * n.std() / np.sqrt(B), (rule.__name__, n.mean())
        # the first emitted token is distributed as M_b
        first = np.where(n >= 1, np.asarray(x[:, 0]), nxt)
        assert abs((first == 1).mean() - 2 / 3) < 5 * np.sqrt(2 / 9 / B)


def _random_dists(rng, shape, V):
    """Random distributions over V tokens, some with zeros (as top-k / top-p make them)."""
    d = rng.dirichlet(np.full(V, 0.7), size=shape)
    d = np.where(rng.rand(*d.shape) < 0.15, 0.0, d)
    d[d.sum(-1) == 0, 0] = 1.0
    return d / d.sum(-1, keepdims=True)


@pytest.mark.parametrize("G", [2, 3])
def test_block_never_accepts_fewer_than_token(G):
    """200 random cases (half context-independent, half with every position's distributions
    depending on the drafts before it), V = 3: E[accepted] of block >= token-wise, exactly."""
    V, C = 3, 200
    rng = np.random.RandomState(G)
    blocks = _blocks(V, G)
    K = len(blocks)
    p = np.empty((C, K, G + 1, V))
    q = np.empty((C, K, G, V))
    for c in range(C):
        if c < C // 2:  # context-independent: one distribution per position
            p[c], q[c] = _random_dists(rng, (1, G + 1), V), _random_dists(rng, (1, G), V)
        else:           # context-dependent: one per prefix of drafts
            table_p, table_q = {}, {}
            for k, block in enumerate(blocks):
                for i in range(G + 1):
                    prefix = tuple(block[:i])
                    if prefix not in table_p:
                        table_p[prefix] = _random_dists(rng, (), V)
                        table_q[prefix] = _random_dists(rng, (), V)
                    p[c, k, i] = table_p[prefix]
                    if i < G:
                        q[c, k, i] = table_q[prefix]
    block, token = _expected_accepted(p, q, blocks)
    assert (block >= token - 1e-5).all(), np.min(block - token)
    assert (block > token + 1e-3).mean() > 0.5  # and usually strictly more
    assert block.max() <= G + 1e-6


def test_block_statistics_are_consistent(greedy_setup):
    target, draft, inputs = greedy_setup
    gamma = 3
    out = st.generate(target, inputs, draft=draft, gamma=gamma, max_decode_len=tg.MAX_LEN,
                      temperature=1.0, verification="block", rng=jax.random.PRNGKey(2))
    tg._check_stats(out, gamma)  # tokens-per-call histogram sums to the lengths, calls, ...
    summary = out.summary()
    assert out.stats["verification"] == "block" and summary["exact"]
    assert summary["tokens"] == out.lengths.sum() and 0 < summary["acceptance_rate"] < 1
    plain = st.generate(target, inputs, max_decode_len=4)
    assert plain.stats["verification"] is None


def test_block_runs_in_the_one_program_loop(greedy_setup):
    """One while loop over rounds; the program does not grow with the output length."""
    target, draft, inputs = greedy_setup

    def jaxpr(max_len):
        return str(jax.make_jaxpr(lambda t, d, x, r: _generate(
            t, d, x, r, jnp.float32(0.7), jnp.int32(1), gamma=3, max_decode_len=max_len,
            lenience=1.0, recompute_cross_attention=False, verification="block"))(
                target, draft, jnp.asarray(inputs), jax.random.split(jax.random.PRNGKey(0), 8)))

    short, long = jaxpr(11), jaxpr(41)
    assert short.count("while[") == 1 and len(short.splitlines()) == len(long.splitlines())


def test_verification_option_is_checked_and_named(greedy_setup, tmp_path):
    target, draft, inputs = greedy_setup
    with pytest.raises(ValueError, match="verification must be one of \\('token', 'block'\\)"):
        st.generate(target, inputs, draft=draft, verification="blocks")
    with pytest.raises(ValueError, match="lenience"):
        st.generate(target, inputs, draft=draft, verification="block", lenience=0.5)
    base = ["decode", "--target", str(tmp_path / "t"), "--input_file", str(tmp_path / "in"),
            "--output", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit, match="verification must be one of"):
        cli.main(base + ["--verification", "tokens"])
    with pytest.raises(SystemExit, match="lenience"):
        cli.main(base + ["--gin.decode.verification='block'", "--lenience", "0.5"])


@pytest.mark.slow
def test_decode_command_verification_and_run_header(greedy_setup, tmp_path):
    """`decode --verification block` (or the gin binding decode.verification): the header
    names it, so a rerun with token verification is another run and is refused."""
    target, draft, _ = greedy_setup
    spm = train_sentencepiece(str(tmp_path))
    for model, name in ((target, "t"), (draft, "d")):  # the vocabulary's EOS
        st.save_checkpoint(st.Model(model.config.replace(eos_id=1), model.params),
                           str(tmp_path / name))
    (tmp_path / "in.txt").write_text("the quick brown fox\na lazy dog\nseven small birds\n")
    base = ["decode", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"),
            "--vocab", spm, "--input_file", str(tmp_path / "in.txt"), "--max_decode_len", "9",
            "--batch_size", "4", "--gamma", "3"]
    out = str(tmp_path / "block.jsonl")
    assert cli.main(base + ["--output", out, "--gin.decode.verification='block'"]) == 0
    with open(out) as f:
        header, *lines = f.read().splitlines()
    assert json.loads(header)["speculative_t5"]["header"]["verification"] == "block"
    records = [json.loads(line) for line in lines]
    assert len(records) == 3
    for r in records:
        hist = r["stats"]["tokens_per_call_hist"]
        assert sum((i + 1) * c for i, c in enumerate(hist)) == r["length"]
    with pytest.raises(SystemExit, match="verification: 'block' -> 'token'"):
        cli.main(base + ["--output", out, "--verification", "token"])
