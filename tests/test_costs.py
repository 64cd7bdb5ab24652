"""The cost model (speculative_t5.measure.costs): its arithmetic, its JSON form, and that
`measure_costs` times every part it needs (no timing is asserted: the machines are shared)."""
import numpy as np
import pytest

import speculative_t5 as st
from helpers import tiny_config
from speculative_t5.measure.costs import Costs, measure_costs


def _costs():
    return Costs(target_step=0.004, draft_step=0.0002, draft_two=0.0003,
                 verify={4: 0.005, 7: 0.006},
                 setup={32: {"target": 0.001, "draft": 0.0004}, 64: {"target": 0.002, "draft": 0.0005}},
                 plain_loop=0.00001, round_loop={4: 0.0001, 7: 0.0002}, step_width=32, cache_len=40)


def test_cost_formulas():
    c = _costs()
    assert c.c == pytest.approx(0.05) and c.v(4) == pytest.approx(1.25)
    assert c.plain_seconds(64, 20) == pytest.approx(0.002 + 20 * (0.004 + 0.00001))
    # st.generate's own cost per call, charged alike to both decoders
    called = Costs(**{**c.__dict__, "call": 0.003})
    assert called.plain_seconds(64, 20) == pytest.approx(c.plain_seconds(64, 20) + 0.003)
    assert called.speculative_seconds(32, 4, 5, 3) == pytest.approx(
        c.speculative_seconds(32, 4, 5, 3) + 0.003)
    # 5 rounds of (verify + 4 draft steps + the loop's work), 3 of them starting with a
    # two-token draft call
    assert c.speculative_seconds(32, 4, 5, 3) == pytest.approx(
        0.001 + 0.0004 + 5 * (0.005 + 4 * 0.0002 + 0.0001) + 3 * 0.0001)
    with pytest.raises(KeyError):
        c.plain_seconds(128, 1)  # a width whose set-up was not measured is not guessed
    # a round's model steps timed in turn (R_4) replace verify + 4 draft steps; a Fallback
    # (model steps counted) is still charged per step
    r = Costs(**{**c.__dict__, "model_round": {4: 0.0062}})
    assert r.speculative_seconds(32, 4, 5, 3) == pytest.approx(
        0.001 + 0.0004 + 5 * (0.0062 + 0.0001) + 3 * 0.0001)
    assert r.interleave(4) == pytest.approx(0.0004) and r.interleave(7) == 0 == c.interleave(4)
    assert r.speculative_seconds(32, 4, 5, 1, model_steps=8) == c.speculative_seconds(
        32, 4, 5, 1, model_steps=8)
    assert r.speculative_seconds(32, 7, 5, 3) == c.speculative_seconds(32, 7, 5, 3)
    assert r.speculative_seconds(32, 4, 5, 3, model_steps=20) == r.speculative_seconds(32, 4, 5, 3)
    # a plain decode's steps over its own (shorter) cache, where they were timed (T_plain);
    # the speculative prediction and c, v keep T
    short = Costs(**{**c.__dict__, "plain_step": 0.003})
    assert short.plain_seconds(64, 20) == pytest.approx(0.002 + 20 * (0.003 + 0.00001))
    assert short.speculative_seconds(32, 4, 5, 3) == c.speculative_seconds(32, 4, 5, 3)
    assert (short.c, short.v(4)) == (c.c, c.v(4))
    assert Costs.from_parts(short.parts(), 32, 40) == short and "plain_1" not in c.parts()
    assert Costs.from_json(short.to_json()) == short


def test_fallback_model_charged_for_the_steps_it_ran():
    """A Fallback decode: its model drafted in 2 of 5 rounds (8 steps at gamma 4)."""
    assert _costs().speculative_seconds(32, 4, 5, 1, model_steps=8) == pytest.approx(
        0.001 + 0.0004 + 5 * (0.005 + 0.0001) + 8 * 0.0002 + 1 * 0.0001)


