"""Adaptive gamma at batch 1, simulated: the loop's own rule against every fixed gamma, with
no timing noise.

    python experiments/adaptive_sim.py [--temperature 1] [--seeds 4] [--reps 20]
        [--costs C V V1 W] [--shift 0] [--cache FILE.npz]

Measured once on the shipped demo pair (64 held-out inputs, gamma 8, max_decode_len 64,
`--seeds` sampled decodes of each): each input's acceptance rate (accepted / reached drafts,
pooled over its decodes) and each decode's length. Then `--reps` simulated decodes per
measured one: a row that needs that many tokens, each draft accepted with its input's rate;
a round costs what `decoding.loops.round_costs` prices (g c + its width's verify pass + the
catch-up after plain rounds), a plain round 1, and every decode a set-up of
`--setup` plain steps. The adaptive rows choose with the real `choose_gamma` and
`running_alpha` as the loop calls them; the costs are `st.gamma_costs`' on the first
input, or `--costs`. `--shift` moves every rate (e.g. +0.2: a greedy-like pair). Prints
tokens per plain step relative to plain decoding for each fixed gamma and the rule, and
the rule / best fixed; also the rule told each decode's true remaining length instead of
the budget (a bound on what pricing the end of a decode could gain), and told
E[L - m | L > m] over all the measured lengths (a length prior).

What this leaves out (why it complements `bench_adaptive.py`, not replaces it): drafts
accepted independently at a per-input rate (greedy acceptance is deterministic and bursty),
costs exactly as priced. `--cache` keeps what was measured for the next run.
Rule / best fixed gamma (3) at T = 1 with `--costs 0.048 2.747 1.509 0.130`: 0.909 with
commit bec9a0d's prior (worth 4 drafts), 0.937 worth 16 (`bench_adaptive.py` measured 0.885
and 0.853 at batch 1, its costs moving between runs); told the end 0.985 (the bound), told
E[end] 0.943 (2026-12-03). With the rows' shrinkage estimated from the rows (one row: its
pooled rate), 2026-12-04: 0.960, told the end 1.012, told E[end] 0.961: a length prior is
worth little here. Its independent draws can mislead: a first round at the prior's count
instead of 8 drafts scored 0.956 here (a one-off run with that rule in the loop) and lost on
real decodes (`adaptive_replay.py --first_round_alpha`).
"""
import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

import speculative_t5 as st
from speculative_t5.decoding.loops import adaptive_widths, choose_gamma, round_costs, running_alpha
from speculative_t5.experiments.cells import demo_examples

GAMMA, MAX_LEN = 8, 64


