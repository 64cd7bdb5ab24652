"""Adaptive gamma (`adaptive_gamma=`): each round drafts the count eq. (5) prefers for the
running acceptance rate of the batch's slowest active row, 0 meaning a plain target step
(the first round as if every draft were accepted).

Exact by enumeration at T = 1 (token-wise and block, rounds of 0, 1 and gamma drafts in one
decode); greedy identical to plain with a model draft and with a fallback whose model
catches up after plain rounds; with free speculation it is the fixed-gamma decode, key for
key; with prohibitive costs it is a plain decode; eq. (5)'s choice checked by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
import test_drafts as td
import test_exactness as tx
import test_generate as tg
from speculative_t5.decoding import loops
from speculative_t5.decoding.loops import adaptive_widths, choose_gamma, round_costs, running_alpha

# c, v that give, on the V=8 pair at this seed, plain rounds and drafting rounds in one
# decode (token-wise: 0, 1 and 3 drafts; block: 0 and 2)
MIXED = {"token": (0.3, 1.2), "block": (0.35, 1.2)}


def test_choose_gamma_follows_eq_5():
    def pick(alpha, c, v, gamma=4):
        return int(choose_gamma(jnp.float32(alpha), jnp.asarray([c, v, v, c], jnp.float32), gamma))
    # eq. (5) by hand: alpha 0.8, c 0.05, v 1: g=4 gives (1-.8^5)/(.2 (.2+1)) = 2.79, the best
    assert pick(0.8, 0.05, 1.0) == 4
    # alpha 0.6, c 0.3, v 1.2: g=1 1.6/1.5=1.067, g=2 1.96/1.8=1.089, g=3 2.18/2.1=1.036
    assert pick(0.6, 0.3, 1.2) == 2
    assert pick(0.3, 0.1, 2.0) == 0          # speculation cannot pay for a 2x verify pass
    assert pick(0.99, 0.0, 1.0, gamma=7) == 7
    # narrower rounds verify fewer tokens: width w costs v1 + (v - v1)(w - 1)/(gamma - 1),
    # v1 by default on the line from a plain step, 1 + (v - 1)/gamma. alpha 0.7, c 0.05,
    # v 3 (v1 1.25), gamma 8, widths 1, 2, 4, 8: g=1 1.7 / 1.3 = 1.31, g=2 2.19 / 1.6 =
    # 1.37, g=3 (width 4) 2.53 / 2.15 = 1.18, g=4 2.77 / 2.2 = 1.26; width 8 alone: g=8
    # 3.2 / 3.4 = 0.94 < 1, a plain step
    assert adaptive_widths(8) == (1, 2, 4, 8) and adaptive_widths(7) == (1, 3, 7)
    assert adaptive_widths(1) == (1,)
    line = st.GammaCosts(0.05, 3.0).resolved(8)
    assert line.v1 == pytest.approx(1.25) and st.GammaCosts(0.05, 3.0).resolved(1).v1 == 3.0
    costs = jnp.asarray(line, jnp.float32)
    assert int(choose_gamma(jnp.float32(0.7), costs, 8, widths=adaptive_widths(8))) == 2
    assert int(choose_gamma(jnp.float32(0.7), costs, 8)) == 0
    # a measured v1 of 1.6 (narrow rounds dearer, as at batch 64): g=1 1.7 / 1.65 = 1.03,
    # g=2 (verify 1.6 + 1.4 / 7 = 1.8) 2.19 / 1.9 = 1.153, g=4 (2.2) 2.773 / 2.4 = 1.155
    costs = jnp.asarray(st.GammaCosts(0.05, 3.0, 1.6).resolved(8), jnp.float32)
    assert int(choose_gamma(jnp.float32(0.7), costs, 8, widths=adaptive_widths(8))) == 4
    # after idle plain rounds the draft model is up to idle + 2 behind and first catches up
    # in ceil((idle + 2) / 9) feeds of 9 tokens, w = 0.2 each, in place of one step (c):
    # idle 1: + 0.15, g=4 2.773 / 2.55 = 1.087, g=2 2.19 / 2.05 = 1.068 -> still 4;
    # idle 44: 6 feeds, + 1.15, g=4 2.773 / 3.55 = 0.78, g=1 1.7 / 2.8 -> a plain step
    costs = jnp.asarray(st.GammaCosts(0.05, 3.0, 1.6, 0.2).resolved(8), jnp.float32)
    for idle, want in ((0, 4), (1, 4), (44, 0)):
        assert int(choose_gamma(jnp.float32(0.7), costs, 8, widths=adaptive_widths(8),
                                idle=jnp.int32(idle))) == want, idle
    # round_costs, per row: [0, 44] idle rounds -> [2, 9]; g=2 0.1 + 1.8 = 1.9, g=3 (width 4)
    # 0.15 + 1.6 + 1.4 x 3 / 7 = 2.35, g=8 0.4 + 3 = 3.4; idle 44 adds 1.15 to each drafting g
    priced = np.asarray(round_costs(costs, 8, adaptive_widths(8), jnp.asarray([0, 44])))
    want = np.asarray([1.0, 0.05 + 1.6, 1.9, 2.35, 2.4, 0.25 + 3.0, 0.3 + 3.0, 0.35 + 3.0, 3.4])
    np.testing.assert_allclose(priced, [want, np.where(np.arange(9) > 0, want + 1.15, 1.0)],
                               rtol=1e-5)
    assert st.GammaCosts(0.05, 3.0).resolved(8).w == 0.05      # unmeasured: as dear as c
    # a round gives at most the tokens left: alpha 0.9, c 0.05, v 1, 3 left: g=2 2.71 / 1.1
    # = 2.46, g=3 (1 x .1 + 2 x .09 + 3 x .81 = 2.71) / 1.15 = 2.36 -> 2 (uncapped: 8);
    # 1 left: every round gives 1 token, so a plain step
    costs = jnp.asarray([0.05, 1.0, 1.0, 0.05], jnp.float32)
    assert int(choose_gamma(jnp.float32(0.9), costs, 8)) == 8
    assert int(choose_gamma(jnp.float32(0.9), costs, 8, remaining=jnp.int32(3))) == 2
    assert int(choose_gamma(jnp.float32(0.9), costs, 8, remaining=jnp.int32(1))) == 0
    # rows' own rates shrunk toward the pooled one (prior 3/4 worth 16 drafts) by k drafts,
    # k = p(1 - p) / tau^2 (at least 4), tau^2 the between-row variance beyond chance; the
    # least over the active rows. Rows that differ by chance: accepted/reached 3/4 and 2/4
    # pool to p = (5 + 12) / (8 + 16) = 17/24; spread 4 (3/4 - p)^2 + 4 (2/4 - p)^2 = 0.181
    # is below chance, (2 - 1) p (1 - p) = 0.207, so tau^2 = 0 and every row is p (a row
    # with nothing reached yet too); 4 pseudo-drafts would give (2 + 4p) / 8 = 0.604
    stats = {"accepted_at": jnp.asarray([[3, 0], [1, 1], [0, 0]]),
             "reached_at": jnp.asarray([[3, 1], [2, 2], [0, 0]])}
    on = jnp.asarray([True, True, True])
    assert float(running_alpha(stats, on)) == pytest.approx(17 / 24, rel=1e-4)
    # rows that truly differ: 10/10 and 0/10 pool to p = 22/36; spread 10 (1 - p)^2 + 10 p^2
    # = 1700/324, chance 77/324, dof 20 - 200/20 = 10: tau^2 = 1623/3240, k = (77/324) /
    # tau^2 = 0.47 -> 4; the slower row (0 + 4p) / 14. One active row is its pooled rate.
    stats = {"accepted_at": jnp.asarray([[6, 4], [0, 0]]),
             "reached_at": jnp.asarray([[6, 4], [8, 2]])}
    p = 22 / 36
    assert float(running_alpha(stats, on[:2])) == pytest.approx(4 * p / 14)
    assert float(running_alpha(stats, jnp.asarray([True, False]))) == pytest.approx(22 / 26,
                                                                                   rel=1e-4)


def _loop_time(alpha, c, v, g, rows, need, reps=1000):
    """Monte Carlo, independent of choose_gamma: the mean target time (plain steps) until
    every one of `rows` rows has `need` tokens, a round (cost g c + v, v its verify pass; a
    plain step costs 1) giving each row 1 + min(its accepted drafts ~ Geometric, g)."""
    if g == 0:
        return float(need)
    rng = np.random.default_rng(0)
    accepted = np.minimum(rng.geometric(1.0 - alpha, size=(reps, rows, need)) - 1, g)  # [N, K, R]
    rounds = np.argmax(np.cumsum(accepted + 1, axis=2) >= need, axis=2) + 1     # [N, K]
    return float(rounds.max(1).mean() * (g * c + v))


@pytest.mark.parametrize("rows,c,v", [(1, 0.25, 1.3), (8, 0.15, 1.6), (32, 0.1, 2.2),
                                      (64, 0.08, 2.9)])
def test_choose_gamma_finishes_a_batch_soonest(rows, c, v):
    """A batch runs until its slowest row is done: against a simulation of that, the choice
    for `rows` active rows that need `need` more tokens costs within 3% of the best gamma's
    time, where eq. (5) for one row (the rule before) lost 1.27x at batch 8, 1.9x at 64."""
    gamma, worst_one_row = 8, 1.0
    for alpha in (0.6, 0.77, 0.9):
        for need in (64, 16):
            times = [_loop_time(alpha, c, v, g, rows, need) for g in range(gamma + 1)]
            costs = jnp.asarray([c, v, v, c], jnp.float32)
            batch = int(choose_gamma(jnp.float32(alpha), costs, gamma, rows, need))
            one_row = int(choose_gamma(jnp.float32(alpha), costs, gamma))
            assert times[batch] <= 1.03 * min(times), (alpha, need, batch, times)
            worst_one_row = max(worst_one_row, times[one_row] / min(times))
    assert worst_one_row > 1.25 if rows > 1 else worst_one_row < 1.03   # one row: eq. (5)


@pytest.mark.parametrize("rows,c,v,v1", [(8, 0.07, 3.2, 1.45), (64, 0.05, 2.8, 1.57)])
def test_choose_gamma_with_widths_finishes_a_batch_soonest(rows, c, v, v1):
    """Rounds verified at their own width (every width 1..gamma, costs as measured at batch
    8 and 64 here): the choice costs within 3% of the best gamma's simulated time."""
    gamma = 8
    for alpha in (0.6, 0.77, 0.9):
        for need in (64, 16):
            times = [_loop_time(alpha, c, v1 + (v - v1) * (g - 1) / (gamma - 1), g, rows, need)
                     for g in range(gamma + 1)]
            costs = jnp.asarray([c, v, v1, c], jnp.float32)
            g = int(choose_gamma(jnp.float32(alpha), costs, gamma, rows, need,
                                 tuple(range(1, gamma + 1))))
            assert times[g] <= 1.03 * min(times), (alpha, need, g, times)


