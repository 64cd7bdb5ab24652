"""Zero-cost drafts (`st.drafts`): PromptLookup and Bigram behind the draft protocol.

Exact by enumeration (test_exactness's chi-square at a fixed seed) whether the lookup
matches or not, and for a bigram table; a draft reporting a wrong q is caught by the same
test; greedy tokens identical to plain greedy, EOS inside a window included; the lookup
proposes the most recent continuation of the longest n-gram; statistics consistent."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
import test_exactness as tx
import test_generate as tg
from helpers import random_ids, tiny_config
from speculative_t5.decoding.drafts import Bigram, ModelDraft, PromptLookup, one_hot_proposal
from speculative_t5.engine import step_fn
from speculative_t5.model.api import init_cache

N = 60_000
MAX_LEN = 23


@pytest.fixture(scope="module")
def target8():
    return st.init_model(tx._cfg(), seed=0)


def _seq(emitted, width=12):
    """A loop token buffer [1, width]: the start token, then the emitted tokens."""
    row = np.zeros((1, width), np.int32)
    row[0, 1:1 + len(emitted)] = emitted
    return jnp.asarray(row), jnp.asarray([len(emitted)], jnp.int32)


def _propose(draft, input_row, emitted, gamma):
    """The lookup's proposal for one row, [] when it proposes nothing."""
    ids = jnp.asarray([input_row], jnp.int32)
    seq, m = _seq(emitted)
    d = draft.propose(draft.init(ids, 16), seq, m, jnp.ones((1,), bool), gamma,
                      st.SamplingConfig(1.0), jax.random.split(jax.random.PRNGKey(0), 1))
    xs = np.asarray(d.xs)[0]
    np.testing.assert_array_equal(np.asarray(d.qs)[0], np.eye(draft.vocab_size)[xs])  # one-hot
    assert int(d.count[0]) in (0, gamma)
    return xs[:int(d.count[0])].tolist()


def test_prompt_lookup_proposes_the_continuation():
    d = PromptLookup(max_ngram=3, min_ngram=1, vocab_size=20)
    # history: input (pads dropped) then emitted [2, 3, 4]; [2, 3, 4] occurs nowhere earlier,
    # [3, 4] at 0 and 5 (most recent: 5 -> 9, 10, ...); [4] alone more recently (-> 11)
    row = [3, 4, 5, 6, 7, 3, 4, 9, 10, 4, 11, 0, 0]
    assert _propose(d, row, [2, 3, 4], 3) == [9, 10, 4]
    # the continuation runs on into the output, then repeats with the occurrence's period
    assert _propose(d, row, [2, 3, 4], 8) == [9, 10, 4, 11, 2, 3, 4, 9]
    # the longest n-gram first: [10, 3, 4] occurs once, earlier than the [3, 4] above
    assert _propose(d, [10, 3, 4, 8, 3, 4, 9], [10, 3, 4], 2) == [8, 3]
    # the emitted tokens are searched too; the query's own position is not a match
    assert _propose(d, [5, 6], [7, 8, 7], 3) == [8, 7, 8]
    # no match: no proposal (the round is a plain target step)
    assert _propose(d, [5, 6], [7, 8], 3) == []
    # n <= m: one emitted token is a 1-gram query only
    assert _propose(PromptLookup(3, 2, vocab_size=20), [5, 7, 6], [7], 2) == []
    assert _propose(d, [5, 7, 6], [7], 2) == [6, 7]
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookup(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookup(max_ngram=0)


def _sample(target, draft, ids, seed=0, gamma=2):
    return st.generate(target, np.repeat(ids, N, 0), draft=draft, gamma=gamma,
                       max_decode_len=tx.STEPS, temperature=1.0, rng=jax.random.PRNGKey(seed))


def _pvalue(target, out, ids, monkeypatch):
    monkeypatch.setattr(tx, "INPUT", ids)           # the enumeration conditions on this input
    return tx.chi_square_pvalue(out.tokens, tx.exact_distribution(target, tx.SETTINGS["T=1"]))


REPEATING = np.array([[2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1]], np.int32)  # every token but 0
LOOKUPS = {"always matches": (PromptLookup(3, 1), REPEATING),       # from the second round on
           "never matches": (PromptLookup(3, 3), tx.INPUT)}         # m < 3 within STEPS


@pytest.mark.parametrize("case", sorted(LOOKUPS))
def test_prompt_lookup_sampling_is_exact(target8, monkeypatch, case):
    draft, ids = LOOKUPS[case]
    out = _sample(target8, draft, ids)
    summary = out.summary()
    if case == "never matches":  # every round a plain target step: nothing proposed
        assert summary["draft_calls"] == 0 and summary["tokens_per_target_call"] == 1.0
    else:
        assert summary["exact"] and 0.05 < summary["acceptance_rate"] < 0.95, summary
    pvalue, cells = _pvalue(target8, out, ids, monkeypatch)
    assert cells >= 20 and pvalue > 1e-3, (case, pvalue, cells)
    tg._check_stats(out, 2)


def _bigram8():
    rng = np.random.RandomState(0)
    return Bigram.fit([rng.randint(0, 8, size=rng.randint(3, 12)) for _ in range(200)], 8,
                      top=3, smoothing=0.5)


def test_bigram_table():
    b = _bigram8()
    q = np.asarray(b.table(jnp.arange(8)))                                     # [8, 8]
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-6)
    assert (q > 0).all() and b.successors.shape == (8, 3)
    # a table fitted on one repeated sequence: its successors, most frequent first
    c = Bigram.fit([[5, 6, 5, 7, 5, 6]], 40, top=2, smoothing=0.0)
    assert c.successors[5].tolist() == [6, 7]
    np.testing.assert_allclose(c.probs[5], [2 / 3, 1 / 3])
    assert float(c.rest[5]) < 1e-7 and float(c.probs[0, 0]) == 1.0  # 0 -> 5 (start token)
    np.testing.assert_allclose(c.table(jnp.asarray([9]))[0], 1 / 40)  # never seen: uniform
    with pytest.raises(ValueError, match="outside"):
        Bigram.fit([[5, 41]], 40)