@pytest.mark.slow
def test_measure_costs_of_zero_cost_drafts():
    """No draft model: c = 0, no draft set-up; the lookup's work is in the loop's per round.
    A Fallback's model steps are timed."""
    from speculative_t5.measure.costs import PartTimers
    target = st.init_model(tiny_config(), seed=0)
    lookup = PartTimers(target, st.drafts.PromptLookup(), gammas=[3], widths=[8],
                        step_width=8, cache_len=12)
    assert not {"draft_1", "draft_2", "setup_draft_8", "round_3"} & set(lookup.timers)  # nothing to time
    lookup = lookup.measure(rounds=2)
    assert lookup.c == 0 and lookup.draft_two == 0 and lookup.setup[8]["draft"] == 0
    assert lookup.round_loop[3] > 0 and lookup.target_step > 0
    draft = st.init_model(tiny_config(num_decoder_layers=1), seed=1)
    both = PartTimers(target, st.drafts.Fallback(st.drafts.PromptLookup(), draft), gammas=[3],
                      widths=[8], step_width=8, cache_len=12)
    assert {"draft_1", "draft_2", "setup_draft_8"} <= set(both.timers)
    assert "round_3" not in both.timers  # its model drafts in some rounds only
    both = both.measure(rounds=2)
    assert both.c > 0 and both.draft_two > 0 and both.setup[8]["draft"] >= 0


def test_costs_json_round_trip():
    import json
    c = _costs()
    assert Costs.from_json(json.loads(json.dumps(c.to_json()))) == c


@pytest.mark.slow  # calibration timing (~17 s); the timers' own tests stay in the default tier
def test_measure_costs_times_every_part():
    target = st.init_model(tiny_config(), seed=0)
    draft = st.init_model(tiny_config(num_decoder_layers=1), seed=1)
    c = measure_costs(target, draft, gammas=[3], widths=[8, 16], step_width=8, cache_len=12,
                      rounds=2)
    assert set(c.verify) == {3} and set(c.setup) == {8, 16}
    assert set(c.round_loop) == {3} and set(c.model_round) == {3}
    parts = [c.target_step, c.draft_step, c.draft_two, *c.verify.values(), c.plain_loop,
             *c.round_loop.values(), *c.model_round.values()]
    assert all(t > 0 for t in parts)
    assert all(t >= 0 for s in c.setup.values() for t in s.values())  # less a step: >= 0
    assert c.speculative_seconds(16, 3, 2, 1) > c.setup[16]["target"] + c.setup[16]["draft"]


