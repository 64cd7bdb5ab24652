"""Benchmark: where a decode's time goes beyond the model steps eq. (5) counts, on the
shipped demo pair, batch 1: the per-input fixed cost (encoder, cross-attention K/V, cache
set-up, dispatch) and the loops' own per-iteration work (sampling, accept test, emit).

    python experiments/bench_overheads.py [--repeats 20]

EOS is switched off so every decode runs exactly max_decode_len tokens; the cost per token
(plain) and per round (speculative, gamma 4) is the slope between two lengths, the fixed
cost the intercept; beside them the model steps alone, timed inside a compiled loop.
Medians of interleaved repetitions, compile excluded.
"""
from __future__ import annotations

import argparse
import dataclasses


import speculative_t5 as st
from speculative_t5.data import bucket
from speculative_t5.model.api import init_cache
from speculative_t5.timing import interleaved_medians, step_times


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--gamma", type=int, default=4)
    args = p.parse_args()
    target, draft, _ = st.load_demo()
    target, draft = (st.Model(dataclasses.replace(m.config, eos_id=-1), m.params) for m in (target, draft))
    x = bucket(list(range(5, 30)) + [1])                                       # [1, 32]
    g, short, long = args.gamma, 2 * (args.gamma + 1), 6 * (args.gamma + 1)
    fns = {"encode target": lambda: init_cache(target, x, long + g + 1),
           "encode draft": lambda: init_cache(draft, x, long + g + 1)}
    for n in (short, long):
        fns[f"plain {n}"] = lambda n=n: st.generate(target, x, max_decode_len=n)
        fns[f"spec {n}"] = lambda n=n: st.generate(target, x, draft=draft, gamma=g, max_decode_len=n)
    med = {k: 1e3 * v for k, v in interleaved_medians(fns, args.repeats, warmup=2).items()}
    steps = {k: 1e3 * v for k, v in step_times({"target_1": (target, 1), "draft_1": (draft, 1),
                                                 "target_g": (target, g + 1)}, 1, 32, long + g + 1,
                                                long // 2, args.repeats).items()}
    rounds = {n: int(st.generate(target, x, draft=draft, gamma=g, max_decode_len=n).stats["target_calls"][0])
              for n in (short, long)}
    per_token = (med[f"plain {long}"] - med[f"plain {short}"]) / (long - short)
    per_round = (med[f"spec {long}"] - med[f"spec {short}"]) / (rounds[long] - rounds[short])
    model_round = steps["target_g"] + g * steps["draft_1"]
    print(f"demo pair, batch 1, input 32 tokens, gamma {g}, EOS off, medians of {args.repeats} (ms)")
    print(f"encoder + cross K/V + cache set-up: target {med['encode target']:.2f}, draft {med['encode draft']:.2f}")
    print(f"plain: fixed {med[f'plain {short}'] - short * per_token:.2f}, per token {per_token:.2f} "
          f"(target step alone {steps['target_1']:.2f}: loop work {per_token - steps['target_1']:.2f})")
    print(f"spec:  fixed {med[f'spec {short}'] - rounds[short] * per_round:.2f}, per round {per_round:.2f} "
          f"(model steps alone {model_round:.2f} = verify {steps['target_g']:.2f} + {g} x draft "
          f"{steps['draft_1']:.2f}: loop work {per_round - model_round:.2f})")
    print("raw medians:", {k: round(v, 2) for k, v in med.items()}, "rounds:", rounds)


if __name__ == "__main__":
    main()
