"""Exactness of speculative sampling against exact enumeration.

Tiny random models over an 8-token vocabulary: the empirical distribution of the first 3
generated tokens over 60,000 samples must match the target's exact distribution
(enumerated from its own adjusted probabilities, EOS included) by a chi-square test at a
fixed seed; the same test must detect lenience < 1, which is inexact by design."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import speculative_t5 as st
from speculative_t5.decoding.sampling import SamplingConfig, adjust, verify

V, EOS, N, STEPS = 8, 1, 60_000, 3  # as the draft, block and GPT-2 files


def _cfg(**kw):
    return st.T5Config(vocab_size=V, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=16,
                       num_encoder_layers=1, num_decoder_layers=2, eos_id=EOS, **kw)


@pytest.fixture(scope="module")
def pair():
    target = st.init_model(_cfg(), seed=0)
    draft = st.init_model(_cfg(), seed=1)
    return target, draft


INPUT = np.array([[3, 5, 2, 7, 4]], np.int32)


def exact_distribution(model, sampling):
    """P(first STEPS tokens) as {tuple: prob}; sequences stop at EOS and are 0-padded."""
    prefixes = list(itertools.product(range(V), repeat=STEPS - 1))
    dec = np.array([[0, *p] for p in prefixes], np.int32)                     # [V^2, 3]
    logits = st.forward(model, np.repeat(INPUT, len(dec), 0), dec)            # [V^2, 3, V]
    return enumerate_distribution(np.asarray(adjust(logits, sampling), np.float64), EOS)


def enumerate_distribution(probs, eos: int):
    """{first STEPS tokens (stopped at eos, 0-padded): probability}, from probs [V^(STEPS-1),
    STEPS, V]: row i holds the next-token distributions along prefix i (the prefixes of
    STEPS - 1 tokens in itertools.product order)."""
    prefixes = list(itertools.product(range(V), repeat=STEPS - 1))
    row = {p: i for i, p in enumerate(prefixes)}
    dist = {}
    for seq in itertools.product(range(V), repeat=STEPS):
        prob, out = 1.0, []
        for t in range(STEPS):
            ctx = tuple(out) + (0,) * (STEPS - 1 - len(out))
            prob *= probs[row[ctx[:STEPS - 1]], t, seq[t]]
            out.append(seq[t])
            if seq[t] == eos:
                break
        key = tuple(out) + (0,) * (STEPS - len(out))
        if len(out) == STEPS or all(s == 0 for s in seq[len(out):]):
            dist[key] = dist.get(key, 0.0) + prob
    total = sum(dist.values())
    assert abs(total - 1.0) < 1e-5, total
    return dist


def chi_square_pvalue(samples, dist):
    keys = sorted(dist)
    index = {k: i for i, k in enumerate(keys)}
    observed = np.zeros(len(keys))
    for seq, count in zip(*np.unique(samples, axis=0, return_counts=True)):
        observed[index[tuple(int(v) for v in seq)]] += count  # KeyError = impossible sequence
    expected = np.array([dist[k] for k in keys]) * len(samples)
    big = expected >= 5                                       # pool the rare cells into one
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return scipy_stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue, int(big.sum())


SETTINGS = {"T=1": SamplingConfig(1.0), "T=0.6": SamplingConfig(0.6),
            "top-k 3": SamplingConfig(1.0, top_k=3), "top-p 0.8": SamplingConfig(1.0, top_p=0.8)}


def _sample(pair, sampling, draft=True, lenience=1.0, gamma=2, seed=0):
    target, d = pair
    out = st.generate(target, np.repeat(INPUT, N, 0), draft=d if draft else None, gamma=gamma,
                      max_decode_len=STEPS, temperature=sampling.temperature,
                      top_k=sampling.top_k, top_p=sampling.top_p, lenience=lenience,
                      rng=jax.random.PRNGKey(seed))
    return out


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_speculative_sampling_matches_target_exactly(pair, name):
    sampling = SETTINGS[name]
    dist = exact_distribution(pair[0], sampling)
    out = _sample(pair, sampling)
    summary = out.summary()
    assert 0.1 < summary["acceptance_rate"] < 0.95, summary  # both branches exercised
    assert summary["exact"]
    pvalue, cells = chi_square_pvalue(out.tokens, dist)
    assert cells >= 20
    assert pvalue > 1e-3, (name, pvalue)
    # the draft's own distribution is far from the target's: the test could tell them apart
    draft_dist = exact_distribution(pair[1], sampling)
    tv = 0.5 * sum(abs(dist.get(k, 0) - draft_dist.get(k, 0)) for k in set(dist) | set(draft_dist))
    assert tv > 0.1


def test_plain_sampling_matches_target_exactly(pair):
    """The same check on the baseline sampler (validates the enumeration itself)."""
    sampling = SETTINGS["T=1"]
    pvalue, _ = chi_square_pvalue(_sample(pair, sampling, draft=False).tokens,
                                  exact_distribution(pair[0], sampling))
    assert pvalue > 1e-3


def test_lenience_is_detected_as_inexact(pair):
    sampling = SETTINGS["T=1"]
    out = _sample(pair, sampling, lenience=0.2)
    assert not out.summary()["exact"]
    pvalue, _ = chi_square_pvalue(out.tokens, exact_distribution(pair[0], sampling))
    assert pvalue < 1e-6


def test_paper_single_token_example():
    """p = [.5, .3, .15, .05], q = [.3, .5, .1, .1]: accept with probability 0.75, the residual
    is [.8, 0, .2, 0], and the emitted token is distributed as p."""
    p = jnp.array([.5, .3, .15, .05])
    q = jnp.array([.3, .5, .1, .1])
    B = 400_000
    k_draft, k_verify = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.categorical(k_draft, jnp.log(q), shape=(B,)).astype(jnp.int32)
    P = jnp.broadcast_to(p, (B, 2, 4))
    Q = jnp.broadcast_to(q, (B, 1, 4))
    n, nxt, _ = verify(jax.random.split(k_verify, B), P, Q, x[:, None], greedy=False)
    n, nxt, x = map(np.asarray, (n, nxt, x))
    se = np.sqrt(0.75 * 0.25 / B)
    assert abs(n.mean() - 0.75) < 5 * se
    residual = np.bincount(nxt[n == 0], minlength=4) / (n == 0).sum()
    np.testing.assert_allclose(residual, [.8, 0, .2, 0], atol=0.01)
    assert residual[1] == 0 and residual[3] == 0
    first = np.where(n == 1, x, nxt)
    freq = np.bincount(first, minlength=4)
    assert scipy_stats.chisquare(freq, np.array([.5, .3, .15, .05]) * B).pvalue > 1e-3
    # exact (non-random) pieces: min(1, p/q) per token, sum = 0.75
    np.testing.assert_allclose(np.sum(np.minimum(p, q)), 0.75)


def test_adjust_top_k_top_p_and_greedy():
    logits = jnp.log(jnp.array([[.1, .4, .2, .3]]))
    np.testing.assert_allclose(adjust(logits, SamplingConfig(1.0, top_k=2)), [[0, 4 / 7, 0, 3 / 7]],
                               atol=1e-6)
    # top-p 0.6: .4 then .3 reaches 0.7 >= 0.6 -> keep {1, 3}
    np.testing.assert_allclose(adjust(logits, SamplingConfig(1.0, top_p=0.6)), [[0, 4 / 7, 0, 3 / 7]],
                               atol=1e-6)
    np.testing.assert_allclose(adjust(logits, SamplingConfig(1.0, top_p=0.3)), [[0, 1, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(adjust(logits, SamplingConfig(0.0)), [[0, 1, 0, 0]])
    t = np.asarray(adjust(logits, SamplingConfig(0.5)))
    np.testing.assert_allclose(t, np.array([[.01, .16, .04, .09]]) / .30, atol=1e-6)


def _truncated_reference(logits, temperature, top_k, top_p):
    """Independent numpy top-k then top-p over one row of logits [V], float64."""
    x = np.asarray(logits, np.float64) / temperature
    if 0 < top_k < len(x):
        x = np.where(x < np.sort(x)[::-1][top_k - 1], -np.inf, x)   # ties at the k-th kept
    probs = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    kept, mass = np.zeros(len(x), bool), 0.0
    for i in np.argsort(-probs, kind="stable"):                     # the smallest prefix reaching p
        if mass >= top_p and top_p < 1:
            break
        kept[i], mass = probs[i] > 0, mass + probs[i]
    return np.where(kept, probs, 0) / np.where(kept, probs, 0).sum()


def test_adjust_with_traced_settings_matches_an_independent_reference():
    """One compiled adjust serves every top-k and top-p (traced, as `generate` passes them):
    each setting equals a numpy reference, on logits with ties at the cut."""
    rng = np.random.RandomState(0)
    logits = np.round(rng.randn(6, 12), 1).astype(np.float32)  # [R, V], rounding makes ties
    logits[:, 3] = logits[:, 5]
    traced = jax.jit(lambda x, t, k, p: adjust(x, SamplingConfig(t, k, p)))
    for t, k, p in [(1.0, 0, 1.0), (1.0, 3, 1.0), (0.7, 0, 0.8), (1.3, 5, 0.6), (1.0, 12, 0.95),
                    (1.0, 1, 1.0), (0.5, 4, 0.3)]:
        got = np.asarray(traced(logits, jnp.float32(t), jnp.int32(k), jnp.float32(p)))
        want = np.stack([_truncated_reference(row, t, k, p) for row in logits])
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"T {t} top_k {k} top_p {p}")
        np.testing.assert_allclose(np.asarray(adjust(logits, SamplingConfig(t, k, p))), got,
                                   atol=1e-6)
    assert traced._cache_size() == 1


@pytest.mark.parametrize("verification", ["token", "block"])
def test_caches_that_end_at_max_decode_len_stay_exact(pair, verification):
    """The loops straight over caches of exactly max_decode_len (STEPS) positions, without
    `generate`'s rounding to 16: every round after the first feeds tokens past the caches'
    end (their writes dropped, queries there reading stale keys), and the first STEPS
    tokens still follow the target's distribution exactly, T = 1."""
    from speculative_t5.decoding.drafts import ModelDraft
    from speculative_t5.decoding.loops import speculative_decode
    from speculative_t5.engine import step_fn
    from speculative_t5.model.api import init_cache
    target, draft = pair
    sampling = SETTINGS["T=1"]

    @jax.jit
    def run(ids, keys):
        d = ModelDraft(step_fn(draft), lambda x, length: init_cache(draft, x, length))
        return speculative_decode(step_fn(target), init_cache(target, ids, STEPS), d,
                                  d.init(ids, STEPS), N, STEPS, EOS, 2, sampling, keys,
                                  verification=verification)
    tokens, lengths, stats = run(jnp.asarray(np.repeat(INPUT, N, 0)),
                                 jax.random.split(jax.random.PRNGKey(11), N))
    calls = np.asarray(stats["target_calls"])
    assert (calls >= 2).mean() > 0.3          # many rows drafted past the end in a round
    pvalue, cells = chi_square_pvalue(np.asarray(tokens), exact_distribution(target, sampling))
    assert cells >= 20 and pvalue > 1e-3, (verification, pvalue)


if __name__ == "__main__":  # print the p-values and acceptance rates behind the asserts
    import sys
    models = (st.init_model(_cfg(), seed=0), st.init_model(_cfg(), seed=1))
    for name, s in SETTINGS.items():
        out = _sample(models, s)
        print(name, "p =", chi_square_pvalue(out.tokens, exact_distribution(models[0], s)),
              "acceptance", round(out.summary()["acceptance_rate"], 3), file=sys.stderr)
    out = _sample(models, SETTINGS["T=1"], lenience=0.2)
    print("lenience 0.2 p =", chi_square_pvalue(out.tokens, exact_distribution(models[0], SETTINGS["T=1"])),
          file=sys.stderr)

