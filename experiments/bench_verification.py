"""Benchmark: token-wise against block verification on the shipped demo pair.

    python experiments/bench_verification.py [--examples 32] [--gammas 4 8] [--batches 1 8]
        [--repeats 3]

Held-out demo inputs (the pair's test split), greedy and T = 1. Per setting: tokens per
target call for each rule (a count: no timing noise; at T = 1 summed over --samples keys
per input) and the ratio block / token, then walltime of both decodes over all inputs
(median of --repeats interleaved runs, compile excluded) and its ratio. Greedy must give
the same tokens both ways (checked); at T = 1 block verification should emit more tokens
per call (Sun et al. 2025: never fewer in expectation).
"""
from __future__ import annotations

import argparse

import jax
import numpy as np

import speculative_t5 as st
from speculative_t5.paper.cells import demo_examples
from speculative_t5.calibration import interleaved_medians
from bench_common import batches_of


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--gammas", type=int, nargs="+", default=[4, 8])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--samples", type=int, default=4, help="keys per input at T = 1")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max_decode_len", type=int, default=64)
    args = p.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=args.examples, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    print(f"demo pair, {len(examples)} held-out inputs, max_decode_len {args.max_decode_len}; "
          f"walltime: median of {args.repeats} interleaved runs, compile excluded")
    print(f"{'T':>3} {'gamma':>5} {'batch':>5} {'tok/call token':>14} {'block':>6} {'ratio':>6} "
          f"{'time token s':>12} {'block s':>8} {'speedup':>7}")
    for temperature in (0.0, 1.0):
        for gamma in args.gammas:
            for batch in args.batches:
                inputs = batches_of(examples, batch)
                seeds = range(args.samples if temperature else 1)

                def run(verification):
                    outs = [st.generate(target, x, draft=draft, gamma=gamma,
                                        max_decode_len=args.max_decode_len,
                                        temperature=temperature, verification=verification,
                                        rng=jax.random.PRNGKey(s))
                            for x in inputs for s in seeds]
                    return outs
                token, block = run("token"), run("block")
                if temperature == 0:
                    assert all((a.tokens == b.tokens).all() for a, b in zip(token, block))

                def per_call(outs):
                    return (sum(int(o.lengths.sum()) for o in outs)
                            / sum(int(o.stats["target_calls"].sum()) for o in outs))
                t_token, t_block = per_call(token), per_call(block)
                times = interleaved_medians({"token": lambda: run("token"),
                                             "block": lambda: run("block")}, args.repeats)
                print(f"{temperature:>3g} {gamma:>5} {batch:>5} {t_token:>14.3f} {t_block:>6.3f} "
                      f"{t_block / t_token:>6.3f} {times['token']:>12.3f} {times['block']:>8.3f} "
                      f"{times['token'] / times['block']:>7.3f}", flush=True)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
