"""Benchmark against the peer users would pick instead: Hugging Face transformers'
`generate(..., assistant_model=draft)` (assisted generation) and plain `generate`, on the
shipped demo pair exported to Hugging Face format, beside ours (plain and speculative).

    python experiments/bench_hf.py [--num_examples 16] [--gamma 4] [--max_new_tokens 32]
    python experiments/bench_hf.py --long     # inputs of 200-256 tokens, 48 new tokens

CPU, greedy, same inputs, same maximum length. HF assisted generation runs only at batch
1; ours runs at batch 1 and batch 8. HF's draft uses a constant gamma
(num_assistant_tokens_schedule='constant') and no confidence threshold, as ours does.
Greedy tokens are compared example by example. Times are medians over `--repeats`
interleaved passes over all examples, compile (ours) and first-call warm-up (theirs)
excluded. Needs the test extras (torch, transformers).

transformers 5.24 sizes its default decoder cache by the encoder's layer count, which fails
(IndexError in cache update) for T5s whose decoder is deeper than the encoder, as the demo
target's is (2 encoder, 5 decoder layers; the bug class of transformers PR #40277). We pass
a fresh lazily-grown EncoderDecoderCache(DynamicCache(), DynamicCache()) to every call.
"""
from __future__ import annotations

import json
import os
import platform

import numpy as np
import torch
from transformers import T5ForConditionalGeneration
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

import speculative_t5 as st
from bench_common import peer_parser, timed_runs
from speculative_t5.data import Vocabulary, pad_rows, tokenize
from speculative_t5.data.demo_corpus import build_corpus
from speculative_t5.checkpoints.demo import DEMO_DIR, DEMO_INPUT_LENGTH, DEMO_TASK


def _trim(ids: np.ndarray) -> np.ndarray:
    n = int((ids != 0).sum())
    return ids[:n]


def main():
    p = peer_parser(__doc__)
    p.add_argument("--num_examples", type=int, default=16)
    p.add_argument("--input_len", type=int, default=DEMO_INPUT_LENGTH)
    p.add_argument("--min_input_tokens", type=int, default=0,
                   help="only held-out inputs at least this long (before truncation)")
    p.add_argument("--long", action="store_true",
                   help="the long-input case: --min_input_tokens 200 --input_len 256 --max_new_tokens 48")
    p.add_argument("--json")
    args = p.parse_args()
    if args.long:
        args.min_input_tokens, args.input_len, args.max_new_tokens = 200, 256, 48
    torch.set_num_threads(args.threads)

    target_dir, draft_dir = os.path.join(DEMO_DIR, "target"), os.path.join(DEMO_DIR, "draft")
    vocab = Vocabulary(os.path.join(target_dir, "spiece.model"))
    test = [e for e in build_corpus(task=DEMO_TASK) if e["split"] == "test"
            and len(vocab.encode(e["input"])) >= args.min_input_tokens][:args.num_examples]
    x = tokenize([e["input"] for e in test], vocab, args.input_len)
    n, L, g = len(x), args.max_new_tokens, args.gamma

    ours_t, ours_d = st.load_checkpoint(target_dir), st.load_checkpoint(draft_dir)
    hf_t = T5ForConditionalGeneration.from_pretrained(target_dir, dtype=torch.float32).eval()
    hf_d = T5ForConditionalGeneration.from_pretrained(draft_dir, dtype=torch.float32).eval()
    hf_d.generation_config.num_assistant_tokens = g
    hf_d.generation_config.num_assistant_tokens_schedule = "constant"
    hf_d.generation_config.assistant_confidence_threshold = 0.0

    def hf_run(assist: bool):
        outs = []
        with torch.no_grad():
            for row in x:
                ids = torch.tensor(_trim(row)[None], dtype=torch.long)
                kw = dict(assistant_model=hf_d) if assist else {}
                out = hf_t.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=L,
                                    do_sample=False, num_beams=1, past_key_values=EncoderDecoderCache(
                                        DynamicCache(), DynamicCache()), **kw)
                outs.append(out[0, 1:].numpy())  # drop the decoder start token
        return outs

    def ours_run(draft, batch):
        outs = []
        for i in range(0, n, batch):
            chunk = x[i:i + batch]
            res = st.generate(ours_t, pad_rows(chunk, batch), draft=draft, gamma=g, max_decode_len=L)
            outs += [res.tokens[j, :res.lengths[j]] for j in range(len(chunk))]
        return outs

    runs = {"HF plain (b1)": lambda: hf_run(False), "HF assisted (b1)": lambda: hf_run(True),
            "ours plain (b1)": lambda: ours_run(None, 1), "ours spec (b1)": lambda: ours_run(ours_d, 1),
            "ours plain (b8)": lambda: ours_run(None, 8), "ours spec (b8)": lambda: ours_run(ours_d, 8)}
    outputs, med = timed_runs(runs, args.repeats)
    ref = outputs["ours plain (b1)"]
    tokens = sum(len(o) for o in ref)
    same = {k: sum(np.array_equal(a, b) for a, b in zip(o, ref)) for k, o in outputs.items()}
    print(f"demo pair ({ours_t.num_params() / 1e6:.1f}M target, {ours_d.num_params() / 1e6:.2f}M draft), "
          f"{n} held-out inputs ({int((x != 0).sum(1).mean())} tokens on average), greedy, gamma {g}, max {L} new tokens, CPU ({os.cpu_count()} cores, "
          f"{platform.machine()}), torch threads {args.threads}, medians of {args.repeats}")
    print(f"{'decoder':<18} {'tok/s':>8} {'vs HF assisted':>15} {'vs HF plain':>12} {'same tokens as ours':>20}")
    rows = []
    for k in runs:
        tps = tokens / med[k]
        row = dict(decoder=k, tokens_per_s=tps, vs_hf_assisted=med["HF assisted (b1)"] / med[k],
                   vs_hf_plain=med["HF plain (b1)"] / med[k], identical=f"{same[k]}/{n}")
        rows.append(row)
        print(f"{k:<18} {tps:>8.1f} {row['vs_hf_assisted']:>15.2f} {row['vs_hf_plain']:>12.2f} "
              f"{row['identical']:>20}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(args), rows=rows, tokens=tokens), f, indent=2)


if __name__ == "__main__":
    main()