@pytest.mark.parametrize("verification", [pytest.param("token", marks=pytest.mark.slow), "block"])
def test_adaptive_gamma_sampling_is_exact(monkeypatch, verification):
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    out, (pvalue, cells) = td._sample_long(target, draft, tx.INPUT, 4, monkeypatch, gamma=3,
                                           adaptive_gamma=MIXED[verification],
                                           verification=verification)
    hist = out.stats["drafts_per_round_hist"].sum(0)                           # [G+1]
    assert hist[0] > 0.05 * hist.sum() and hist[1:].sum() > 0.05 * hist.sum(), hist
    assert cells >= 20 and pvalue > 1e-3, (verification, pvalue, cells)
    tg._check_stats(out, 3, fixed_model_draft=False)
    c, v = MIXED[verification]
    assert out.stats["adaptive_costs"] == pytest.approx(dict(c=c, v=v, v1=1 + (v - 1) / 3, w=c))


@pytest.fixture
def scripted(monkeypatch):
    """Adaptive rounds on a fixed script instead of eq. (5): the round's count from the
    longest remaining budget (past-only, so still exact), (7 left) mod (gamma + 1) -- over a
    4-token decode at gamma 3, plain, then 1, 2 and 3 drafts (widths 1, 3, 3): every width
    and every switch between them, in rows whose budgets differ. At 60k rows eq. (5) for a
    batch (rightly) never drafts after the first round, so the widths need the script."""
    def script(alpha, costs, gamma, rows=1, remaining=None, widths=(), idle=0):
        return (jnp.asarray(remaining, jnp.int32) * 7) % (gamma + 1)
    jax.clear_caches()  # programs traced with the real rule must not be reused
    monkeypatch.setattr(loops, "choose_gamma", script)
    yield
    jax.clear_caches()


