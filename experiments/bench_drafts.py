"""Benchmark: tokens per target call, drafts proposed per call and walltime of each draft
kind on the shipped demo pair.

    python experiments/bench_drafts.py [--draft_stop 0.5]

32 held-out demo inputs, batch 8, gamma 4, max_decode_len 64, greedy and T = 1, token-wise
and block verification: the trained draft model (alone, with draft_stop),
`PromptLookup(max_ngram=3)` (no model), a `Bigram` fitted on the training split's target
sentences (no model), and `Fallback(PromptLookup, model)` (alone, with draft_stop).
Tokens and calls are counts (no noise); speedup is plain / speculative seconds for the 32
inputs, the median of 3 runs after a compiling one, so it carries this machine's noise.
"""
import argparse
import statistics
import time

import jax

import speculative_t5 as st
from speculative_t5.data.demo_corpus import build_corpus
from speculative_t5.experiments.cells import demo_examples

BATCH, GAMMA, MAX_LEN = 8, 4, 64


def run(target, batches, temperature, **kw):
    """(tokens, target calls, drafts proposed, median seconds over 3 timed runs)."""
    def once():
        tokens = calls = drafts = 0
        for i, x in enumerate(batches):
            out = st.generate(target, x, max_decode_len=MAX_LEN, temperature=temperature,
                              rng=jax.random.PRNGKey(i), **kw)
            tokens += int(out.lengths.sum())
            calls += int(out.stats["target_calls"].sum())
            drafts += int(out.stats["draft_calls"].sum())
        return tokens, calls, drafts
    counts = once()                                                            # compiles
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - t0)
    return counts + (statistics.median(seconds),)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--draft_stop", type=float, default=0.5)
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=32, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    batches = []
    for i in range(0, len(examples), BATCH):
        chunk = examples[i:i + BATCH]
        width = -(-max(len(e["inputs"]) for e in chunk) // 32) * 32
        batches.append(st.data.pad_to([e["inputs"] for e in chunk], width))  # [8, W]
    encode = st.data.Vocabulary(vocab).encode
    train = [encode(e["target"]) for e in build_corpus() if e["split"] == "train"]
    lookup = st.drafts.PromptLookup(max_ngram=3)
    stop = dict(draft_stop=args.draft_stop)
    kinds = {"model": dict(draft=draft),
             f"model, draft_stop {args.draft_stop}": dict(draft=draft, **stop),
             "PromptLookup(3)": dict(draft=lookup),
             "Bigram (training targets)": dict(draft=st.drafts.Bigram.fit(
                 train, target.config.vocab_size)),
             "Fallback(PromptLookup, model)": dict(draft=st.drafts.Fallback(lookup, draft)),
             f"Fallback(PromptLookup, model), draft_stop {args.draft_stop}":
                 dict(draft=st.drafts.Fallback(lookup, draft), **stop)}
    print(f"demo pair, {len(examples)} held-out inputs, batch {BATCH}, gamma {GAMMA}; "
          "tokens/call, drafts/call, speedup = plain / speculative seconds", flush=True)
    for temperature in (0.0, 1.0):
        plain = run(target, batches, temperature)
        print(f"T={temperature:g} plain: {plain[0]} tokens in {plain[3]:.2f} s", flush=True)
        for verification in ("token", "block") if temperature else ("token",):
            for name, kw in kinds.items():
                tokens, calls, drafts, seconds = run(target, batches, temperature, gamma=GAMMA,
                                                     verification=verification, **kw)
                print(f"| T={temperature:g} | {verification} | {name} | {tokens / calls:.3f} | "
                      f"{drafts / calls:.2f} | {plain[3] / seconds:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
