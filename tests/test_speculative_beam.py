"""The speculative beam search (`decoding.speculative_beam`, `st.beam_search(..., draft=)`)
returns plain beam search's beams, scores and lengths.

At the loop level the "models" are lookup tables: logits = table[hash of the whole prefix],
read through a cache of the tokens written at each position (so a cache gathered from the
wrong path row changes the logits), identical in any batch shape: bit-identical results for
gamma 1..7 (each with one of beams 1..4 and a number of path rows from none spare to
enough for every node of the draft's beam search), drafts that agree with the target on
~60% of prefixes, always (the target's own table), or never (noise), on random tables and
on tables full of exact ties (which also checks the re-sort of a row that stops before the
batch). Through `st.beam_search`: random tiny T5s (float32, padded rows, an EOS the model
emits) with a perturbed copy and the target itself as drafts, a GPT-2 pair, a partitioned
search, statistics, bad arguments."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
from helpers import gpt2_pair, random_ids, run_on_eight_devices, tiny_config
from speculative_t5.decoding.beam import beam_search as plain_loop
from speculative_t5.decoding.speculative_beam import speculative_beam_search

ROWS, V, MAX_LEN, EOS = 509, 20, 12, 3   # table rows, vocabulary, decode length, EOS id
TESTS = os.path.dirname(os.path.abspath(__file__))


def table_step(table):
    """A step function whose logits [N, K, V] are table[hash of the tokens at positions
    0..p] for each query position p; the cache [N, L] holds the token written at each
    position (writes past L dropped, as the models' are)."""
    def step(cache, tokens, pos):
        N, K = tokens.shape
        L = cache.shape[1]
        cols = pos[:, None] + jnp.arange(K)                                    # [N, K]
        cache = cache.at[jnp.arange(N)[:, None], cols].set(tokens, mode="drop")
        mult = jnp.uint32(2654435761) ** jnp.arange(1, L + 1, dtype=jnp.uint32)
        h = jnp.cumsum((cache.astype(jnp.uint32) + 1) * mult, axis=1, dtype=jnp.uint32)
        h = jnp.take_along_axis(h, jnp.minimum(cols, L - 1), axis=1)           # [N, K]
        return table[(h % ROWS).astype(jnp.int32)], cache
    return step


@functools.partial(jax.jit, static_argnames=("beam",))
def plain_tables(table, start, offset, alpha, beam):
    cache = jnp.zeros((start.shape[0] * beam, MAX_LEN), jnp.int32)
    return plain_loop(table_step(table), cache, start.shape[0], beam, MAX_LEN, EOS, alpha,
                      start, offset)


@functools.partial(jax.jit, static_argnames=("beam", "gamma", "paths"))
def speculative_tables(table, draft_table, start, offset, alpha, beam, gamma, paths):
    cache = jnp.zeros((start.shape[0] * beam, MAX_LEN), jnp.int32)
    return speculative_beam_search(table_step(table), cache, table_step(draft_table), cache,
                                   start.shape[0], beam, MAX_LEN, EOS, alpha, gamma, paths,
                                   start, offset)


def tables(seed, tied):
    """(target table, drafts {name: table}); tied: small integers, most rows all zeros
    beside EOS, so many candidates and finished beams score exactly alike."""
    rng = np.random.RandomState(seed)
    if tied:
        t = np.round(rng.randn(ROWS, V)).astype(np.float32)
        t[rng.rand(ROWS) < 0.7] = 0.0
        t[:, EOS] += rng.choice([0.0, 1.0, 2.0], size=ROWS)
        noise = np.round(rng.randn(ROWS, V)).astype(np.float32)
    else:
        t, noise = (2.0 * rng.randn(2, ROWS, V)).astype(np.float32)
    mixed = np.where(rng.rand(ROWS, 1) < 0.6, t, noise)
    return t, {"mixed": mixed, "target": t, "noise": noise}


def check_stats(stats, gamma, plain_steps):
    """A row's steps add up over its rounds; each round is one target call covering 1 to
    gamma + 1 steps, with gamma draft calls; the batch runs as many steps as plain."""
    calls, steps, hist = stats["target_calls"], stats["beam_steps"], stats["steps_per_call_hist"]
    np.testing.assert_array_equal(hist.sum(1), calls)
    assert hist.shape[1] == gamma + 2 and not hist[:, 0].any()
    np.testing.assert_array_equal((hist * np.arange(gamma + 2)).sum(1), steps)
    np.testing.assert_array_equal(stats["draft_calls"], gamma * calls)
    assert np.all(stats["rounds"] == calls.max()) and steps.max() == plain_steps


# every gamma 1..7 and beam 1..4; path rows: none spare (gamma 1), some, or many. With
# P >= 2W - 1 rows a draft equal to the target covers at least 2 steps every round but a
# row's last: its beam search (P - W wide) holds the target's next W beams at depth 1, the
# best children first, with rows to hold them; one beam (W = 1) is its greedy path, gamma
# + 1 steps every round
CASES = [(1, 4, 4), (2, 3, 7), (3, 2, 5), (4, 4, 8), (5, 1, 1), (6, 3, 15), (7, 2, 3)]


@pytest.mark.parametrize("gamma,beam,paths", CASES)
def test_lookup_tables_equal_plain_beam_search(gamma, beam, paths):
    rng = np.random.RandomState(gamma)
    start = jnp.asarray(rng.randint(4, V, 5), jnp.int32)     # 5 rows of their own starts
    offset = jnp.asarray(rng.randint(0, 5, 5), jnp.int32)    # and brevity-penalty offsets
    full = paths >= 2 * beam - 1
    for seed, tied, alpha in ((gamma, False, 0.6), (gamma, True, 0.0)):
        target, drafts = tables(seed, tied)
        ref = jax.device_get(plain_tables(target, start, offset, alpha, beam))
        per_call = {}
        for name, draft in drafts.items():
            *out, stats = jax.device_get(speculative_tables(
                target, draft, start, offset, alpha, beam, gamma, paths))
            for a, b, what in zip(ref[:3], out, ("tokens", "scores", "lengths")):
                np.testing.assert_array_equal(a, b, err_msg=f"{what}, {name} draft, tied {tied}")
            check_stats(stats, gamma, int(ref[3]))
            per_call[name] = stats["beam_steps"].sum() / stats["target_calls"].sum()
            if name == "target" and full:  # >= 2 steps a round (W = 1: gamma + 1) but the last
                cover = gamma + 1 if beam == 1 else 2
                assert np.all(stats["target_calls"] <= -(-stats["beam_steps"] // cover)), stats
        assert min(per_call.values()) >= 1.0, per_call
        if full or not tied:  # (tied tables' beams often have no spare path row at gamma 1)
            assert per_call["target"] > max(per_call["noise"], 1.0), per_call


def test_paths_fewer_than_beams_is_an_error():
    with pytest.raises(ValueError, match="paths .3. must be >= beam_size .4."):
        speculative_tables(jnp.zeros((ROWS, V)), jnp.zeros((ROWS, V)), jnp.zeros(2, jnp.int32),
                           jnp.zeros(2, jnp.int32), 0.6, beam=4, gamma=2, paths=3)


def assert_same_beams(plain, spec, what):
    """Same tokens and lengths in every row (how many rows differ is in the message), scores
    to float rounding (the target scores (gamma + 1) tokens a call, not one)."""
    differ = ~((plain.tokens == spec.tokens).all((1, 2)) & (plain.lengths == spec.lengths).all(1))
    assert not differ.any(), f"{what}: rows {np.flatnonzero(differ).tolist()} of {len(differ)} differ"
    np.testing.assert_allclose(spec.scores, plain.scores, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def t5():
    """A random tiny T5 1.1 (float32), 4 inputs padded to lengths 10, 7, 4, 2, EOS the token
    its beams hold most often (beams end at it; eos is traced: one program for both), a
    draft of its weights perturbed by 5%."""
    target = st.init_model(tiny_config(vocab_size=40), seed=3)
    x = random_ids(np.random.RandomState(0), 4, 10, 40, pad_tail=[0, 3, 6, 8])
    free = st.beam_search(target, x, beam_size=3, max_decode_len=10).tokens
    values, counts = np.unique(free[free > 1], return_counts=True)  # not pad, not the old EOS
    target = st.Model(target.config.replace(eos_id=int(values[np.argmax(counts)])), target.params)
    rng = np.random.RandomState(1)
    draft = st.Model(target.config, jax.tree_util.tree_map(
        lambda p: p * (1 + 0.05 * rng.randn(*p.shape)).astype(p.dtype), target.params))
    return target, draft, x


def test_t5_equals_plain_beam_search(t5):
    target, draft, x = t5
    plain = st.beam_search(target, x, beam_size=3, max_decode_len=10)
    assert (plain.tokens == target.config.eos_id).any() and (plain.lengths < 10).any()
    per_call = {}
    for name, d in (("perturbed", draft), ("target", target)):
        out = st.beam_search(target, x, draft=d, gamma=3, beam_size=3, max_decode_len=10)
        assert_same_beams(plain, out, f"{name} draft")
        check_stats(out.stats, 3, int(plain.stats["beam_steps"][0]))
        summary = out.summary()
        assert summary["gamma"] == 3 and summary["paths"] == 12  # the default, 4 * beam_size
        assert summary["target_calls"] == sum(summary["steps_per_call_histogram"])
        per_call[name] = summary["beam_steps_per_target_call"]
    assert plain.summary()["beam_steps_per_target_call"] == 1.0
    assert per_call["target"] > 2.0 and per_call["perturbed"] >= 1.0, per_call


def test_gpt2_pair_equals_plain_beam_search():
    target, draft, prompts, lengths = gpt2_pair()
    plain = st.beam_search(target, prompts, beam_size=3, max_decode_len=8, prompt_lengths=lengths)
    out = st.beam_search(target, prompts, draft=draft, gamma=2, beam_size=3, max_decode_len=8,
                         prompt_lengths=lengths)
    assert (plain.tokens == target.config.eos_id).any()
    assert_same_beams(plain, out, "GPT-2")
    check_stats(out.stats, 2, int(plain.stats["beam_steps"][0]))
    assert out.summary()["beam_steps_per_target_call"] >= 1.0


SCRIPT = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import jax, numpy as np
import speculative_t5 as st
from helpers import random_ids, tiny_config
assert jax.device_count() == 8, jax.devices()
model = st.init_model(tiny_config(vocab_size=64, num_heads=4), seed=2)
draft = st.init_model(tiny_config(vocab_size=64, num_heads=4, num_decoder_layers=1), seed=2)
x = random_ids(np.random.RandomState(1), 3, 10, 64, pad_tail=[0, 3, 6])
p = st.Partitioner(num_partitions=2)  # 3 rows padded to 4 over 'data', heads over 'model'
kw = dict(beam_size=3, max_decode_len=8, gamma=2)
a = st.beam_search(model, x, beam_size=3, max_decode_len=8)
b = st.beam_search(model, x, draft=draft, partitioner=p, **kw)
c = st.beam_search(model, x, draft=model, partitioner=p, **kw)
print("RESULT " + json.dumps({k: [bool((a.tokens == o.tokens).all()),
                                  bool((a.lengths == o.lengths).all()),
                                  float(np.abs(a.scores - o.scores).max()),
                                  o.summary()["beam_steps_per_target_call"],
                                  len(o.stats["target_calls"])] for k, o in (("b", b), ("c", c))}))
'''


@pytest.mark.slow
def test_partitioned_equals_plain(tmp_path):
    r = run_on_eight_devices(SCRIPT, TESTS)
    for same_tokens, same_lengths, scores, per_call, rows in r.values():
        assert same_tokens and same_lengths and scores < 1e-5 and rows == 3, r
    assert r["c"][3] > 1.5, r


def test_bad_arguments_are_one_line_errors(t5):
    target, draft, x = t5  # the checks read configs: models without weights do
    other_vocab = st.Model(target.config.replace(vocab_size=41), {})
    gpt2 = st.Model(st.GPT2Config(vocab_size=40, n_positions=64, eos_id=1, pad_id=0), {})
    short = st.Model(gpt2.config.replace(n_positions=16), {})
    prompts, lengths = np.ones((2, 9), np.int32), np.array([9, 4])
    cases = [
        (ValueError, "draft vocab_size 41 != target vocab_size 40",
         lambda: st.beam_search(target, x, draft=other_vocab)),
        (ValueError, "gamma must be an int >= 1", lambda: st.beam_search(target, x, draft=draft, gamma=0)),
        (ValueError, "gamma must be an int", lambda: st.beam_search(target, x, draft=draft, gamma=2.0)),
        (ValueError, "paths must be an int >= 4",
         lambda: st.beam_search(target, x, draft=draft, beam_size=4, paths=3)),
        (ValueError, "paths is for a speculative beam search",
         lambda: st.beam_search(target, x, paths=8)),
        (TypeError, "a beam search's draft must be a speculative_t5.Model",
         lambda: st.beam_search(target, x, draft=st.drafts.PromptLookup())),
        (TypeError, "a beam search's draft must be", lambda: st.beam_search(target, x, draft="small")),
        (ValueError, "must be one family", lambda: st.beam_search(target, x, draft=gpt2)),
        (ValueError, "must be one family", lambda: st.beam_search(gpt2, prompts, draft=target)),
        (ValueError, "draft eos/pad ids", lambda: st.beam_search(
            target, x, draft=st.Model(target.config.replace(eos_id=target.config.eos_id + 1), target.params))),
        (ValueError, "exceeds the model's 16 positions", lambda: st.beam_search(
            gpt2, prompts, draft=short, prompt_lengths=lengths, max_decode_len=8)),
    ]
    for kind, text, call in cases:
        with pytest.raises(kind) as e:
            call()
        assert text in str(e.value) and "\n" not in str(e.value), (text, str(e.value))
