"""Adaptive gamma replayed on real decodes, priced without timing noise.

    python experiments/adaptive_replay.py --costs C V V1 W [--batch 8] [--temperature 1]
        [--seeds 4] [--first_round_alpha A]

The shipped demo pair decodes its 64 held-out inputs (sorted by length, batched, max_decode_len
64, `--seeds` row-key seeds) plainly, at fixed gammas 1-8 and with `adaptive_gamma=costs`
(at most 8 drafts a round): real acceptance, bursty and batched as users see it, unlike
`adaptive_sim.py`'s independent draws. Every decode is then priced in plain steps by
`decoding.loops.round_costs` at the given costs (its slowest row's rounds by drafts proposed;
a fixed gamma g verifies at width g on the same line; the catch-up after plain rounds is left
out), so the rule is compared with every fixed gamma at exactly the costs it chose by.
Prints tokens per plain step relative to plain for each, and the rule / best fixed.

--first_round_alpha A: also replay the rule with the first round chosen at alpha A instead of
as if every draft were accepted (where A gives 0, still so), a variant kept here because the
noise-free simulation favoured it and real decodes do not: with the costs of one batch-1 and
one batch-8 `bench_adaptive.py` calibration at T = 1 (`--costs 0.049 2.772 1.486 0.119
--batch 1 --first_round_alpha 0.735` and `--costs 0.055 2.812 1.497 0.167 --batch 8
--first_round_alpha 0.741`, the pair's measured rates) it gave 1.204x vs the rule's 1.223x
plain at batch 1 (0.944 vs 0.959 of the best fixed gamma) and 1.186x vs 1.226x at batch 8
(0.913 vs 0.943), 2026-12-03, with commit 951cdf3's acceptance estimate: fewer drafts
judged in the first round left the running estimate thinner, and more rounds fell to plain
steps, which add no evidence. The rule now (rows shrunk by a strength estimated from the
rows), the same commands without the flag, 2026-12-04: 0.966 at batch 1, 1.013 at batch 8;
with `--first_round_alpha 0.75` (the loop's prior) 0.977 and 0.924.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import speculative_t5 as st
from speculative_t5.decoding import loops
from speculative_t5.experiments.cells import demo_examples
from bench_drafts import batches_of  # the inputs batched as the benchmarks batch them

GAMMA, MAX_LEN = 8, 64


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--costs", type=float, nargs=4, required=True, metavar=("C", "V", "V1", "W"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--first_round_alpha", type=float, default=None)
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=64, vocabulary=vocab), key=lambda e: len(e["inputs"]))
    batches = [st.data.pad_rows(x, args.batch) for x in batches_of(examples, args.batch)]  # [B, W]
    costs = jnp.asarray(args.costs, jnp.float32)
    priced = np.asarray(loops.round_costs(costs, GAMMA, loops.adaptive_widths(GAMMA)))  # [G+1]

    def replay(**kw):
        """(tokens per plain step, the slowest rows' rounds by drafts proposed)."""
        tokens, steps, hist = 0, 0.0, np.zeros(GAMMA + 1, np.int64)
        fixed = kw.get("gamma") if "adaptive_gamma" not in kw else None
        per_round = None if fixed is None else float(loops.round_costs(costs, GAMMA, (fixed,))[fixed])
        for seed in range(args.seeds):
            for i, x in enumerate(batches):
                out = st.generate(target, x, max_decode_len=MAX_LEN, temperature=args.temperature,
                                  rng=jax.random.PRNGKey(1000 * seed + i), **kw)
                calls = np.asarray(out.stats["target_calls"])                    # [B]
                rounds = np.asarray(out.stats["drafts_per_round_hist"])[np.argmax(calls)]  # [G'+1]
                tokens += int(np.asarray(out.lengths).sum())
                if not kw:
                    steps += calls.max()
                elif per_round is not None:
                    steps += calls.max() * per_round
                else:
                    hist += rounds
                    steps += float((rounds * priced).sum())
        return tokens / steps, hist

    plain, _ = replay()
    result = {f"gamma {g}": replay(draft=draft, gamma=g)[0] / plain for g in range(1, GAMMA + 1)}
    rule, hist = replay(draft=draft, gamma=GAMMA, adaptive_gamma=tuple(args.costs))
    result["adaptive"] = rule / plain
    rows = {"adaptive": hist}
    if args.first_round_alpha is not None:
        choose = loops.choose_gamma

        def first_round_at(alpha, *a, **k):  # the loop passes exactly 1.0 in its first round
            first = alpha == 1.0
            count = choose(jnp.where(first, args.first_round_alpha, alpha), *a, **k)
            return jnp.where(first & (count == 0), choose(alpha, *a, **k), count)
        jax.clear_caches()
        loops.choose_gamma = first_round_at
        name = f"adaptive, first round at {args.first_round_alpha:g}"
        rate, rows[name] = replay(draft=draft, gamma=GAMMA, adaptive_gamma=tuple(args.costs))
        result[name] = rate / plain
        loops.choose_gamma = choose
    best = max((k for k in result if k.startswith("gamma")), key=result.get)
    print(f"T={args.temperature:g}, batch {args.batch}, {args.seeds} seeds, costs c v v1 w "
          f"{' '.join(f'{x:.3f}' for x in args.costs)}")
    for k, x in result.items():
        print(f"| {k} | {x:.3f}x plain | {rows.get(k, '')} |")
    print(f"best fixed {best}; " + ", ".join(f"{k} / best fixed {result[k] / result[best]:.3f}"
                                              for k in result if k.startswith("adaptive")))


if __name__ == "__main__":
    main()
