"""Benchmark: tokens per target call of each draft kind on the shipped demo pair.

    python experiments/bench_drafts.py

32 held-out demo inputs, batch 8, gamma 4, max_decode_len 64, greedy and T = 1: the trained
draft model, `PromptLookup(max_ngram=3)` (no model) and a `Bigram` fitted on the training
split's target sentences (no model). Counts, not timings: no noise.
"""
import time

import jax

import speculative_t5 as st
from speculative_t5.experiments.cells import demo_examples
from speculative_t5.data.demo_corpus import build_corpus
target, draft, vocab = st.load_demo()
V = st.data.Vocabulary(vocab)
ex = sorted(demo_examples(num_examples=32, vocabulary=vocab), key=lambda e: len(e["inputs"]))
train = [V.encode(e["target"]) for e in build_corpus() if e["split"] == "train"]
bigram = st.drafts.Bigram.fit(train, target.config.vocab_size)
drafts = {"model (T5-small-like, 0.92M)": draft, "PromptLookup(3)": st.drafts.PromptLookup(max_ngram=3), "Bigram (fit on train targets)": bigram}
for T in (0.0, 1.0):
    for name, d in drafts.items():
        toks = calls = 0; t0 = time.time()
        for i in range(0, 32, 8):
            chunk = ex[i:i+8]; w = max(len(e["inputs"]) for e in chunk)
            x = st.data.pad_to([e["inputs"] for e in chunk], -(-w // 32) * 32)
            o = st.generate(target, x, draft=d, gamma=4, max_decode_len=64, temperature=T, rng=jax.random.PRNGKey(i))
            toks += int(o.lengths.sum()); calls += int(o.stats["target_calls"].sum())
        print(f"T={T} {name}: tokens/target call {toks/calls:.3f} ({len(train)} train seqs)", flush=True)
