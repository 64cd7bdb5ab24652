"""Benchmark: plain vs speculative greedy decoding, tokens/s and their ratio, from one run.

    python experiments/bench_generate.py [--target t5_1_1_base] [--draft t5_1_1_small]
        [--gamma 4] [--batches 1,8] [--max_decode_len 32] [--repeats 3]

Random weights on CPU, float32. EOS is disabled so every row decodes max_decode_len tokens
(random models would otherwise stop at arbitrary points). Two drafts are run: the `--draft`
preset (random, unrelated to the target: acceptance near 0, the floor) and the target
itself (every draft accepted: gamma+1 tokens per target call, the ceiling). Reported per
setting: tokens/s plain and speculative and their ratio, target calls per token, alpha
estimated from the acceptance statistics, c (draft step / target step, measured), v
(target pass over gamma+1 tokens / one-token pass, measured), and eq. (5)'s prediction
with measured v and as the paper writes it (v = 1).
Timing: compile excluded (a warm-up call first), median of `--repeats` interleaved runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform

import jax
import numpy as np

import speculative_t5 as st
from speculative_t5.measure import analysis
from speculative_t5.calibration import interleaved_medians, step_times


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="t5_1_1_base")
    p.add_argument("--draft", default="t5_1_1_small")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--input_len", type=int, default=32)
    p.add_argument("--max_decode_len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step_rounds", type=int, default=15)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    no_eos = dict(eos_id=-1)  # never emitted: every row decodes max_decode_len tokens
    target = st.init_model(st.T5Config.preset(args.target, **no_eos), seed=0)
    drafts = {args.draft: st.init_model(st.T5Config.preset(args.draft, **no_eos), seed=1),
              "target itself": target}
    g = args.gamma

    # c and v from decoder-step timings (batch 1 and each batch size)
    rows = []
    print(f"{args.target} target, gamma {g}, {args.max_decode_len} tokens per row, random "
          f"weights, {jax.devices()[0].platform} ({os.cpu_count()} cores, "
          f"{platform.machine()}), medians of {args.repeats} interleaved runs, compile excluded")
    header = (f"{'batch':>5} {'draft':>14} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} "
              f"{'calls/tok':>9} {'alpha':>5} {'c':>5} {'v':>5} {'pred(v)':>7} {'pred(v=1)':>9}")
    print(header)
    for batch in [int(b) for b in args.batches.split(",")]:
        rng = np.random.RandomState(batch)
        x = rng.randint(2, target.config.vocab_size, (batch, args.input_len)).astype(np.int32)
        step_t = step_times({"target_1": (target, 1), "target_g": (target, g + 1),
                             **{name: (d, 1) for name, d in drafts.items()}},
                            batch, rounds=args.step_rounds)
        runs = {"plain": lambda: st.generate(target, x, max_decode_len=args.max_decode_len)}
        for name, d in drafts.items():
            runs[name] = (lambda d=d: st.generate(target, x, draft=d, gamma=g,
                                                  max_decode_len=args.max_decode_len))
        outs = {k: fn() for k, fn in runs.items()}  # also the warm-up (compile) call
        wall = interleaved_medians(runs, args.repeats, warmup=0)
        tokens = int(outs["plain"].lengths.sum())
        v = step_t["target_g"] / step_t["target_1"]
        for name in drafts:
            out = outs[name]
            s = out.stats
            assert (out.tokens == outs["plain"].tokens).all(), "greedy outputs differ"
            alpha = analysis.alpha_from_acceptance(s["accepted_at"].sum(), s["reached_at"].sum())
            c = step_t[name] / step_t["target_1"]
            pred = analysis.predictions(alpha, g, c, v)
            row = dict(batch=batch, draft=name, plain_tokens_per_s=tokens / wall["plain"],
                       spec_tokens_per_s=tokens / wall[name], speedup=wall["plain"] / wall[name],
                       target_calls_per_token=float(s["target_calls"].sum()) / tokens,
                       alpha=alpha, c=c, v=v, **pred)
            rows.append(row)
            print(f"{batch:>5} {name:>14} {row['plain_tokens_per_s']:>11.1f} "
                  f"{row['spec_tokens_per_s']:>10.1f} {row['speedup']:>7.2f} "
                  f"{row['target_calls_per_token']:>9.3f} {alpha:>5.2f} {c:>5.2f} {v:>5.2f} "
                  f"{row['speedup_predicted']:>7.2f} {row['speedup_predicted_paper']:>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(args), rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
