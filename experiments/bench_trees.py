"""Benchmark: token trees against the chain on the shipped demo pair -- tokens per target call
(counts, no noise) and walltime (plain / speculative seconds, this machine's noise).

    python experiments/bench_trees.py [--batch 1 8] [--trees 2,2,1,1 3,2,1,1 4,2,2,1]
                                      [--examples 32] [--repeats 3]

The held-out demo inputs (sorted by length, batched alike), max_decode_len 64, greedy and
T = 1: the gamma-4 chain (token-wise), then each tree with children drawn from the draft
and with its top-k children (verified as fixed guesses: exact too). Seconds are the median
of `repeats` runs after a compiling one, each decode in turn (`bench_common.timed_runs`).
A tree's nodes (without the root) are the tokens the target checks a call; a chain of
gamma checks gamma.
"""
import argparse

import jax

import speculative_t5 as st
from speculative_t5.decoding.trees import TreeShape
from speculative_t5.paper.cells import demo_examples
from bench_common import batches_of, timed_runs

MAX_LEN = 64


def decode_all(target, batches, temperature, **kw):
    """A function that decodes every batch -> (tokens, target calls)."""
    def run():
        tokens = calls = 0
        for i, x in enumerate(batches):
            out = st.generate(target, x, max_decode_len=MAX_LEN, temperature=temperature,
                              rng=jax.random.PRNGKey(i), **kw)
            tokens += int(out.lengths.sum())
            calls += int(out.stats["target_calls"].sum())
        return tokens, calls
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--trees", nargs="+", default=["2,2,1,1", "3,2,1,1", "4,2,2,1"])
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=args.examples, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    trees = [tuple(int(k) for k in t.split(",")) for t in args.trees]
    print(f"demo pair, {len(examples)} held-out inputs, max_decode_len {MAX_LEN}; "
          "tokens/call = tokens / target calls, summed over the rows; speedup = plain / that decode's "
          f"seconds (median of {args.repeats})", flush=True)
    print("| batch | T | draft | nodes/call | tokens/call | vs chain | speedup |", flush=True)
    for batch in args.batch:
        batches = batches_of(examples, batch)
        for temperature in (0.0, 1.0):
            runs = {"plain": decode_all(target, batches, temperature),
                    "chain, gamma 4": decode_all(target, batches, temperature, draft=draft, gamma=4)}
            nodes = {"chain, gamma 4": 4}
            for tree in trees:
                for kind in ("drawn", "top_k"):
                    name = f"tree {','.join(map(str, tree))}" + (", top-k" if kind == "top_k" else "")
                    runs[name] = decode_all(target, batches, temperature, draft=draft, tree=tree,
                                            tree_children=kind)
                    nodes[name] = TreeShape.of(tree).num_nodes - 1
            counts, seconds = timed_runs(runs, args.repeats)
            chain = counts["chain, gamma 4"][0] / counts["chain, gamma 4"][1]
            for name, (tokens, calls) in counts.items():
                if name != "plain":
                    print(f"| {batch} | {temperature:g} | {name} | {nodes[name]} | "
                          f"{tokens / calls:.2f} | {tokens / calls / chain:.2f}x | "
                          f"{seconds['plain'] / seconds[name]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
