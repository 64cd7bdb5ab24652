"""Benchmark: plain vs exact speculative beam search (`st.beam_search(..., draft=)`) on the
shipped demo pair, and optionally transformers' beam search on the same weights.

    python experiments/bench_beam.py [--num_examples 32] [--batch 1] [--gamma 2,3,4]
        [--paths 8] [--beam_size 4] [--alpha 0.6] [--max_decode_len 64] [--hf]

The demo's held-out inputs (as `bench_drafts.py`), beam_size 4, alpha 0.6, batches of
--batch rows. For plain and for each gamma (x each --paths: draft path rows per input,
default 4 * beam_size): beam steps per target call, target calls (the batch's forward
passes, summed over batches), walltime per input (the median of --repeats interleaved passes
over all inputs after a compiling one, divided by the inputs), plain / speculative walltime,
and how many inputs got the same best beam / the same beams (tokens) as plain beam search;
the largest score difference (float rounding: the target scores gamma + 1 tokens a call).
Ratios are from one run on this machine.

--hf also times Hugging Face `generate(num_beams=beam_size, length_penalty=alpha)` on the
target exported with `st.export_hf` (torch, transformers: the test extras). Its length
penalty is not T5X's: HF divides a finished beam's log-prob by length ** length_penalty, T5X
by ((5 + length) / 6) ** alpha, and its stopping rule differs, so its beams may differ:
walltime only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import warnings

import numpy as np

import speculative_t5 as st
from bench_common import batches_of, timed_runs
from speculative_t5.paper.cells import demo_examples


def ints(text: str):
    return [int(v) for v in text.split(",") if v]


def ours(target, draft, batches, n, args, **kw):
    """A run over every batch -> (beams per input [W, L] arrays, scores, stats)."""
    def fn():
        beams, scores, calls, steps, row_calls = [], [], 0, 0, 0
        for x in batches:
            out = st.beam_search(target, st.data.pad_rows(x, args.batch), draft=draft,
                                 beam_size=args.beam_size, alpha=args.alpha,
                                 max_decode_len=args.max_decode_len, **kw)
            rows = len(x)
            s = out.stats
            for r in range(rows):
                beams.append([out.tokens[r, k, :out.lengths[r, k]] for k in range(args.beam_size)])
                scores.append(out.scores[r])
            calls += int(np.max(s["rounds"] if "rounds" in s else s["target_calls"]))
            steps += int(np.sum(s["beam_steps"][:rows]))
            row_calls += int(np.sum(s["target_calls"][:rows]))
        return beams[:n], np.asarray(scores[:n]), dict(calls=calls, steps_per_call=steps / row_calls)
    return fn


def hf_runner(target, batches, args):
    import torch
    from transformers import T5ForConditionalGeneration
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    torch.set_num_threads(args.threads)
    directory = tempfile.mkdtemp(prefix="bench_beam_hf_")
    st.export_hf(target, directory)
    model = T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    warnings.filterwarnings("ignore", ".*past_key_values.*", FutureWarning)  # as bench_hf.py

    def fn():
        with torch.no_grad():
            for x in batches:
                x = x[:, :max(int((x != 0).sum(1).max()), 1)]
                ids = torch.tensor(x, dtype=torch.long)
                # a fresh lazily-grown cache a call (the deeper-decoder bug, see bench_hf.py)
                model.generate(ids, attention_mask=(ids != 0).long(),
                               max_new_tokens=args.max_decode_len, do_sample=False,
                               num_beams=args.beam_size, length_penalty=args.alpha,
                               past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()))
        return None
    return fn


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num_examples", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--gamma", type=ints, default=[2, 3, 4], help="comma-separated, e.g. 2,3,4")
    p.add_argument("--paths", type=ints, default=[], help="draft path rows per input, "
                   "comma-separated (>= beam_size; default 4 * beam_size)")
    p.add_argument("--beam_size", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--max_decode_len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions (medians)")
    p.add_argument("--hf", action="store_true", help="also transformers' generate(num_beams=)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch's threads (--hf)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    target, draft, vocab = st.load_demo()
    examples = demo_examples(num_examples=args.num_examples, vocabulary=vocab)
    n = len(examples)
    batches = batches_of(examples, args.batch)
    runs = {"plain": ours(target, None, batches, n, args)}
    for g in args.gamma:
        for paths in args.paths or [None]:
            name = f"speculative gamma {g}" + (f" paths {paths}" if paths else "")
            runs[name] = ours(target, draft, batches, n, args, gamma=g, paths=paths)
    if args.hf:
        runs["HF generate"] = hf_runner(target, batches, args)
    results, seconds = timed_runs(runs, args.repeats)
    ref_beams, ref_scores, _ = results["plain"]
    print(f"demo pair ({target.num_params() / 1e6:.1f}M target, {draft.num_params() / 1e6:.2f}M "
          f"draft), {n} held-out inputs, beam {args.beam_size}, alpha {args.alpha}, batch "
          f"{args.batch}, max_decode_len {args.max_decode_len}, medians of {args.repeats}, "
          f"{jax_device()} ({platform.machine()}, {os.cpu_count()} cores)")
    print("| decoder | beam steps / target call | target calls | ms / input | speedup | "
          "same best beam | same beams | max score diff |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for k in runs:
        row = dict(decoder=k, ms_per_input=1e3 * seconds[k] / n,
                   speedup=seconds["plain"] / seconds[k])
        if results[k] is not None:
            beams, scores, stats = results[k]
            row.update(stats, same_best=sum(np.array_equal(a[0], b[0])
                                            for a, b in zip(beams, ref_beams)),
                       same_beams=sum(all(np.array_equal(x, y) for x, y in zip(a, b))
                                      for a, b in zip(beams, ref_beams)),
                       max_score_diff=float(np.max(np.abs(scores - ref_scores))))
            print(f"| {k} | {row['steps_per_call']:.2f} | {row['calls']} | "
                  f"{row['ms_per_input']:.1f} | {row['speedup']:.2f}x | {row['same_best']}/{n} | "
                  f"{row['same_beams']}/{n} | {row['max_score_diff']:.1e} |", flush=True)
        else:
            print(f"| {k} (b{args.batch}, torch threads {args.threads}) | | | "
                  f"{row['ms_per_input']:.1f} | {row['speedup']:.2f}x | | | |")
        rows.append(row)
    if args.hf:
        print("HF's length_penalty divides a beam's log-prob by length ** alpha, T5X's by "
              "((5 + length) / 6) ** alpha, and it stops differently: its beams are not "
              "compared, walltime only.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(args), rows=rows, inputs=n), f, indent=2)


def jax_device() -> str:
    import jax
    return jax.devices()[0].device_kind


if __name__ == "__main__":
    main()