@pytest.mark.parametrize("verification", ["token", pytest.param("block", marks=pytest.mark.slow)])
def test_rounds_of_every_width_are_exact(scripted, monkeypatch, verification):
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    out, (pvalue, cells) = td._sample_long(target, draft, tx.INPUT, 4, monkeypatch, gamma=3,
                                           adaptive_gamma=(0.1, 1.2), verification=verification)
    hist = out.stats["drafts_per_round_hist"].sum(0)                           # [G+1]
    assert (hist > 0.02 * hist.sum()).all(), hist      # plain rounds and 1, 2, 3 drafts
    assert cells >= 20 and pvalue > 1e-3, (verification, pvalue, cells)
    tg._check_stats(out, 3, fixed_model_draft=False)


@pytest.mark.slow
def test_rounds_of_every_width_greedy_equal_plain(scripted, td_greedy_case):
    """Greedy through the script at gamma 7 (widths 1, 3, 7) with a fallback whose model
    draft catches up after plain and lookup rounds at each width."""
    target, inputs, plain, _ = td_greedy_case
    draft = st.Model(target.config, jax.tree_util.tree_map(
        lambda x: x + 0.02 * jax.random.normal(jax.random.PRNGKey(1), x.shape), target.params))
    for name, d in {"model": draft, "fallback": st.drafts.Fallback(st.drafts.PromptLookup(2, 2), draft)}.items():
        out = st.generate(target, inputs, draft=d, gamma=7, max_decode_len=td.MAX_LEN,
                          adaptive_gamma=(0.1, 1.2))
        np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=name)
        tg._check_stats(out, 7, fixed_model_draft=False)
        hist = out.stats["drafts_per_round_hist"].sum(0)
        assert hist[0] > 0 and hist[1] > 0 and hist[2:4].sum() > 0 and hist[4:].sum() > 0, hist