def measure(temperature: float, seeds: int):
    """Per decode: (its input's pooled acceptance rate, its length); and the costs."""
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=64, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    inputs = [st.data.pad_to([e["inputs"]], -(-len(e["inputs"]) // 32) * 32) for e in examples]
    counts, lengths = np.zeros((len(inputs), 2)), []
    for seed in range(seeds):
        for i, x in enumerate(inputs):
            out = st.generate(target, x, draft=draft, gamma=GAMMA, max_decode_len=MAX_LEN,
                              temperature=temperature, rng=jax.random.PRNGKey(1000 * seed + i))
            counts[i] += out.stats["accepted_at"].sum(), out.stats["reached_at"].sum()
            lengths.append((i, int(out.lengths[0])))
    rate = counts[:, 0] / np.maximum(counts[:, 1], 1)
    costs = st.gamma_costs(target, draft, inputs[0], GAMMA, MAX_LEN,
                           st.SamplingConfig(temperature))
    return np.array([rate[i] for i, _ in lengths]), np.array([n for _, n in lengths]), costs


def simulate(alphas, need, costs, setup: float, fixed=None, seed: int = 0, told_end=False,
             expected_end=False):
    """Tokens per plain step over the decodes (each row alone: batch 1). told_end: the rule
    is told the tokens each decode still needs, not the budget left (a bound on what
    pricing a decode's end could gain). expected_end: told E[L - m | L > m] over all the
    measured lengths L (a length prior a calibration could measure)."""
    widths = adaptive_widths(GAMMA)
    cost_vec = jnp.asarray(costs, jnp.float32)
    fixed_cost = None if fixed is None else float(round_costs(cost_vec, GAMMA, (fixed,))[fixed])

    tail = np.array([np.mean(need[need > k] - k) if (need > k).any() else 1.0
                     for k in range(MAX_LEN + 1)])                            # E[L - k | L > k]

    def rule(acc, reached, left, idle, first):  # one row's choice, as the loop makes it
        stats = {"accepted_at": acc[None, None], "reached_at": reached[None, None]}
        alpha = jnp.where(first, 1.0, running_alpha(stats, jnp.ones((1,), bool)))
        return choose_gamma(alpha, cost_vec, GAMMA, 1, left, widths, idle)
    choose = jax.jit(jax.vmap(rule))
    rng = np.random.default_rng(seed)
    R = len(need)
    m, acc, reached, idle = (np.zeros(R, np.int32) for _ in range(4))
    total = np.full(R, setup)
    first = np.ones(R, bool)
    while (m < need).any():
        active = m < need
        if fixed is None:
            left = np.ceil(tail[m]) if expected_end else (need if told_end else MAX_LEN) - m
            g = np.asarray(choose(jnp.asarray(acc), jnp.asarray(reached),
                                  jnp.asarray(left, jnp.float32), jnp.asarray(idle),
                                  jnp.asarray(first)))
            priced = np.asarray(round_costs(cost_vec, GAMMA, widths, jnp.asarray(idle)))  # [R, G+1]
            round_cost = priced[np.arange(R), g]
        else:
            g, round_cost = np.full(R, fixed), fixed_cost
        j = np.minimum(rng.geometric(1.0 - alphas) - 1, g)                    # accepted
        total += np.where(active, round_cost, 0.0)
        acc += np.where(active, j, 0)
        reached += np.where(active & (g > 0), np.minimum(j + 1, g), 0)
        idle = np.where(active, np.where(g == 0, idle + 1, 0), idle)
        first &= ~active
        m += np.where(active, np.minimum(j + 1, need - m), 0)
    return need.sum() / total.sum()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--setup", type=float, default=2.7,
                        help="a decode's set-up in plain steps (demo pair, batch 1: ~2.7)")
    parser.add_argument("--costs", type=float, nargs=4, default=None, metavar=("C", "V", "V1", "W"))
    parser.add_argument("--shift", type=float, default=0.0)
    parser.add_argument("--cache", default=None, help="an .npz keeping what was measured")
    args = parser.parse_args()
    if args.cache and os.path.exists(args.cache):
        z = np.load(args.cache)
        rates, lengths, measured = z["rates"], z["lengths"], st.GammaCosts(*z["costs"])
    else:
        rates, lengths, measured = measure(args.temperature, args.seeds)
        if args.cache:
            np.savez(args.cache, rates=rates, lengths=lengths,
                     costs=np.asarray(measured.resolved(GAMMA), float))
    costs = tuple((st.GammaCosts(*args.costs) if args.costs else measured).resolved(GAMMA))
    alphas = np.clip(np.tile(rates, args.reps) + args.shift, 0.0, 0.995)
    need = np.tile(lengths, args.reps)
    plain = need.sum() / (need.sum() + len(need) * args.setup)
    print(f"T={args.temperature:g}, {len(lengths)} decodes x {args.reps}, acceptance rate "
          f"{np.mean(alphas):.3f} (inputs' 10-90%: {np.quantile(rates + args.shift, 0.1):.3f}-"
          f"{np.quantile(rates + args.shift, 0.9):.3f}), mean length {lengths.mean():.1f}, "
          f"costs c v v1 w {' '.join(f'{x:.3f}' for x in costs)}", flush=True)
    result = {f"gamma {g}": simulate(alphas, need, costs, args.setup, g) / plain
              for g in range(1, GAMMA + 1)}
    result["adaptive"] = simulate(alphas, need, costs, args.setup) / plain
    result["adaptive told the end"] = simulate(alphas, need, costs, args.setup,
                                               told_end=True) / plain
    result["adaptive told E[end]"] = simulate(alphas, need, costs, args.setup,
                                              expected_end=True) / plain
    best = max((k for k in result if k.startswith("gamma")), key=result.get)
    for k, x in result.items():
        print(f"| {k} | {x:.3f}x plain |", flush=True)
    print(f"best fixed {best}; adaptive / best fixed {result['adaptive'] / result[best]:.3f}, "
          f"told the end {result['adaptive told the end'] / result[best]:.3f}, "
          f"told E[end] {result['adaptive told E[end]'] / result[best]:.3f}")


if __name__ == "__main__":
    main()
