"""Does `st.gamma_costs` overprice long rounds by charging each decode's set-up to them?

    python experiments/gamma_costs_slope.py [--input 20] [--rounds 7]

`gamma_costs` prices a round as a timed decode's seconds over its rounds, set-up included
(the encoder, the caches, the host round trip), so a gamma-8 decode of 8 rounds carries its
set-up over 8 rounds where plain decoding spreads it over 64. Here one held-out input of the
demo pair (batch 1, greedy, every row run to max_decode_len) is decoded plainly and at gamma
1, 3 and 8 to 16 and to 64 tokens (medians of `--rounds` interleaved runs), and a round is
priced in plain steps both ways: total / rounds at 64 tokens, and the slope between the two
lengths (the marginal round, what a choice between round sizes trades).

2026-12-04, nothing else running, `--input 20`: gamma 1 1.39 vs 1.30, gamma 3 1.84 vs 1.59,
gamma 8 3.14 vs 2.75 plain steps; a plain step 1.55 ms (slope 1.47 ms), set-up ~5.0 ms (about
3.4 plain steps): the total-over-rounds price is 7-16% dear, more so the longer the round (a
one-off version minutes earlier: 4-13%). Acted on: `gamma_costs` now prices a round by
the slope between decodes to max_decode_len // 4 and max_decode_len, as here.
"""
import argparse

import numpy as np

import speculative_t5 as st
from speculative_t5.experiments.cells import demo_examples
from speculative_t5.measure.timing import interleaved_medians
from bench_drafts import batches_of  # the inputs batched as the benchmarks batch them

LENGTHS, GAMMAS = (16, 64), (1, 3, 8)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", type=int, default=20, help="which held-out input (by length)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=64, vocabulary=vocab), key=lambda e: len(e["inputs"]))
    ids = batches_of(examples[args.input:args.input + 1], 1)[0]                   # [1, W]
    outs = {}

    def decode(name, length, **kw):
        def go():
            outs[name] = st.generate(target, ids, max_decode_len=length, ignore_eos=True,
                                     temperature=0.0, **kw)
            return outs[name].tokens
        return go
    runs = {}
    for n in LENGTHS:
        runs[f"plain {n}"] = decode(f"plain {n}", n)
        runs.update({f"gamma {g} {n}": decode(f"gamma {g} {n}", n, draft=draft, gamma=g)
                     for g in GAMMAS})
    seconds = interleaved_medians(runs, args.rounds)
    calls = {k: int(np.asarray(outs[k].stats["target_calls"]).max()) for k in runs}
    short, long = LENGTHS

    def per_round(name):
        """(seconds a round: total / rounds at the longer length, the slope between both)"""
        a, b = f"{name} {short}", f"{name} {long}"
        return seconds[b] / calls[b], (seconds[b] - seconds[a]) / (calls[b] - calls[a])
    plain_total, plain_slope = per_round("plain")
    for g in GAMMAS:
        total, slope = per_round(f"gamma {g}")
        print(f"gamma {g}: a round in plain steps, total / rounds {total / plain_total:.2f}, "
              f"slope {slope / plain_slope:.2f} (rounds {calls[f'gamma {g} {short}']}, "
              f"{calls[f'gamma {g} {long}']})")
    print(f"plain step {plain_total * 1e3:.2f} ms (total / steps), {plain_slope * 1e3:.2f} ms "
          f"(slope); set-up ~{(seconds[f'plain {long}'] - long * plain_slope) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