@pytest.mark.slow
def test_the_rule_sees_the_plain_rounds_since_the_last_drafting_round(monkeypatch):
    """`idle` (what a draft model must catch up, priced by choose_gamma) is 0 after a
    drafting round and one more after each plain round: checked round by round on a script
    that drafts 2 in the middle of the budget and makes plain steps before and after."""
    seen = []

    def script(alpha, costs, gamma, rows=1, remaining=None, widths=(), idle=0):
        left = jnp.asarray(remaining, jnp.int32)
        g = jnp.where((left > 12) | (left < 8), 0, 2).astype(jnp.int32)
        jax.debug.callback(lambda g, i: seen.append((int(g), int(i))), g, idle, ordered=True)
        return g
    jax.clear_caches()
    monkeypatch.setattr(loops, "choose_gamma", script)
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    out = st.generate(target, np.repeat(tx.INPUT, 2, 0), draft=draft, gamma=3,
                      max_decode_len=16, adaptive_gamma=(0.1, 1.2), temperature=1.0)
    jax.clear_caches()
    assert seen[0] == (0, 0)
    for (g0, i0), (g1, i1) in zip(seen, seen[1:]):
        assert i1 == (i0 + 1 if g0 == 0 else 0), seen
    idles = [i for _, i in seen]
    assert max(idles) >= 3 and 0 in idles[1:], (seen, out.lengths)


@pytest.mark.slow
def test_free_speculation_is_the_fixed_gamma_decode():
    """c = 0, v = 1: every round drafts gamma, consuming the same keys as the fixed-gamma
    loop, so a T = 1 decode is identical token for token and count for count."""
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    ids = np.repeat(tx.INPUT, 64, 0)
    kw = dict(draft=draft, gamma=3, max_decode_len=12, temperature=1.0, rng=jax.random.PRNGKey(3))
    fixed, adaptive = st.generate(target, ids, **kw), st.generate(target, ids, adaptive_gamma=(0.0, 1.0), **kw)
    np.testing.assert_array_equal(adaptive.tokens, fixed.tokens)
    for k in ("target_calls", "draft_calls", "tokens_per_call_hist", "accepted_at"):
        np.testing.assert_array_equal(adaptive.stats[k], fixed.stats[k])


@pytest.mark.parametrize("gamma", [3, pytest.param(7, marks=pytest.mark.slow)])
def test_adaptive_greedy_equals_plain(td_greedy_case, gamma):
    target, inputs, plain, _ = td_greedy_case
    draft = st.Model(target.config, jax.tree_util.tree_map(
        lambda x: x + 0.02 * jax.random.normal(jax.random.PRNGKey(1), x.shape), target.params))
    runs = {"mixed": dict(draft=draft, adaptive_gamma=(0.2, 1.4)),
            "prohibitive": dict(draft=draft, adaptive_gamma=(0.0, 100.0)),
            "fallback, draft_stop, block": dict(
                draft=st.drafts.Fallback(st.drafts.PromptLookup(2, 2), draft), draft_stop=0.1,
                adaptive_gamma=(0.2, 1.4), verification="block")}
    for name, kw in runs.items():
        out = st.generate(target, inputs, gamma=gamma, max_decode_len=td.MAX_LEN, **kw)
        np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=name)
        np.testing.assert_array_equal(out.lengths, plain.lengths, err_msg=name)
        tg._check_stats(out, gamma, fixed_model_draft=False)
        hist = out.stats["drafts_per_round_hist"].sum(0)
        if name == "prohibitive":  # every round a plain step: no draft ever runs
            assert hist[0] == hist.sum() and out.stats["draft_calls"].sum() == 0
        else:                      # plain rounds and drafting rounds
            assert hist[0] > 0 and hist[1:].sum() > 0, (name, hist)


