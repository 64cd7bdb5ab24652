"""Adaptive gamma at batch 1, simulated: the loop's own rule against every fixed gamma, with
no timing noise.

    python experiments/adaptive_sim.py [--temperature 1] [--seeds 4] [--reps 20]
        [--costs C V V1 W] [--shift 0]

Measured once on the shipped demo pair (64 held-out inputs, gamma 8, max_decode_len 64,
`--seeds` sampled decodes of each): each input's acceptance rate (accepted / reached drafts,
pooled over its decodes) and each decode's length. Then `--reps` simulated decodes per
measured one: a row that needs that many tokens, each draft accepted with its input's rate;
a round of g drafts costs g c + its width's verify pass (+ the catch-up after plain rounds),
as `decoding.loops.choose_gamma` prices it, a plain round 1, and every decode a set-up of
`--setup` plain steps. The adaptive rows choose with the real `choose_gamma` and
`running_alpha`; the costs are `st.gamma_costs`' on the first input (or `--costs`).
`--shift` moves every rate (e.g. +0.2: a greedy-like pair). Prints tokens per plain step
relative to plain decoding for each fixed gamma and the rule, and the rule / best fixed.

What this leaves out (why it complements `bench_adaptive.py`, not replaces it): drafts
accepted independently at a per-input rate (greedy acceptance is deterministic and bursty),
costs exactly as priced. With `--costs 0.048 2.747 1.509 0.130` (T = 1) it gave the rule
0.909 of the best fixed gamma (3) with commit bec9a0d's prior (4 drafts), 0.937 with 16;
`bench_adaptive.py` measured 0.885 and 0.853 at batch 1 (costs moving between runs).
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import speculative_t5 as st
from speculative_t5.decoding.loops import adaptive_widths, choose_gamma, running_alpha
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


def simulate(alphas, need, costs, setup: float, fixed=None, seed: int = 0):
    """Tokens per plain step over the decodes (each row alone: batch 1)."""
    c, v, v1, w = costs
    widths = adaptive_widths(GAMMA)
    width = np.array([0] + [min(x for x in widths if x >= g) for g in range(1, GAMMA + 1)])
    cost_vec = jnp.asarray([c, v, v1, w], jnp.float32)

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
            g = np.asarray(choose(jnp.asarray(acc), jnp.asarray(reached),
                                  jnp.asarray(MAX_LEN - m, jnp.float32), jnp.asarray(idle),
                                  jnp.asarray(first)))
            wd = width[g]
            catch = np.where(idle > 0, np.ceil((idle + 2) / (GAMMA + 1)) * w - c, 0.0)
        else:
            g, wd, catch = np.full(R, fixed), np.full(R, fixed), 0.0
        verify = v1 + (v - v1) * (np.maximum(wd, 1) - 1) / (GAMMA - 1)
        round_cost = np.where(g == 0, 1.0, g * c + verify + catch)
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
    args = parser.parse_args()
    rates, lengths, measured = measure(args.temperature, args.seeds)
    costs = tuple(args.costs) if args.costs else tuple(measured.resolved(GAMMA))
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
    best = max((k for k in result if k != "adaptive"), key=result.get)
    for k, x in result.items():
        print(f"| {k} | {x:.3f}x plain |", flush=True)
    print(f"best fixed {best}; adaptive / best fixed {result['adaptive'] / result[best]:.3f}")


if __name__ == "__main__":
    main()