@pytest.mark.parametrize("top_k", [0, 5])
def test_loop_timer_runs_the_loops_with_free_steps(top_k):
    """The loop-work timer's decode runs its whole length: every draft accepted (target and
    draft agree), no EOS, so target calls are exactly ceil(max_len / (gamma + 1))."""
    from speculative_t5.decoding.sampling import SamplingConfig
    from speculative_t5.measure.timing import loop_timer
    for gamma, temperature in [(0, 0.0), (3, 0.0), (3, 1.0), (4, 0.7)]:
        run, calls = loop_timer(50, gamma, SamplingConfig(temperature, top_k, 1.0), max_len=17)
        assert calls == -(-17 // (gamma + 1))
        tokens, lengths, _ = run()
        assert int(lengths[0]) == 17


def test_parts_by_name_and_medians_beside_the_decodes():
    """Costs <-> parts by name (as the timers and records name them); a part timed beside
    the decodes replaces the up-front one by its median; a record's prediction uses its own."""
    from speculative_t5.paper.timed import predicted_seconds
    c = _costs()
    parts = c.parts()
    assert parts["target_1"] == 0.004 and parts["target_8"] == 0.006 and parts["loop_7"] == 0.0002
    assert parts["setup_draft_64"] == 0.0005
    assert Costs.from_parts(parts, 32, 40) == c
    beside = [{"target_1": 0.002, "setup_target_32": 0.003}, {"target_1": 0.006},
              {"target_1": 0.005}]
    m = c.median_with(beside)
    assert m.target_step == 0.005 and m.setup[32] == {"target": 0.003, "draft": 0.0004}
    assert m.verify == c.verify and m.setup[64] == c.setup[64]
    rec = {"width": 32, "plain": {"target_calls": 10},
           "spec": {"target_calls": 3, "two_token_draft_calls": 1}, "parts": beside[0]}
    got = predicted_seconds(c, 4, [rec, {k: v for k, v in rec.items() if k != "parts"}])
    assert got["plain"] == pytest.approx(0.003 + 10 * (0.002 + 0.00001) + c.plain_seconds(32, 10))
    assert got["spec"] == pytest.approx(c.speculative_seconds(32, 4, 3, 1) + 0.002
                                        + c.speculative_seconds(32, 4, 3, 1))


@pytest.mark.slow
def test_part_timers_once_times_one_width():
    from speculative_t5.measure.costs import PartTimers
    target = st.init_model(tiny_config(), seed=0)
    draft = st.init_model(tiny_config(num_decoder_layers=1), seed=1)
    timers = PartTimers(target, draft, gammas=[2], widths=[8, 16], step_width=8, cache_len=12,
                        plain_len=10)
    measured = timers.measure(rounds=1)  # compiles and warms every timer, as a cell does
    once = timers.once(16)
    # and the target's set-up at the steps' width (8), which `call` is reckoned from, and the
    # plain decode's step over its own 10-position cache
    assert set(once) == {"target_1", "target_3", "draft_1", "draft_2", "loop_0", "loop_2",
                         "round_2", "call", "setup_target_16", "setup_draft_16", "setup_target_8",
                         "plain_1"}
    assert set(measured.parts()) == set(once) | {"setup_draft_8"}
    # a set-up part is its timer's call less one step, and `call` a 1-token decode less its
    # set-up and loop work: differences of single timings, never negative (0 where a tiny
    # model's part is within the noise); every directly timed part costs something
    assert all(t > 0 for n, t in once.items() if not n.startswith("setup_") and n != "call")
    assert all(t >= 0 for t in [*once.values(), *measured.parts().values()])


@pytest.mark.slow
def test_a_gpt2_calls_set_up_is_timed_at_the_calls_width():
    """A decoder-only call decodes a prompt one shorter than its positions; `call` is
    reckoned from the set-up timed at that width, not at the steps' width."""
    from speculative_t5.measure.costs import PartTimers
    config = st.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                           eos_id=63, pad_id=63)
    timers = PartTimers(st.init_model(config), None, gammas=[], widths=[8], step_width=16,
                        cache_len=8)
    assert timers.call_width == 15
    once = timers.once(8)
    assert {"setup_target_8", "setup_target_15", "setup_target_16", "call"} <= set(once)
    assert once["call"] >= 0.0


def test_round_timer_runs_a_rounds_model_steps():
    """One timed round = gamma draft steps each fed the last's argmax, then the target over
    the gamma + 1 tokens: its last token is the target's argmax after that, as composed here
    step by step with the models' own decode calls."""
    import jax.numpy as jnp
    from speculative_t5.measure.timing import round_timer
    from speculative_t5.model.api import decode, init_cache
    target = st.init_model(tiny_config(), seed=0)
    draft = st.init_model(tiny_config(num_decoder_layers=1), seed=1)
    run = round_timer(target, draft, 3, width=8, cache_len=16, rounds=1, seed=4)
    got = run()
    rng = np.random.RandomState(4)
    x = jnp.asarray(rng.randint(2, target.config.vocab_size, (1, 8)), jnp.int32)
    toks = [jnp.asarray(rng.randint(2, target.config.vocab_size, (1, 1)), jnp.int32)]
    pos = jnp.full((1,), 8, jnp.int32)
    dc, tc = init_cache(draft, x, 16), init_cache(target, x, 16)
    for j in range(3):
        logits, dc = decode(draft, dc, toks[-1], pos + j)
        toks.append(jnp.argmax(logits, -1).astype(jnp.int32))
    logits, _ = decode(target, tc, jnp.concatenate(toks, 1), pos)
    assert int(got[0, 0]) == int(jnp.argmax(logits[0, -1]))
