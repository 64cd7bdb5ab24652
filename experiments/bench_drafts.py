"""Benchmark: tokens per target call, drafts proposed per call and walltime of each draft
kind on the shipped demo pair, each beside its eq. (5) prediction.

    python experiments/bench_drafts.py [--batch 1 8] [--gamma 4 8] [--draft_stop 0.5]

32 held-out demo inputs, max_decode_len 64, at each batch size and gamma, greedy and T = 1,
token-wise and (T = 1) block verification: the trained draft model (alone, with
adaptive_gamma, with --draft_stop), `PromptLookup(max_ngram=3)` (no model), a `Bigram` fitted
on the training split's target sentences (no model), and `Fallback(PromptLookup, model)`.
Tokens and calls are counts (no noise); speedup is plain / speculative seconds for the 32
inputs, the median of 3 runs after a compiling one, so it carries this machine's noise.
Eq. (5) beside: alpha = accepted / evaluated drafts of the decode itself, c and v measured
for this batch (`st.gamma_costs`, on the median-width batch: the loop's own costs),
tokens/call = (1 - alpha^(gamma+1)) / (1 - alpha), speedup = tokens/call / (gamma c + v).
"""
import argparse
import statistics
import time

import jax
import numpy as np

import speculative_t5 as st
from speculative_t5.data.demo_corpus import build_corpus
from speculative_t5.paper.cells import demo_examples
from speculative_t5.measure import analysis
from bench_common import batches_of

MAX_LEN = 64


def run(target, batches, temperature, **kw):
    """(tokens, target calls, drafts proposed, drafts accepted, drafts evaluated, median
    seconds over 3 timed runs)."""
    def once():
        tokens = calls = drafts = accepted = reached = 0
        for i, x in enumerate(batches):
            out = st.generate(target, x, max_decode_len=MAX_LEN, temperature=temperature,
                              rng=jax.random.PRNGKey(i), **kw)
            tokens += int(out.lengths.sum())
            calls += int(out.stats["target_calls"].sum())
            drafts += int(out.stats["draft_calls"].sum())
            accepted += int(np.sum(out.stats["accepted_at"])) if "accepted_at" in out.stats else 0
            reached += int(np.sum(out.stats["reached_at"])) if "reached_at" in out.stats else 0
        return tokens, calls, drafts, accepted, reached
    counts = once()                                                            # compiles
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - t0)
    return counts + (statistics.median(seconds),)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--gamma", type=int, nargs="+", default=[4])
    parser.add_argument("--draft_stop", type=float, default=None,
                        help="also the model with this draft_stop")
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=32, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    encode = st.data.Vocabulary(vocab).encode
    train = [encode(e["target"]) for e in build_corpus() if e["split"] == "train"]
    lookup = st.drafts.PromptLookup(max_ngram=3)
    kinds = {"model": dict(draft=draft),
             **({f"model, draft_stop {args.draft_stop}": dict(
                 draft=draft, draft_stop=args.draft_stop)} if args.draft_stop else {}),
             "model, adaptive_gamma": dict(draft=draft, adaptive_gamma=True),
             "PromptLookup(3)": dict(draft=lookup),
             "Bigram (training targets)": dict(draft=st.drafts.Bigram.fit(
                 train, target.config.vocab_size)),
             "Fallback(PromptLookup, model)": dict(draft=st.drafts.Fallback(lookup, draft))}
    print(f"demo pair, {len(examples)} held-out inputs; tokens/call measured (eq. 1 from "
          "alpha), drafts/call, speedup = plain / speculative seconds (eq. 5)", flush=True)
    print("| batch | gamma | T | verification | draft | alpha | tokens/call | eq. (1) | "
          "drafts/call | speedup | eq. (5) |", flush=True)
    for batch in args.batch:
        batches = batches_of(examples, batch)
        middle = batches[len(batches) // 2]
        for temperature in (0.0, 1.0):
            plain = run(target, batches, temperature)
            print(f"batch {batch} T={temperature:g} plain: {plain[0]} tokens in "
                  f"{plain[-1]:.2f} s", flush=True)
            for gamma in args.gamma:
                for verification in ("token", "block") if temperature else ("token",):
                    for name, kw in kinds.items():
                        if verification == "block" and not name.startswith(("model", "Fall")):
                            continue  # block verification of the model and fallback drafts
                        tokens, calls, drafts, acc, reached, seconds = run(
                            target, batches, temperature, gamma=gamma,
                            verification=verification, **kw)
                        a = analysis.alpha_from_acceptance(acc, reached)
                        c, v, _ = st.gamma_costs(target, kw["draft"], middle, gamma, MAX_LEN,
                                                 st.SamplingConfig(temperature=temperature))
                        print(f"| {batch} | {gamma} | {temperature:g} | {verification} | "
                              f"{name} | {a:.3f} | {tokens / calls:.2f} | "
                              f"{analysis.expected_tokens_per_call(a, gamma):.2f} | "
                              f"{drafts / calls:.2f} | {plain[-1] / seconds:.2f}x | "
                              f"{analysis.walltime_improvement(a, gamma, c, v):.2f}x |",
                              flush=True)


if __name__ == "__main__":
    main()
