"""Benchmark: where a decode's time goes, on the shipped demo pair, batch 1 — the cost
model's parts (`speculative_t5.measure.costs`: per-input set-up of each model, target step
T, verify pass v T, draft step c T, two-token draft call), and whole decodes measured beside
the model's prediction, for short and long inputs.

    python experiments/bench_overheads.py [--repeats 20] [--gamma 4] [--widths 32 256]

EOS is switched off so every decode runs exactly its length: plain decodes of 2 and 6
rounds' worth of tokens, speculative decodes of the same lengths. What the parts do not
explain (measured - predicted) is printed per token (plain) and per round (speculative):
the loops' own work (sampling, accept test, emit) and dispatch; the longer decode less the
shorter gives the marginal plain step and round, beside their parts. Each decode is also timed
from a cold cache (a 400 MB buffer written just before it): the parts are timed warm, and
what a decode pays more from a cold start shows there. A round's model steps timed as one
compiled loop of rounds (both models in turn, R_gamma) are printed beside v T + gamma c T.
Medians of interleaved repetitions,
compile excluded; the machine is shared, so compare ratios.
"""
from __future__ import annotations

import argparse
import dataclasses

import speculative_t5 as st
from speculative_t5.data import bucket
from speculative_t5.measure.costs import measure_costs
from speculative_t5.calibration import interleaved_medians


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--widths", type=int, nargs="+", default=[32, 256])
    args = p.parse_args()
    target, draft, _ = st.load_demo()
    target, draft = (st.Model(dataclasses.replace(m.config, eos_id=m.config.vocab_size - 1), m.params) for m in (target, draft))
    g = args.gamma
    lengths = (2 * (g + 1), 6 * (g + 1))
    cache_len = lengths[1] + g + 1
    print(f"demo pair, batch 1, gamma {g}, EOS off, medians of {args.repeats} (ms)")
    for w in args.widths:
        x = bucket(list(range(5, 5 + w - 1)) + [1], smallest=w)                # [1, w]
        costs = measure_costs(target, draft, [g], [w], w, cache_len, args.repeats)
        s = costs.setup[w]
        print(f"\ninput width {w}: loop work per plain step {1e3 * costs.plain_loop:.3f}, per round {1e3 * costs.round_loop[g]:.3f}; set-up target {1e3 * s['target']:.2f}, draft {1e3 * s['draft']:.2f}; "
              f"T {1e3 * costs.target_step:.2f}, v {costs.v(g):.2f}, c {costs.c:.3f}, "
              f"two-token draft call {1e3 * costs.draft_two:.2f}")
        composed = costs.model_round[g]  # R_gamma, `timing.round_timer`
        print(f"  a round's model steps in one compiled loop of rounds (gamma draft steps, then the "
              f"verify pass), a part of the cost model: {1e3 * composed:.3f} against v T + gamma c T "
              f"{1e3 * (composed - costs.interleave(g)):.3f} ({1e3 * costs.interleave(g):+.3f})")
        fns, outs = {"one": lambda: st.generate(target, x, max_decode_len=1)}, {}
        for n in lengths:
            fns[("plain", n)] = lambda n=n: st.generate(target, x, max_decode_len=n)
            fns[("spec", n)] = lambda n=n: st.generate(target, x, draft=draft, gamma=g, max_decode_len=n)
            outs[("plain", n)], outs[("spec", n)] = fns[("plain", n)]().row(0), fns[("spec", n)]().row(0)
        med = interleaved_medians(fns, args.repeats, warmup=1)
        cold = _after_flush(fns, args.repeats)
        print(f"  a 1-token plain decode (st.generate's own Python and dispatch, at most, beyond "
              f"its parts): {1e3 * med['one']:.2f} against its parts {1e3 * costs.plain_seconds(w, 1):.2f} "
              f"({1e3 * (med['one'] - costs.plain_seconds(w, 1)):+.2f})")
        for n in lengths:
            plain, spec = outs[("plain", n)], outs[("spec", n)]
            pp = costs.plain_seconds(w, plain["target_calls"])
            ps = costs.speculative_seconds(w, g, spec["target_calls"], spec["two_token_draft_calls"])
            mp, ms = med[("plain", n)], med[("spec", n)]
            print(f"  {n} tokens: plain {1e3 * mp:.2f} (predicted {1e3 * pp:.2f}, measured/predicted "
                  f"{mp / pp:.3f}, {1e3 * (mp - pp) / plain['target_calls']:+.3f} per token); "
                  f"spec {1e3 * ms:.2f} in {spec['target_calls']} rounds (predicted {1e3 * ps:.2f}, "
                  f"{ms / ps:.3f}, {1e3 * (ms - ps) / spec['target_calls']:+.3f} per round); "
                  f"speedup {mp / ms:.2f} vs predicted {pp / ps:.2f}")
            print(f"    from a cold cache (after writing {FLUSH_MB} MB): plain {1e3 * cold[('plain', n)]:.2f} "
                  f"({1e3 * (cold[('plain', n)] - mp):+.2f}), spec {1e3 * cold[('spec', n)]:.2f} "
                  f"({1e3 * (cold[('spec', n)] - ms):+.2f})")
        # the marginal step / round: the longer decode less the shorter, per extra call, which
        # leaves out what a decode pays once (set-up, dispatch, a cold start)
        (a, b), o = lengths, outs
        step = (med[("plain", b)] - med[("plain", a)]) / (o[("plain", b)]["target_calls"] - o[("plain", a)]["target_calls"])
        rnd = (med[("spec", b)] - med[("spec", a)]) / (o[("spec", b)]["target_calls"] - o[("spec", a)]["target_calls"])
        print(f"  marginal cost in whole decodes ({a} -> {b} tokens): a plain step {1e3 * step:.3f} against "
              f"T + L_1 {1e3 * (costs.target_step + costs.plain_loop):.3f}; a round {1e3 * rnd:.3f} against "
              f"R + L_gamma {1e3 * (costs.model_round[g] + costs.round_loop[g]):.3f} "
              f"({1e3 * (rnd - costs.model_round[g] - costs.round_loop[g]):+.3f}: inside the real loop "
              "body, in neither part)")


FLUSH_MB = 400


def _after_flush(fns, repeats):
    """Median seconds of each decode when it starts from a cold cache: a buffer larger than
    the last-level cache is written just before (the parts are timed warm, repeated in a
    loop; a decode's first passes over the weights may read them from memory)."""
    import numpy as np
    big = np.zeros(FLUSH_MB * 2 ** 20 // 8)

    def flush():
        big.__iadd__(1.0)
    return interleaved_medians(fns, repeats, warmup=0, before=flush)


if __name__ == "__main__":
    main()
