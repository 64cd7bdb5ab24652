"""Benchmark: tokens per target call of each draft kind on the shipped demo pair.

    python experiments/bench_drafts.py

32 held-out demo inputs, batch 8, gamma 4, max_decode_len 64, greedy and T = 1: the trained
draft model, `PromptLookup(max_ngram=3)` (no model) and a `Bigram` fitted on the training
split's target sentences (no model). Counts, not timings: no noise.
"""
import jax

import speculative_t5 as st
from speculative_t5.data.demo_corpus import build_corpus
from speculative_t5.experiments.cells import demo_examples


def main():
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=32, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    encode = st.data.Vocabulary(vocab).encode
    train = [encode(e["target"]) for e in build_corpus() if e["split"] == "train"]
    drafts = {"the trained draft model (0.92M)": draft,
              "PromptLookup(max_ngram=3)": st.drafts.PromptLookup(max_ngram=3),
              f"Bigram fitted on {len(train)} training targets":
                  st.drafts.Bigram.fit(train, target.config.vocab_size)}
    for temperature in (0.0, 1.0):
        for name, d in drafts.items():
            tokens = calls = 0
            for i in range(0, len(examples), 8):
                chunk = examples[i:i + 8]
                width = -(-max(len(e["inputs"]) for e in chunk) // 32) * 32
                x = st.data.pad_to([e["inputs"] for e in chunk], width)          # [8, W]
                out = st.generate(target, x, draft=d, gamma=4, max_decode_len=64,
                                  temperature=temperature, rng=jax.random.PRNGKey(i))
                tokens += int(out.lengths.sum())
                calls += int(out.stats["target_calls"].sum())
            print(f"T={temperature:g}  {name}: {tokens / calls:.3f} tokens per target call",
                  flush=True)


if __name__ == "__main__":
    main()
