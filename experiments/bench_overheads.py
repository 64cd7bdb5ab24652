"""Benchmark: where a decode's time goes, on the shipped demo pair, batch 1 — the cost
model's parts (`speculative_t5.measure.costs`: per-input set-up of each model, target step
T, verify pass v T, draft step c T, two-token draft call), and whole decodes measured beside
the model's prediction, for short and long inputs.

    python experiments/bench_overheads.py [--repeats 20] [--gamma 4] [--widths 32 256]

EOS is switched off so every decode runs exactly its length: plain decodes of 2 and 6
rounds' worth of tokens, speculative decodes of the same lengths. What the parts do not
explain (measured - predicted) is printed per token (plain) and per round (speculative):
the loops' own work (sampling, accept test, emit) and dispatch. Each decode is also timed
from a cold cache (a 400 MB buffer written just before it): the parts are timed warm, and
what a decode pays more from a cold start shows there. A round's model steps are also
timed as one compiled loop of rounds (both models in turn) beside the sum of their parts.
Medians of interleaved repetitions,
compile excluded; the machine is shared, so compare ratios.
"""
from __future__ import annotations

import argparse
import dataclasses

import speculative_t5 as st
from speculative_t5.data import bucket
from speculative_t5.measure.costs import measure_costs
from speculative_t5.measure.timing import interleaved_medians


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
        composed = _composed_round(target, draft, g, x, cache_len, args.repeats)
        parts = costs.verify[g] + g * costs.draft_step
        print(f"  a round's model steps in one compiled loop of rounds (gamma draft steps, then the "
              f"verify pass): {1e3 * composed:.3f} against their parts {1e3 * parts:.3f} "
              f"({1e3 * (composed - parts):+.3f})")
        fns, outs = {}, {}
        for n in lengths:
            fns[("plain", n)] = lambda n=n: st.generate(target, x, max_decode_len=n)
            fns[("spec", n)] = lambda n=n: st.generate(target, x, draft=draft, gamma=g, max_decode_len=n)
            outs[("plain", n)], outs[("spec", n)] = fns[("plain", n)]().row(0), fns[("spec", n)]().row(0)
        med = interleaved_medians(fns, args.repeats, warmup=1)
        cold = _after_flush(fns, args.repeats)
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


FLUSH_MB = 400
ROUNDS = 16


def _composed_round(target, draft, gamma, x, cache_len, repeats):
    """Seconds per round of a compiled loop of ROUNDS rounds: gamma one-token draft steps
    (each fed the last's argmax), then one target pass over the gamma + 1 tokens -- the
    model steps of a speculative round without its accept test, both models in turn (each
    part times one model alone)."""
    import functools
    import jax
    import jax.numpy as jnp
    from speculative_t5.measure.timing import interleaved_medians
    from speculative_t5.model.api import decode, init_cache

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def rounds(tc, dc, tok, pos):
        def body(i, c):
            tc, dc, tok = c
            p = pos + (i % 4)
            xs = [tok]
            for j in range(gamma):
                logits, dc = decode(draft, dc, xs[-1], p + j)
                xs.append(jnp.argmax(logits, -1).astype(jnp.int32))
            logits, tc = decode(target, tc, jnp.concatenate(xs, 1), p)
            return tc, dc, jnp.argmax(logits[:, -1:], -1).astype(jnp.int32)
        return jax.lax.fori_loop(0, ROUNDS, body, (tc, dc, tok))

    state = {"t": init_cache(target, x, cache_len), "d": init_cache(draft, x, cache_len)}
    tok, pos = jnp.ones((1, 1), jnp.int32), jnp.full((1,), cache_len // 2 - gamma, jnp.int32)

    def run():
        state["t"], state["d"], out = rounds(state["t"], state["d"], tok, pos)
        return out
    return interleaved_medians({"r": run}, repeats, warmup=2)["r"] / ROUNDS


def _after_flush(fns, repeats):
    """Median seconds of each decode when it starts from a cold cache: a buffer larger than
    the last-level cache is written just before (the parts are timed warm, repeated in a
    loop; a decode's first passes over the weights may read them from memory)."""
    import statistics
    import time
    import numpy as np
    big = np.zeros(FLUSH_MB * 2 ** 20 // 8)
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            big += 1.0
            t0 = time.perf_counter()
            fn().tokens  # GenerateOutput: on the host already
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


if __name__ == "__main__":
    main()
