"""Benchmark: adaptive gamma against plain decoding and fixed gamma, batch 1 to 64.

    python experiments/bench_adaptive.py [--temperature 0] [--num_examples 64]

The shipped demo pair, held-out inputs (sorted by length, batched, widths rounded up to 32),
max_decode_len 64. For each batch size: plain, fixed gamma 4 and `adaptive_gamma=True`
(at most 4 drafts a round; c and v measured by `st.gamma_costs` at that batch size, once,
before timing), and the adaptive loop with costs that never let it draft (every round a
plain step inside the speculative loop: what a plain round costs there). Every variant runs
once to compile and measure, then the variants are timed in turn 3 times (medians), so the
machine's noise hits them alike. Prints tokens per second relative to plain, tokens per
target call, the rounds by drafts proposed, and milliseconds per loop iteration (the
batches' slowest rows' target calls).
"""
import argparse
import time

import jax
import numpy as np

import speculative_t5 as st
from speculative_t5.experiments.cells import demo_examples
from speculative_t5.measure.timing import interleaved_medians

MAX_LEN, GAMMA = 64, 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--num_examples", type=int, default=64)
    parser.add_argument("--batches", default="1,8,32,64")
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=args.num_examples, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    variants = {"plain": {}, f"gamma {GAMMA}": dict(draft=draft, gamma=GAMMA),
                f"adaptive (<= {GAMMA})": dict(draft=draft, gamma=GAMMA, adaptive_gamma=True),
                "adaptive, never drafting": dict(draft=draft, gamma=GAMMA,
                                                 adaptive_gamma=st.GammaCosts(100.0, 100.0))}
    print(f"demo pair, {len(examples)} held-out inputs, T={args.temperature:g}, "
          f"max_decode_len {MAX_LEN}", flush=True)
    for B in (int(b) for b in args.batches.split(",")):
        batches = []
        for i in range(0, len(examples), B):
            chunk = examples[i:i + B]
            width = -(-max(len(e["inputs"]) for e in chunk) // 32) * 32
            batches.append(st.data.pad_rows(st.data.pad_to([e["inputs"] for e in chunk],
                                                           width), B))         # [B, W]
        results = {}

        def runner(name, kw):
            def run():
                outs = [st.generate(target, x, max_decode_len=MAX_LEN,
                                    temperature=args.temperature, rng=jax.random.PRNGKey(i), **kw)
                        for i, x in enumerate(batches)]
                results[name] = outs
                return outs
            return run
        t0 = time.perf_counter()
        runs = {name: runner(name, kw) for name, kw in variants.items()}
        seconds = interleaved_medians(runs, rounds=3, warmup=1)
        tokens = {name: sum(int(o.lengths.sum()) for o in outs) for name, outs in results.items()}
        assert args.temperature > 0 or len(set(tokens.values())) == 1, tokens  # greedy: same
        plain_rate = tokens["plain"] / seconds["plain"]
        for name in variants:
            outs = results[name]
            calls = sum(int(o.stats["target_calls"].sum()) for o in outs)
            iterations = sum(int(o.stats["target_calls"].max()) for o in outs)
            hist = np.sum([o.stats["drafts_per_round_hist"].sum(0) for o in outs], axis=0)
            costs = outs[0].stats.get("adaptive_costs")
            extra = (f" c={costs['c']:.3f} v={costs['v']:.3f}" if costs else "")
            print(f"| {B} | {name} | {tokens[name] / seconds[name] / plain_rate:.2f}x | "
                  f"{tokens[name] / calls:.3f} | {hist.tolist()} | "
                  f"{1e3 * seconds[name] / iterations:.2f} |{extra}", flush=True)
        print(f"  (batch {B}: {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
