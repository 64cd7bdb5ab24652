"""st.generate: greedy speculative output equals plain greedy output token for token,
statistics are consistent, one compiled while-loop, clear errors for bad arguments."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
from helpers import random_ids, tiny_config
from speculative_t5.engine import _generate, cache_positions

MAX_LEN = 23  # not a multiple of gamma + 1 for any gamma tested


@pytest.fixture(scope="module")
def target():
    return st.init_model(tiny_config(), seed=0)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.RandomState(0)
    return random_ids(rng, 8, 9, 53, pad_tail=[0, 1, 2, 3, 4, 5, 6, 7])  # 8 different lengths


def _perturbed(model, scale, seed):
    leaves, tree = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return st.Model(model.config, jax.tree_util.tree_unflatten(tree, noisy))


@pytest.fixture(scope="module")
def drafts(target):
    return {"same": target,
            "random": st.init_model(tiny_config(num_encoder_layers=1, num_decoder_layers=1), seed=5),
            "perturbed": _perturbed(target, 0.05, seed=3)}


@pytest.fixture(scope="module")
def plain(target, inputs):
    return st.generate(target, inputs, max_decode_len=MAX_LEN)


def _check_stats(out, gamma, fixed_model_draft=True):
    s = out.stats
    hist = s["tokens_per_call_hist"]                                           # [B, G+1]
    np.testing.assert_array_equal((hist * np.arange(1, gamma + 2)).sum(1), out.lengths)
    np.testing.assert_array_equal(hist.sum(1), s["target_calls"])
    assert (s["target_calls"] <= out.lengths).all()
    drafts = s["drafts_per_round_hist"]                                        # [B, G+1]
    np.testing.assert_array_equal(drafts.sum(1), s["target_calls"])
    np.testing.assert_array_equal(s["draft_calls"], (drafts * np.arange(gamma + 1)).sum(1))
    assert (s["accepted_at"] <= s["reached_at"]).all()
    # position i is reached only in rounds that proposed more than i drafts
    proposed_beyond = drafts[:, ::-1].cumsum(1)[:, ::-1][:, 1:]                # [B, G]
    np.testing.assert_array_equal(s["reached_at"][:, 0], proposed_beyond[:, 0])
    assert (s["reached_at"] <= proposed_beyond).all()
    # a model draft alone drafting all gamma: a two-token draft call follows a round that
    # emitted gamma+1 tokens, never the first
    assert not fixed_model_draft or (s["two_token_draft_calls"] <= np.minimum(hist[:, gamma], s["target_calls"] - 1)).all()


@pytest.mark.parametrize("kind", ["same", "random", "perturbed"])
@pytest.mark.parametrize("gamma", [pytest.param(1, marks=pytest.mark.slow), 3,
                                   pytest.param(7, marks=pytest.mark.slow)])
def test_greedy_speculative_equals_plain(target, drafts, inputs, plain, kind, gamma):
    out = st.generate(target, inputs, draft=drafts[kind], gamma=gamma, max_decode_len=MAX_LEN)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    # a model draft alone runs gamma steps a round (what the cost model charges it)
    np.testing.assert_array_equal(out.stats["draft_model_steps"], gamma * out.stats["target_calls"])
    if kind == "same":  # every round sweeps: each round after the first feeds two tokens
        np.testing.assert_array_equal(out.stats["two_token_draft_calls"],
                                      out.stats["target_calls"] - 1)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    _check_stats(out, gamma)
    rate = out.summary()["acceptance_rate"]
    if kind == "same":  # every draft accepted: gamma+1 tokens per call but the last
        assert rate == 1.0
        np.testing.assert_array_equal(out.stats["target_calls"],
                                      np.ceil(out.lengths / (gamma + 1)).astype(int))
    elif kind == "random":
        assert rate < 0.3
    else:
        first = out.summary()["acceptance_rate_by_position"][0]
        assert 0.3 < first < 0.97 and rate > 0.1, (first, rate)  # really mixed acceptance


@pytest.mark.parametrize("gamma", [3, pytest.param(7, marks=pytest.mark.slow)])
def test_eos_inside_draft_window(target, inputs, plain, gamma):
    """Make a token that greedy decoding emits mid-sequence the EOS: rows stop there, even
    when the EOS is an accepted draft in the middle of a round, and are 0-padded after."""
    tokens = plain.tokens[:, 2:MAX_LEN - 3]
    values, counts = np.unique(tokens, return_counts=True)
    eos = int(values[np.argmax(counts)])
    cfg = target.config.replace(eos_id=eos)
    t = st.Model(cfg, target.params)
    ref = st.generate(t, inputs, max_decode_len=MAX_LEN)
    out = st.generate(t, inputs, draft=t, gamma=gamma, max_decode_len=MAX_LEN)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    stopped = out.lengths < MAX_LEN
    assert stopped.sum() >= 2
    for row in np.nonzero(stopped)[0]:
        L = out.lengths[row]
        assert out.tokens[row, L - 1] == eos and eos not in out.tokens[row, :L - 1]
        assert (out.tokens[row, L:] == 0).all()
    # some row stopped strictly inside a round (not at a round boundary)
    assert any(L % (gamma + 1) for L in out.lengths[stopped])
    _check_stats(out, gamma)


@pytest.mark.slow
def test_rounds_past_the_caches_end_change_no_token(target, drafts, inputs):
    """A speculative decode's caches end at max_decode_len (`cache_positions`: here exactly
    16 and 32 positions), so a round near the end feeds up to gamma tokens past them, whose
    writes are dropped (gamma 7 at 16, 3 at 32). Greedy: plain greedy's tokens, for every
    draft kind, block verification and adaptive gamma. T = 1, token-wise: each row's tokens
    are those of a decode one token longer (caches of 32 positions: nothing dropped) from
    the same row keys, cut at max_decode_len."""
    lookup = st.drafts.PromptLookup(2)
    runs = {"model": dict(draft=drafts["perturbed"]),
            "block": dict(draft=drafts["perturbed"], verification="block"),
            "fallback, adaptive": dict(draft=st.drafts.Fallback(lookup, drafts["random"]),
                                       adaptive_gamma=(0.1, 1.5)),
            "same": dict(draft=drafts["same"])}
    for max_len, gamma in ((16, 7), (32, 3)):  # one program per pair: compiling is the cost
        assert cache_positions(max_len) == max_len
        plain = st.generate(target, inputs, max_decode_len=max_len)
        assert (plain.lengths == max_len).sum() >= 4                # rows that run to the end
        for name, kw in runs.items():
            out = st.generate(target, inputs, gamma=gamma, max_decode_len=max_len, **kw)
            np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=name)
            np.testing.assert_array_equal(out.lengths, plain.lengths, err_msg=name)
    keys = jax.random.split(jax.random.PRNGKey(1), inputs.shape[0])
    for name in ("model", "fallback, adaptive"):
        kw = dict(runs[name], gamma=7, temperature=1.0, rng=keys)
        short = st.generate(target, inputs, max_decode_len=16, **kw)
        longer = st.generate(target, inputs, max_decode_len=17, **kw)
        np.testing.assert_array_equal(short.tokens, longer.tokens[:, :16], err_msg=name)
        np.testing.assert_array_equal(short.lengths, np.minimum(longer.lengths, 16))
        assert (short.lengths == 16).sum() >= 4 and (short.tokens != plain.tokens[:, :16]).any()


def test_plain_stats_and_t5x_faithful_baseline(target, inputs, plain):
    np.testing.assert_array_equal(plain.stats["target_calls"], plain.lengths)
    assert plain.summary()["tokens_per_target_call"] == 1.0
    t5x = st.generate(target, inputs, max_decode_len=MAX_LEN, recompute_cross_attention=True)
    np.testing.assert_array_equal(t5x.tokens, plain.tokens)


def test_compiled_once_and_one_while_loop(target, drafts, inputs):
    kw = dict(draft=drafts["perturbed"], gamma=3, max_decode_len=11, temperature=0.7)
    st.generate(target, inputs, rng=jax.random.PRNGKey(1), **kw)
    before = _generate._cache_size()
    for seed in (2, 3):
        st.generate(target, inputs[::-1].copy(), rng=jax.random.PRNGKey(seed), **kw)
    # the sampling settings are traced: greedy, any other temperature, top-k and top-p
    # share the program
    for setting in (dict(temperature=0.0), dict(temperature=1.3), dict(top_k=3),
                    dict(top_p=0.8), dict(top_k=5, top_p=0.9)):
        st.generate(target, inputs, **dict(kw, **setting))
    assert _generate._cache_size() == before

    def jaxpr(max_len):
        return str(jax.make_jaxpr(lambda t, d, x, r: _generate(
            t, d, x, r, jnp.float32(0.7), jnp.int32(1), gamma=3, max_decode_len=max_len,
            lenience=1.0, recompute_cross_attention=False))(
                target, drafts["perturbed"], jnp.asarray(inputs),
                jax.random.split(jax.random.PRNGKey(0), len(inputs))))

    short, long = jaxpr(11), jaxpr(41)
    assert short.count("while[") == 1          # the rounds loop ...
    assert short.count("scan[") + short.count("while[") >= 2  # ... and the draft loop in it
    # no Python loop over rounds or tokens: the program does not grow with the length
    assert len(short.splitlines()) == len(long.splitlines())


def test_sampling_config_beside_the_loose_floats(target, drafts, inputs):
    kw = dict(draft=drafts["perturbed"], gamma=3, max_decode_len=11, rng=jax.random.PRNGKey(4))
    loose = st.generate(target, inputs, temperature=0.8, top_k=5, top_p=0.9, **kw)
    config = st.generate(target, inputs, sampling=st.SamplingConfig(0.8, 5, 0.9), **kw)
    np.testing.assert_array_equal(loose.tokens, config.tokens)
    with pytest.raises(ValueError, match="either sampling"):
        st.generate(target, inputs, sampling=st.SamplingConfig(0.8), temperature=0.8)
    with pytest.raises(ValueError, match="top_p"):
        st.generate(target, inputs, sampling=st.SamplingConfig(1.0, 0, 0.0))
    with pytest.raises(TypeError, match="SamplingConfig"):
        st.generate(target, inputs, sampling={"temperature": 1.0})


def test_bad_arguments_are_named(target, drafts, inputs):
    cases = [(dict(draft=target, gamma=0), "gamma"), (dict(temperature=-0.1), "temperature"),
             (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"),
             (dict(max_decode_len=0), "max_decode_len"), (dict(draft=target, lenience=0), "lenience"),
             (dict(max_input_len=4), "max_input_len")]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            st.generate(target, inputs, **kwargs)
    other_vocab = st.init_model(tiny_config(vocab_size=61), seed=1)
    with pytest.raises(ValueError, match="vocab_size"):
        st.generate(target, inputs, draft=other_vocab)
    with pytest.raises(ValueError, match="input_ids"):
        st.generate(target, inputs[0])
    with pytest.raises(ValueError, match="outside"):
        st.generate(target, inputs + 100)
    with pytest.raises(TypeError, match="draft"):
        st.generate(target, inputs, draft="t5_small")


@pytest.mark.parametrize("speculative", [False, True])
def test_per_row_keys_make_a_row_independent_of_its_batch(target, drafts, inputs, speculative):
    """With one key per row (what `decode` passes: a key per input index), a row samples
    the same tokens at T > 0 whatever batch it is decoded in: in another order, beside other
    rows of other lengths, or beside copies of itself; rows with different keys sample
    differently. (One batch size throughout: every decode here runs one program.)"""
    kw = dict(draft=drafts["perturbed"], gamma=3) if speculative else {}
    keys = jax.random.split(jax.random.PRNGKey(7), 8)
    full = st.generate(target, inputs, max_decode_len=MAX_LEN, temperature=1.0, rng=keys, **kw)
    order = np.array([5, 2, 7, 0, 6, 1, 4, 3])
    shuffled = st.generate(target, inputs[order], max_decode_len=MAX_LEN, temperature=1.0,
                           rng=keys[order], **kw)
    np.testing.assert_array_equal(shuffled.tokens, full.tokens[order])
    # row 3 eight times: with its own key it samples its tokens in `full`, with others not
    copies = st.generate(target, inputs[[3] * 8], max_decode_len=MAX_LEN, temperature=1.0,
                         rng=keys[np.array([3, 4, 3, 5, 6, 7, 0, 1])], **kw)
    np.testing.assert_array_equal(copies.tokens[[0, 2]], full.tokens[[3, 3]])
    assert not np.array_equal(copies.tokens[1], full.tokens[3])
    assert len({tuple(row) for row in copies.tokens[[0, 1, 3, 4, 5]]}) > 1
    with pytest.raises(ValueError, match="one per row"):
        st.generate(target, inputs, max_decode_len=MAX_LEN, temperature=1.0, rng=keys[:3], **kw)


def test_ignore_eos_runs_every_row_to_the_end(target, drafts, inputs, plain):
    """ignore_eos (timing a known amount of work): no row stops at EOS, each row's tokens
    begin with its usual decode's, speculative greedy still equals plain greedy, and the
    program is the one the usual decode compiled (the EOS id is traced)."""
    kw = dict(draft=drafts["perturbed"], gamma=3, max_decode_len=MAX_LEN)
    st.generate(target, inputs, **kw)
    before = _generate._cache_size()
    speculative = st.generate(target, inputs, ignore_eos=True, **kw)
    assert _generate._cache_size() == before
    full = st.generate(target, inputs, max_decode_len=MAX_LEN, ignore_eos=True)
    assert plain.lengths.min() < MAX_LEN and (plain.tokens == 1).any()  # some row ends at EOS
    assert (full.lengths == MAX_LEN).all() and (speculative.lengths == MAX_LEN).all()
    np.testing.assert_array_equal(speculative.tokens, full.tokens)
    for row, n in enumerate(plain.lengths):
        np.testing.assert_array_equal(full.tokens[row, :n], plain.tokens[row, :n])
    with pytest.raises(TypeError, match="ignore_eos"):
        st.generate(target, inputs, ignore_eos="yes")