@pytest.mark.slow
def test_measured_costs_price_rounds_by_the_slope(monkeypatch):
    """gamma_costs prices a round by the seconds added over the rounds added between decodes
    to max_decode_len // 4 and max_decode_len, so a decode's set-up is not charged to its
    rounds; below 16 tokens, by one decode's total over its rounds. The clock here is
    synthetic: 10 ms of set-up plus a known price per round (target calls as the decode
    counted them), 0.2 / 0.4 ms for the draft's one- and 4-token steps."""
    from speculative_t5 import engine as gen
    price = {"plain": 1e-3, "gamma 1": 1.5e-3, "gamma 3": 2.4e-3}  # seconds a round
    calls, last, generate = {}, [], gen.generate

    def clock(fns, rounds):  # each decode once; its time from the rounds it ran
        out = {}
        for (name, length), fn in fns.items():
            fn()
            calls[name, length] = int(last[-1].stats["target_calls"].max())
            out[name, length] = 0.01 + calls[name, length] * price[name]
        return out
    monkeypatch.setattr(gen, "generate", lambda *a, **k: last.append(generate(*a, **k)) or last[-1])
    monkeypatch.setattr(gen, "interleaved_medians", clock)
    monkeypatch.setattr(gen, "step_times", lambda fns, *a, **k: {
        k: 2e-4 if k.startswith("draft") else 4e-4 for k in fns})
    target, draft = st.init_model(tx._cfg(), seed=2), st.init_model(tx._cfg(), seed=3)
    ids = np.repeat(tx.INPUT, 2, 0)
    costs = st.gamma_costs(target, draft, ids, gamma=3, max_decode_len=32)
    assert {n for _, n in calls} == {8, 32} and all(calls[k, 32] > calls[k, 8] for k in price)
    np.testing.assert_allclose(costs, [0.2, 2.4 - 3 * 0.2, 1.5 - 0.2, 0.4], rtol=1e-6)
    calls.clear()
    costs = st.gamma_costs(target, draft, ids, gamma=3, max_decode_len=12)
    assert {n for _, n in calls} == {12}
    per = {k: (0.01 + calls[k, 12] * price[k]) / calls[k, 12] for k in price}
    np.testing.assert_allclose(costs.v, per["gamma 3"] / per["plain"] - 3 * costs.c, rtol=1e-6)
    np.testing.assert_allclose(costs.c, 2e-4 / per["plain"], rtol=1e-6)


@pytest.fixture(scope="module")
def td_greedy_case():
    return td.make_greedy_case()


@pytest.mark.slow
def test_measured_costs_and_errors():
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    ids = np.repeat(tx.INPUT, 4, 0)
    costs = st.gamma_costs(target, draft, ids, gamma=3, max_decode_len=6)
    # timings: only what no noise can break (the arithmetic is test_measured_costs_price_...)
    assert costs.c > 0 and costs.w > 0 and costs.v >= 0 and costs.v1 >= 0
    assert all(np.isfinite(costs))
    assert st.gamma_costs(target, draft, ids, gamma=3, max_decode_len=6) is costs  # once
    out = st.generate(target, ids, draft=draft, gamma=3, max_decode_len=4, adaptive_gamma=True)
    # the decode ran on the figures measured for its own inputs and length (cached, so these)
    assert out.stats["adaptive_costs"] == st.gamma_costs(
        target, draft, ids, gamma=3, max_decode_len=4).resolved(3)._asdict()
    for bad in ("yes", (1.0,), (-1.0, 1.0), (1.0, 1.0, -1.0), (1.0, 1.0, "x"), 2,
                (1.0, 1.0, None, -0.1), (1.0, 1.0, 1.0, 1.0, 1.0), (None, 1.0), (True, 1.0)):
        with pytest.raises(ValueError, match="adaptive_gamma must be"):
            st.generate(target, tx.INPUT, draft=draft, adaptive_gamma=bad)
    with pytest.raises(ValueError, match="adaptive_gamma needs a draft"):
        st.generate(target, tx.INPUT, adaptive_gamma=True)
