"""Benchmark: cost of one decoder step over K = 1, 2, 4, 8 tokens (the verify pass of
speculative decoding) relative to a one-token step, and the weight bandwidth it achieves.

    python experiments/bench_decoder_step.py [--preset t5_1_1_base|demo] [--batch 1] [--rounds 30]
    python experiments/bench_decoder_step.py --matmul [--ks 1,2,5,8]

`--matmul` times the step's kernel alone: a chain of 24 distinct [K, 384] x [384, 1024]
float32 products (the demo target's MLP shape, 38 MB of weights: memory-bound at K = 1)
in one compiled program, per product, to show what a K-token pass costs this processor
before attention and the rest of the step.

Random weights (or the shipped demo target's, `--preset demo`), float32 on CPU. Times are medians over interleaved rounds (every K timed
once per round) so machine noise hits all K alike; ratios come from the same run.
Weight bytes per step count the decoder parameters a step reads: every decoder kernel
except the cross-attention key/value kernels (their outputs are cached per input), plus
the output layer (tied embedding for T5 1.0), plus K embedding rows.
"""
from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import speculative_t5 as st
from speculative_t5.calibration import interleaved_medians, step_times
from speculative_t5.measure.timing import decoder_step_bytes
from speculative_t5.paper.rundir import RunDir


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="t5_1_1_base", help="a T5 preset, or 'demo' (the shipped target)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ks", default="1,2,4,8")
    p.add_argument("--input_len", type=int, default=64)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--pos", type=int, default=32, help="decoder position of the step")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--matmul", action="store_true", help="time [K, 384] x [384, 1024] products alone")
    args = p.parse_args()
    if args.matmul:
        return matmul_times([int(k) for k in args.ks.split(",")], args.rounds)

    if args.preset == "demo":  # the shipped demo target, its trained weights
        model = st.load_demo()[0]
        cfg = model.config
    else:
        cfg = st.T5Config.preset(args.preset)
        model = st.init_model(cfg, seed=0)
    ks = [int(k) for k in args.ks.split(",")]
    med = step_times({K: (model, K) for K in ks}, args.batch, args.input_len, args.max_len,
                     args.pos, args.rounds, warmup=3)
    print(f"{args.preset} decoder step, {'trained' if args.preset == 'demo' else 'random'} weights, {cfg.param_dtype}, batch {args.batch}, "
          f"cache {args.max_len}, position {args.pos}, {jax.devices()[0].platform} "
          f"({os.cpu_count()} cores, {RunDir.processor()}), "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'K':>3} {'ms/step':>9} {'ratio to K=1':>13} {'ms/token':>9} {'weights MB':>11} {'GB/s':>7}")
    rows = []
    for K in ks:
        wbytes = decoder_step_bytes(model, K)
        row = dict(K=K, ms_per_step=1e3 * med[K], ratio_to_k1=med[K] / med[ks[0]],
                   ms_per_token=1e3 * med[K] / K, weight_mb=wbytes / 1e6,
                   weight_gb_per_s=wbytes / med[K] / 1e9)
        rows.append(row)
        print(f"{K:>3} {row['ms_per_step']:>9.2f} {row['ratio_to_k1']:>13.2f} "
              f"{row['ms_per_token']:>9.2f} {row['weight_mb']:>11.1f} {row['weight_gb_per_s']:>7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(args), rows=rows, device=str(jax.devices()[0])), f, indent=2)


def matmul_times(ks, rounds: int, n: int = 24, d: int = 384, f: int = 1024):
    """Median time per [K, d] x [d, f] product, n distinct weights chained in one program
    (each product's input depends on the last, as in a decoder step)."""
    rng = np.random.RandomState(0)
    weights = [jnp.asarray(rng.randn(d, f).astype(np.float32) * 0.05) for _ in range(n)]

    @jax.jit
    def chain(x, weights):
        acc = jnp.zeros((x.shape[0], f), jnp.float32)                          # [K, f]
        for w in weights:
            acc = acc + (x + 1e-9 * acc[:, :d]) @ w                            # [K, d] x [d, f]
        return acc
    xs = {K: jnp.ones((K, d), jnp.float32) for K in ks}
    timers = {K: (lambda K=K: chain(xs[K], weights)) for K in ks}
    med = interleaved_medians(timers, rounds, warmup=3)
    print(f"{n} chained [K, {d}] x [{d}, {f}] float32 products, {jax.devices()[0].platform} "
          f"({os.cpu_count()} cores, {RunDir.processor()}), median of {rounds} interleaved rounds")
    print(f"{'K':>3} {'us/product':>11} {'ratio to K=1':>13}")
    for K in ks:
        print(f"{K:>3} {1e6 * med[K] / n:>11.0f} {med[K] / med[ks[0]]:>13.2f}")


if __name__ == "__main__":
    main()
