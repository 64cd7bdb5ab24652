"""Benchmark: token trees against the chain on a shipped demo pair -- tokens per target call
(counts, no noise) and walltime (plain / speculative seconds, this machine's noise).

    python experiments/bench_trees.py [--family t5|gpt2] [--batch 1 8] [--examples 32]
                                      [--trees 2,2,1,1 3,2,1,1 4,2,2,1] [--repeats 3] [--choose]

The held-out inputs of the T5 demo (max_decode_len 64) or the GPT-2 demo's held-out
completion prompts (their last 160 tokens, 32 new tokens), sorted by length and batched
alike; greedy and T = 1: the gamma-4 chain (token-wise), then each tree with children drawn from the draft
and with its top-k children (verified as fixed guesses: exact too). Seconds are the median
of `repeats` runs after a compiling one, each decode in turn (`bench_common.timed_runs`).
A tree's nodes (without the root) are the tokens the target checks a call; a chain of
gamma checks gamma. --choose: first the chooser's table (`measure.tree_choice`: each menu
shape's expected tokens from a probe's rank rates over these inputs, its cost from step
timings at the first batch's shape, the predicted speedup), and its pick measured too.
"""
import argparse

import jax
import numpy as np

import speculative_t5 as st
from speculative_t5.decoding.trees import TreeShape
from speculative_t5.measure.tree_choice import MENU, choose, probe_shape, tree_costs
from speculative_t5.paper.cells import demo_examples
from bench_common import batches_of, timed_runs

MAX_LEN = {"t5": 64, "gpt2": 32}
PROMPT = 160  # a GPT-2 prompt's last tokens: with 32 new and a tree's nodes, within 256


def load(family, num_examples):
    """(target, draft, batches builder): the shipped pair of `family` and its held-out
    inputs sorted by length; the builder makes `generate` kwargs for each batch."""
    if family == "t5":
        target, draft, vocab = st.load_demo()
        examples = sorted(demo_examples(num_examples=num_examples, vocabulary=vocab),
                          key=lambda e: len(e["inputs"]))
        return target, draft, lambda b: [dict(input_ids=x) for x in batches_of(examples, b)]
    from speculative_t5.checkpoints.demo import demo_paths
    from speculative_t5.data.bpe import BPEVocabulary
    from speculative_t5.data.code_corpus import heldout_prompts
    paths = demo_paths("gpt2")
    target, draft = st.load_checkpoint(paths["target"]), st.load_checkpoint(paths["draft"], role="draft")
    vocab = BPEVocabulary(paths["target"])
    prompts = sorted((vocab.encode(e["prompt"])[-PROMPT:] for e in heldout_prompts()[:num_examples]),
                     key=len)
    examples = [{"inputs": p} for p in prompts]

    def batches(b):  # batches_of's padded rows, with each row's prompt length
        return [dict(input_ids=x, prompt_lengths=np.array([len(p) for p in prompts[i:i + b]], np.int32))
                for i, x in zip(range(0, len(prompts), b), batches_of(examples, b))]
    return target, draft, batches


def decode_all(target, batches, temperature, max_len, **kw):
    """A function that decodes every batch -> (tokens, target calls)."""
    def run():
        tokens = calls = 0
        for i, x in enumerate(batches):
            out = st.generate(target, **x, max_decode_len=max_len, temperature=temperature,
                              rng=jax.random.PRNGKey(i), **kw)
            tokens += int(out.lengths.sum())
            calls += int(out.stats["target_calls"].sum())
        return tokens, calls
    return run


def rank_rates(target, draft, batches, temperature, max_len, tree):
    """Acceptance rate by child rank over every batch's tree decode (`acceptance_rate_by_rank`)."""
    tried = accepted = 0
    for i, x in enumerate(batches):
        s = st.generate(target, **x, draft=draft, tree=tree, max_decode_len=max_len,
                        temperature=temperature, rng=jax.random.PRNGKey(i)).stats
        tried, accepted = tried + s["rank_tried"].sum(0), accepted + s["rank_accepted"].sum(0)
    return (accepted / tried.clip(1)).tolist()


def chosen(target, draft, batches, temperature, max_len):
    """The chooser's pick for these batches, its table printed."""
    rates = rank_rates(target, draft, batches, temperature, max_len, probe_shape(MENU))
    shape = batches[0]["input_ids"].shape
    c = choose(MENU, rates, *tree_costs(target, draft, MENU, *shape, max_len))
    print(f"chooser, batch {shape[0]}, T = {temperature:g}: rank rates "
          + ", ".join(f"{a:.2f}" for a in rates) + f"; pick {c.tree}", flush=True)
    print("| shape | nodes | expected tokens/call | cost (target steps) | predicted speedup |")
    for r in c.table:
        print(f"| {','.join(map(str, r['tree']))} | {r['nodes']} | {r['expected_tokens']:.2f} | "
              f"{r['cost']:.2f} | {r['speedup']:.2f}x |", flush=True)
    return c.tree


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=sorted(MAX_LEN), default="t5")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--trees", nargs="+", default=["2,2,1,1", "3,2,1,1", "4,2,2,1"])
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--choose", action="store_true")
    args = parser.parse_args()
    target, draft, make_batches = load(args.family, args.examples)
    max_len = MAX_LEN[args.family]
    trees = [tuple(int(k) for k in t.split(",")) for t in args.trees]
    print(f"{args.family} demo pair, {len(make_batches(1))} held-out inputs, max_decode_len {max_len}; "
          "tokens/call = tokens / target calls, summed over the rows; speedup = plain / that decode's "
          f"seconds (median of {args.repeats})", flush=True)
    for batch in args.batch:
        batches = make_batches(batch)
        for temperature in (0.0, 1.0):
            runs = {"plain": decode_all(target, batches, temperature, max_len),
                    "chain, gamma 4": decode_all(target, batches, temperature, max_len,
                                                 draft=draft, gamma=4)}
            nodes = {"chain, gamma 4": 4}
            pick = chosen(target, draft, batches, temperature, max_len) if args.choose else None
            for tree in trees + ([pick] if pick and pick not in trees else []):
                for kind in ("drawn", "top_k"):
                    name = f"tree {','.join(map(str, tree))}" + (", top-k" if kind == "top_k" else "")
                    runs[name] = decode_all(target, batches, temperature, max_len, draft=draft,
                                            tree=tree, tree_children=kind)
                    nodes[name] = TreeShape.of(tree).num_nodes - 1
            counts, seconds = timed_runs(runs, args.repeats)
            print("| batch | T | draft | nodes/call | tokens/call | vs chain | speedup |", flush=True)
            chain = counts["chain, gamma 4"][0] / counts["chain, gamma 4"][1]
            for name, (tokens, calls) in counts.items():
                if name != "plain":
                    print(f"| {batch} | {temperature:g} | {name} | {nodes[name]} | "
                          f"{tokens / calls:.2f} | {tokens / calls / chain:.2f}x | "
                          f"{seconds['plain'] / seconds[name]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