def test_bigram_saves_loads_and_refuses_other_files(tmp_path):
    b = _bigram8()
    path = str(tmp_path / "b.npz")
    b.save(path)
    c = Bigram.load(path)
    for x, y in zip((b.successors, b.probs, b.rest), (c.successors, c.probs, c.rest)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.savez(str(tmp_path / "other.npz"), a=np.zeros(3))
    (tmp_path / "text.npz").write_text("not numpy")
    np.savez(str(tmp_path / "bad_rows.npz"), kind=np.array("speculative_t5.Bigram"),
             successors=np.asarray(b.successors), probs=2 * np.asarray(b.probs),
             rest=np.asarray(b.rest))
    for name, match in (("other.npz", r"not a Bigram table.*\['a'\]"),
                        ("text.npz", "not a Bigram table"), ("missing.npz", "not a Bigram"),
                        ("bad_rows.npz", "rows are not distributions")):
        with pytest.raises(ValueError, match=match):
            Bigram.load(str(tmp_path / name))


def test_bigram_draft_specs(tmp_path):
    from speculative_t5.checkpoints import BigramFile, draft_parts, load_draft
    from speculative_t5.decoding.drafts import Fallback
    path = str(tmp_path / "b.npz")
    _bigram8().save(path)
    assert draft_parts(f"bigram:{path}") == [BigramFile(path)]
    loaded = load_draft(f"bigram:{path}")
    assert isinstance(loaded, Bigram) and loaded.vocab_size == 8
    fb = load_draft(f"prompt_lookup:2,bigram:{path}")
    assert isinstance(fb, Fallback) and isinstance(fb.then, Bigram)
    assert fb.first.max_ngram == 2
    with pytest.raises(ValueError, match="'bigram:PATH'"):
        draft_parts("bigram")
    with pytest.raises(ValueError, match="no bigram table at /nowhere.npz"):
        draft_parts("bigram:/nowhere.npz")


def test_bigram_alpha_is_the_overlap_with_its_table(target8):
    """Teacher-forced alpha of a Bigram: at each position q is the table row of the token
    before it (the start token 0 first), rebuilt densely here from the arrays."""
    from speculative_t5.measure.alpha import measure_alpha
    b = _bigram8()
    succ, probs, rest = (np.asarray(x) for x in (b.successors, b.probs, b.rest))
    dense = np.repeat(rest[:, None], 8, 1)                                  # [V, V]
    for a in range(8):
        dense[a, succ[a]] = probs[a]
    rng = np.random.RandomState(3)
    ids = jnp.asarray(rng.randint(2, 8, size=(3, 5)), jnp.int32)
    out = rng.randint(2, 8, size=(3, 6)).astype(np.int32)
    out[1, 4:] = 0                                                          # a shorter row
    dec = np.pad(out[:, :-1], ((0, 0), (1, 0)))
    p = np.asarray(jax.nn.softmax(st.forward(target8, ids, jnp.asarray(dec)), -1))  # T = 1
    overlap = np.minimum(p, dense[dec]).sum(-1)                             # [B, T]
    want = overlap[out != 0].mean()
    alpha, _, positions = measure_alpha(target8, b, ids, out, st.SamplingConfig(1.0))
    assert alpha == pytest.approx(want, rel=1e-5) and positions == (out != 0).sum()


def test_bigram_sampling_is_exact(target8, monkeypatch):
    out = _sample(target8, _bigram8(), tx.INPUT)
    summary = out.summary()
    assert summary["exact"] and 0.05 < summary["acceptance_rate"] < 0.95, summary
    pvalue, cells = _pvalue(target8, out, tx.INPUT, monkeypatch)
    assert cells >= 20 and pvalue > 1e-3, (pvalue, cells)


@jax.tree_util.register_pytree_node_class
class WrongQ(PromptLookup):
    """Negative control: proposes as PromptLookup but reports its q one position off (q_i
    one-hot on x_{i+1}, a misalignment bug): not what x_i was drawn from."""
    def propose(self, *args):
        d = super().propose(*args)
        return d._replace(qs=jnp.roll(d.qs, -1, axis=1))


def test_exactness_test_detects_a_wrong_q(target8, monkeypatch):
    out = _sample(target8, WrongQ(3, 1), REPEATING)
    pvalue, _ = _pvalue(target8, out, REPEATING, monkeypatch)
    assert pvalue < 1e-3, pvalue


def make_greedy_case():
    """The test_generate batch (8 rows of different lengths) and an EOS that plain greedy
    emits mid-sequence, so rows stop inside draft windows: (target, inputs, plain greedy
    output, the tokens greedy writes without that EOS)."""
    target = st.init_model(tiny_config(), seed=0)
    inputs = random_ids(np.random.RandomState(0), 8, 9, 53, pad_tail=list(range(8)))
    tokens = st.generate(target, inputs, max_decode_len=MAX_LEN).tokens
    values, counts = np.unique(tokens[:, 2:MAX_LEN - 3], return_counts=True)
    eos = int(values[np.argmax(counts)])
    target = st.Model(target.config.replace(eos_id=eos), target.params)
    return target, inputs, st.generate(target, inputs, max_decode_len=MAX_LEN), tokens


@pytest.fixture(scope="module")
def greedy_case():
    return make_greedy_case()


@pytest.mark.parametrize("kind", ["prompt_lookup", "bigram"])
@pytest.mark.parametrize("gamma", [3, pytest.param(7, marks=pytest.mark.slow)])
def test_greedy_equals_plain(greedy_case, kind, gamma):
    target, inputs, plain, free_tokens = greedy_case
    draft = PromptLookup() if kind == "prompt_lookup" else Bigram.fit(free_tokens, 53, top=4)
    out = st.generate(target, inputs, draft=draft, gamma=gamma, max_decode_len=MAX_LEN)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    stopped = out.lengths < MAX_LEN
    assert stopped.sum() >= 2 and any(L % (gamma + 1) for L in out.lengths[stopped])
    assert (out.lengths > gamma + 1).sum() >= 4
    tg._check_stats(out, gamma)  # histogram sums to the lengths, calls, accepted <= reached
    assert out.summary()["acceptance_rate"] > 0.05  # drafts do get accepted
    assert (out.stats["draft_model_steps"] == 0).all()  # no model ran


def test_prompt_lookup_on_self_repeating_output(greedy_case):
    """A random tiny target's greedy output falls into loops (no EOS: it runs MAX_LEN);
    prompt lookup copies them: well over one token per target call (1.65 measured), tokens
    identical to plain."""
    target, inputs, _, plain_tokens = greedy_case
    target = st.Model(target.config.replace(eos_id=tiny_config().eos_id), target.params)
    out = st.generate(target, inputs, draft=PromptLookup(), gamma=3, max_decode_len=MAX_LEN)
    np.testing.assert_array_equal(out.tokens, plain_tokens)
    assert out.summary()["tokens_per_target_call"] > 1.4


def test_drafts_checked_against_the_target(greedy_case):
    target, inputs, _, _ = greedy_case
    with pytest.raises(ValueError, match="vocab_size 8 != target vocab_size 53"):
        st.generate(target, inputs, draft=_bigram8())
    with pytest.raises(ValueError, match="vocab_size"):
        st.generate(target, inputs, draft=PromptLookup(vocab_size=8))
    assert isinstance(st.drafts.PromptLookup(), PromptLookup)
    xs, qs = one_hot_proposal(jnp.asarray([[2, 0]]), 4)
    assert qs.shape == (1, 2, 4) and xs.dtype == jnp.int32


# --- Fallback, draft_stop, and the model draft catching up -----------------------------------

@pytest.fixture(scope="module")
def draft8():
    return st.init_model(tx._cfg(), seed=1)


def test_model_draft_catches_up_after_rounds_it_did_not_draft(greedy_case):
    """Rows whose draft cache lags y_m by many positions (rounds another draft proposed) are
    fed from their first stale position: then the model proposes exactly its own greedy
    continuation, as if it had decoded every token itself. A row left out (inactive) keeps
    only its valid prefix and is caught up later."""
    target, inputs, _, _ = greedy_case
    draft = st.init_model(tiny_config(), seed=1)
    alone = st.generate(draft, inputs, max_decode_len=MAX_LEN)
    own = alone.tokens                                                         # [8, 23]
    gamma, B = 3, inputs.shape[0]
    md = ModelDraft(step_fn(draft), lambda ids, L: init_cache(draft, ids, L), catch_up=True)
    seq = jnp.asarray(np.concatenate([np.zeros((B, 1), np.int32), own,
                                      np.zeros((B, 1), np.int32)], 1))         # [B, 25]
    greedy, keys = st.SamplingConfig(0.0), jax.random.split(jax.random.PRNGKey(0), B)
    state = md.init(jnp.asarray(inputs), MAX_LEN + gamma + 1)
    state = md.propose(state, seq, jnp.zeros((B,), jnp.int32), jnp.ones((B,), bool), gamma,
                       greedy, keys).state                                    # fed position 0
    # lags 1..17 within each row's own output (a row whose output is too short sits out)
    m = np.clip(np.minimum([1, 2, 5, 9, 13, 4, 17, 11], alone.lengths - gamma), 1, None)
    active = jnp.asarray((alone.lengths - gamma >= 1) & (np.arange(B) != 6))
    assert (np.asarray(active) & (m > gamma + 1)).sum() >= 3, (m, active)
    m = jnp.asarray(m, jnp.int32)
    d = md.propose(state, seq, m, active, gamma, greedy, keys)
    expect = np.stack([np.asarray(own)[b, int(m[b]):int(m[b]) + gamma] for b in range(B)])
    got = np.asarray(d.xs)
    np.testing.assert_array_equal(got[np.asarray(active)], expect[np.asarray(active)])
    # the first call had fed y_0 and its own drafts x_1, x_2 -- which are y_1, y_2 here, so
    # still valid: only rows with m > gamma were behind
    np.testing.assert_array_equal(np.asarray(d.wide_first), (np.asarray(m) > gamma) & np.asarray(active))
    # row 6 was left out: its state is not marked valid, so the next call catches it up
    fit = alone.lengths - gamma >= 1
    d = md.propose(d.state, seq, m, jnp.asarray(fit), gamma, greedy, keys)
    np.testing.assert_array_equal(np.asarray(d.xs)[fit], expect[fit])


def _sample_long(target, draft, ids, steps, monkeypatch, **kw):
    """T = 1 samples of `steps` tokens and the exact distribution they must follow."""
    monkeypatch.setattr(tx, "STEPS", steps)
    monkeypatch.setattr(tx, "INPUT", ids)
    out = st.generate(target, np.repeat(ids, N, 0), draft=draft, max_decode_len=steps,
                      temperature=1.0, rng=jax.random.PRNGKey(0), **kw)
    return out, tx.chi_square_pvalue(out.tokens, tx.exact_distribution(target, tx.SETTINGS["T=1"]))


def test_fallback_sampling_is_exact(target8, draft8, monkeypatch):
    """Fallback(PromptLookup, model) at T = 1 over 4 tokens with gamma 1: rounds of either
    draft, and the model catching up after lookup rounds (lag > gamma + 1)."""
    ids = np.array([[3, 5, 2, 7, 4, 6]], np.int32)
    lookup = PromptLookup(1, 1)
    alone = st.generate(target8, np.repeat(ids, 2000, 0), draft=lookup, gamma=1,
                        max_decode_len=4, temperature=1.0, rng=jax.random.PRNGKey(1))
    no_match = alone.stats["drafts_per_round_hist"][:, 0].sum() / alone.stats["target_calls"].sum()
    assert 0.2 < no_match < 0.8, no_match  # both drafts get rounds
    out, (pvalue, cells) = _sample_long(target8, st.drafts.Fallback(lookup, draft8), ids, 4,
                                        monkeypatch, gamma=1)
    summary = out.summary()
    assert summary["exact"] and 0.05 < summary["acceptance_rate"] < 0.95, summary
    assert out.stats["drafts_per_round_hist"][:, 0].sum() == 0  # someone always proposes
    assert cells >= 20 and pvalue > 1e-3, (pvalue, cells)
    tg._check_stats(out, 1, fixed_model_draft=False)


@pytest.mark.parametrize("verification", [pytest.param("token", marks=pytest.mark.slow), "block"])
def test_draft_stop_sampling_is_exact(target8, draft8, monkeypatch, verification):
    """draft_stop at T = 1, gamma 3 over 4 tokens: rows stop drafting at different points
    (the proposal-count histogram has rounds of 1, 2 and 3 drafts), still exact."""
    out, (pvalue, cells) = _sample_long(target8, draft8, tx.INPUT, 4, monkeypatch, gamma=3,
                                        draft_stop=0.3, verification=verification)
    hist = out.stats["drafts_per_round_hist"].sum(0)                           # [G+1]
    assert hist[0] == 0 and (hist[1:] > 0.05 * hist.sum()).all(), hist
    assert cells >= 20 and pvalue > 1e-3, (verification, pvalue, cells)
    tg._check_stats(out, 3, fixed_model_draft=False)


@pytest.mark.slow  # the default tier's negative control: test_exactness_test_detects_a_wrong_q
def test_exactness_test_detects_a_biased_draft_stop(target8, draft8, monkeypatch):
    """Negative control: stopping BEFORE an unsure token (dropping it: the decision to
    propose x_i then depends on x_i itself) is biased, and the test says so."""
    from speculative_t5.decoding import drafts as dr
    real = dr.ModelDraft.propose

    def drop_unsure(self, *args):
        d = real(self, *args)
        if self.stop is None:
            return d
        sure = jnp.take_along_axis(d.qs, d.xs[..., None], -1)[..., 0] >= self.stop  # [B, G]
        kept = jnp.sum(jnp.cumprod(sure, axis=1), axis=1).astype(jnp.int32)
        return d._replace(count=jnp.minimum(d.count, kept))
    monkeypatch.setattr(dr.ModelDraft, "propose", drop_unsure)
    jax.clear_caches()
    try:
        out, (pvalue, _) = _sample_long(target8, draft8, tx.INPUT, 4, monkeypatch, gamma=3,
                                        draft_stop=0.3)
    finally:
        jax.clear_caches()
    assert pvalue < 1e-3, pvalue


@pytest.fixture
def two_token_first_feeds(monkeypatch):
    """Decodes here as on an accelerator: a model draft's first call each round feeds two
    tokens whatever it needs (`ModelDraft.feed_two`, no branch on the width)."""
    from speculative_t5 import engine
    monkeypatch.setattr(engine, "on_accelerator", lambda partitioner: True)
    jax.clear_caches()  # `generate`'s programs were compiled with one-token feeds
    yield
    jax.clear_caches()


def test_two_token_first_feeds_are_exact(target8, draft8, monkeypatch, two_token_first_feeds):
    """T = 1, gamma 2 over 4 tokens: rounds after a rejection re-feed y_{m-1} beside y_m,
    and the tokens still follow the target's distribution. Every round's first draft call
    is a two-token one."""
    out, (pvalue, cells) = _sample_long(target8, draft8, tx.INPUT, 4, monkeypatch, gamma=2)
    assert cells >= 20 and pvalue > 1e-3, (pvalue, cells)
    assert 0.05 < out.summary()["acceptance_rate"] < 0.95
    np.testing.assert_array_equal(out.stats["two_token_draft_calls"], out.stats["target_calls"])


@pytest.mark.parametrize("kind", ["model", pytest.param("fallback", marks=pytest.mark.slow),
                                  pytest.param("tree", marks=pytest.mark.slow)])
def test_two_token_first_feeds_greedy_equal_plain(greedy_case, two_token_first_feeds, kind):
    """Greedy over padded rows with an EOS inside rounds equals plain greedy with two-token
    first feeds: a model draft alone (in a Fallback, catching up, and with a token tree in
    the slow tier)."""
    target, inputs, plain, _ = greedy_case
    perturbed = st.Model(target.config, jax.tree_util.tree_map(
        lambda x: x + 0.02 * jax.random.normal(jax.random.PRNGKey(1), x.shape), target.params))
    kw = {"model": dict(draft=perturbed),
          "fallback": dict(draft=st.drafts.Fallback(PromptLookup(), perturbed)),
          "tree": dict(draft=perturbed, tree=(2, 1, 1))}[kind]
    out = st.generate(target, inputs, gamma=3, max_decode_len=MAX_LEN, **kw)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    assert out.summary()["acceptance_rate"] > 0.05
    tg._check_stats(out, 3, fixed_model_draft=False)
    if kind == "model":
        np.testing.assert_array_equal(out.stats["two_token_draft_calls"], out.stats["target_calls"])


def test_one_token_first_feeds_on_cpus():
    from speculative_t5.engine import on_accelerator
    assert not on_accelerator(None) and not on_accelerator(st.Partitioner(num_partitions=1))


@pytest.mark.parametrize("gamma", [3, pytest.param(7, marks=pytest.mark.slow)])
def test_fallback_and_draft_stop_greedy_equal_plain(greedy_case, gamma):
    target, inputs, plain, _ = greedy_case
    draft = st.Model(target.config, st.init_model(tiny_config(), seed=3).params)
    perturbed = st.Model(target.config, jax.tree_util.tree_map(
        lambda x: x + 0.02 * jax.random.normal(jax.random.PRNGKey(1), x.shape), target.params))
    runs = {"fallback": dict(draft=st.drafts.Fallback(PromptLookup(), draft)),
            "fallback block": dict(draft=st.drafts.Fallback(PromptLookup(), perturbed),
                                   verification="block"),
            "draft_stop": dict(draft=perturbed, draft_stop=0.1),
            "fallback draft_stop": dict(draft=st.drafts.Fallback(PromptLookup(2, 2), perturbed),
                                        draft_stop=0.1)}
    for name, kw in runs.items():
        if gamma == 3 and name in ("fallback", "draft_stop"):  # each is in a combined run
            continue                                           # too: alone in the slow tier
        out = st.generate(target, inputs, gamma=gamma, max_decode_len=MAX_LEN, **kw)
        np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=name)
        np.testing.assert_array_equal(out.lengths, plain.lengths, err_msg=name)
        tg._check_stats(out, gamma, fixed_model_draft=False)
        assert out.summary()["acceptance_rate"] > 0.05, name
        steps, calls = np.asarray(out.stats["draft_model_steps"]), out.stats["target_calls"]
        if "draft_stop" not in name:  # gamma model steps a round the model drafted, none
            assert (steps % gamma == 0).all() and 0 < steps.sum() < gamma * calls.sum(), name
        if name == "draft_stop":  # the model alone: it ran every round
            assert (steps <= gamma * calls).all() and (steps >= calls).all()
        if "draft_stop" in name:  # rounds stopped early, and rounds that drafted all gamma
            hist = out.stats["drafts_per_round_hist"].sum(0)
            assert hist[1:gamma].sum() > 0 and hist[gamma] > 0, (name, hist)


def test_fallback_and_draft_stop_checked(greedy_case):
    target, inputs, _, _ = greedy_case
    draft = st.Model(target.config, st.init_model(tiny_config(), seed=3).params)
    with pytest.raises(ValueError, match="vocab_size 8 != target vocab_size 53"):
        st.generate(target, inputs, draft=st.drafts.Fallback(PromptLookup(), _bigram8()))
    with pytest.raises(ValueError, match="draft_stop needs a draft model"):
        st.generate(target, inputs, draft=PromptLookup(), draft_stop=0.5)
    for bad in (0.0, 1.0, True, "0.5"):
        with pytest.raises(ValueError, match="draft_stop must be a probability"):
            st.generate(target, inputs, draft=draft, draft_stop=bad)
    small = st.init_model(tiny_config(vocab_size=40), seed=3)
    with pytest.raises(ValueError, match="vocab_size 40 != target vocab_size 53"):
        st.generate(target, inputs, draft=st.drafts.Fallback(PromptLookup(), small))
