"""Benchmark: a decoder step's time against the length of the cache it attends over.

    python experiments/bench_cache_length.py [--batches 1,8,32] [--lengths 37,48,64,69,80]

The shipped demo pair: the target's one-token step and its 5-token verify pass (gamma 4),
and the draft's one-token step, each as 16 steps in one compiled loop (`step_timer`, input
width 64, steps at position 20), timed in turn, medians of 9 rounds. `generate` gives a
decode max_decode_len positions rounded up to a multiple of 16 (`cache_positions`), since
odd lengths ran slower here; until 2026-12-02 a speculative decode's held max_decode_len +
gamma + 1 (69 for the demo's 64 + 4 + 1, rounded to 80). Prints milliseconds per step.
"""
import argparse

import speculative_t5 as st
from speculative_t5.calibration import interleaved_medians, step_timer

STEPS = 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--lengths", default="37,48,64,69,80")
    args = parser.parse_args()
    target, draft, _ = st.load_demo()
    lengths = [int(n) for n in args.lengths.split(",")]
    print("| batch | cache length | target, 1 token (ms) | target, 5 tokens (ms) | draft, 1 token (ms) |")
    print("|---|---|---|---|---|")
    for B in (int(b) for b in args.batches.split(",")):
        fns = {}
        for L in lengths:
            fns[f"t1 {L}"] = step_timer(target, B, 1, 64, L, 20, STEPS)
            fns[f"t5 {L}"] = step_timer(target, B, 5, 64, L, 20, STEPS)
            fns[f"d1 {L}"] = step_timer(draft, B, 1, 64, L, 20, STEPS)
        ms = {k: 1e3 * t / STEPS for k, t in interleaved_medians(fns, rounds=9, warmup=1).items()}
        for L in lengths:
            print(f"| {B} | {L} | {ms[f't1 {L}']:.3f} | {ms[f't5 {L}']:.3f} | "
                  f"{ms[f'd1 {L}']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
