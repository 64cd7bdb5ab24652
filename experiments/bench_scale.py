"""Benchmark: a real-size partitioned run on this machine's CPU, as 8 host devices.

    python experiments/bench_scale.py [--dir /tmp/speculative_t5_scale] [--num_partitions 8]

1. Writes once (kept in --dir) a T5.1.1-XL-shaped random checkpoint (2.85B parameters) in
   T5X's legacy format, bfloat16, one tensor at a time (tensorstore zarr), and a
   t5_1_1_small-shaped draft beside it.
2. Loads the target (float32 in memory: XLA's CPU dots upcast bfloat16 weights, which
   would hold a float32 copy of them) with `Partitioner(num_partitions=N)` straight into its shards and
   reports load seconds and peak host memory (this process's max RSS, the draft not yet
   loaded) against the parameter bytes: the loader must not hold a second copy (goal <= 1.3x).
3. A short greedy plain and speculative decode on the mesh: compile seconds, ms per target
   step, tokens per call.
4. The same decodes unpartitioned (whole model on one device, run first in a subprocess
   of its own so the two copies never share this machine's memory), tokens compared.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import speculative_t5 as st  # noqa: E402
from speculative_t5.model.api import param_shapes  # noqa: E402


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def write_random_t5x(config: st.T5Config, ckpt_dir: str, seed: int) -> None:
    """A T5X legacy checkpoint of random bfloat16 weights (std 1/sqrt(fan-in)), written one
    tensor at a time so the whole model is never in memory."""
    import tensorstore as ts
    from flax import serialization, traverse_util
    if os.path.exists(os.path.join(ckpt_dir, "checkpoint")):
        return
    os.makedirs(ckpt_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    target = {}
    flat = traverse_util.flatten_dict(param_shapes(config), sep="/")
    for key, shape in flat.items():
        shape = tuple(shape.shape)
        scale = 1.0 if len(shape) == 1 or "embedding" in key else shape[0] ** -0.5
        arr = (rng.standard_normal(shape, np.float32) * scale).astype(ml_dtypes.bfloat16)
        if "scale" in key:
            arr = np.ones(shape, ml_dtypes.bfloat16)
        name = ("target/" + key).replace("/", ".")
        spec = {"driver": "zarr", "dtype": "bfloat16", "kvstore": {"driver": "file", "path": name},
                "metadata": {"compressor": None, "shape": list(shape),
                             "chunks": [max(1, s // 4) for s in shape]}}
        absolute = dict(spec, kvstore={"driver": "file", "path": os.path.join(ckpt_dir, name)})
        ts.open(absolute, create=True, delete_existing=True).result().write(arr).result()
        target[key] = spec
        del arr
    contents = {"version": 3, "optimizer": {"target": traverse_util.unflatten_dict(target, sep="/"),
                                            "state": {"step": np.int32(0)}}}
    with open(os.path.join(ckpt_dir, "checkpoint"), "wb") as f:
        f.write(serialization.msgpack_serialize(contents))


def timed_decodes(target, draft, ids, partitioner, max_len, gamma):
    out = {}
    for name, kw in (("plain", {}), ("speculative", dict(draft=draft, gamma=gamma))):
        t0 = time.perf_counter()
        res = st.generate(target, ids, max_decode_len=max_len, partitioner=partitioner, **kw)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = st.generate(target, ids, max_decode_len=max_len, partitioner=partitioner, **kw)
        run = time.perf_counter() - t0
        calls = int(res.stats["target_calls"].sum())
        out[name] = {"tokens": res.tokens.tolist(), "compile_s": round(first - run, 2),
                     "run_s": round(run, 3), "target_calls": calls,
                     "ms_per_target_call": round(1e3 * run / calls, 1),
                     "tokens_per_call": round(float(res.lengths.sum()) / calls, 2)}
    return out


def load(path: str, partitioner=None, role: str = "target"):
    return st.load_checkpoint(path, partitioner=partitioner, role=role, dtype="float32",
                              activation_dtype="float32")


def one_device(args) -> dict:
    """The unpartitioned decodes (this process sees one device)."""
    target, draft = load(os.path.join(args.dir, "xl")), load(os.path.join(args.dir, "small"))
    return timed_decodes(target, draft, IDS, None, args.max_decode_len, args.gamma)


IDS = np.random.default_rng(0).integers(2, 32000, (1, 32))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/speculative_t5_scale")
    p.add_argument("--num_partitions", type=int, default=8)
    p.add_argument("--max_decode_len", type=int, default=8)
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--one_device", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_device:
        print(json.dumps(one_device(args)))
        return
    bf16 = dict(param_dtype="bfloat16", dtype="bfloat16")
    t0 = time.perf_counter()
    write_random_t5x(st.T5Config.preset("t5_1_1_xl", **bf16), os.path.join(args.dir, "xl"), 0)
    write_random_t5x(st.T5Config.preset("t5_1_1_small", **bf16), os.path.join(args.dir, "small"), 1)
    report = {"devices": jax.device_count(), "write_s": round(time.perf_counter() - t0, 1)}
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run([sys.executable, __file__, "--one_device", *sys.argv[1:]], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the one-device run failed:\n{proc.stderr[-2000:]}")
    report["one_device"] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["rss_before_load"] = peak_rss()
    part = st.Partitioner(num_partitions=args.num_partitions)
    t0 = time.perf_counter()
    target = load(os.path.join(args.dir, "xl"), part)
    report["load_s"] = round(time.perf_counter() - t0, 1)
    report["param_bytes"] = target.num_bytes()
    report["peak_rss_after_load"] = peak_rss()
    report["peak_over_params"] = round(report["peak_rss_after_load"] / report["param_bytes"], 3)
    # a replicated draft is one copy per device: 8 copies in this one host's memory
    draft = load(os.path.join(args.dir, "small"), part, role="draft")
    leaf = target.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    report["shard_of_mlp_wi_0"] = [list(leaf.shape), list(leaf.addressable_shards[0].data.shape)]
    report["partitioned"] = timed_decodes(target, draft, IDS, part, args.max_decode_len, args.gamma)
    report["peak_rss_after_decode"] = peak_rss()
    report["tokens_identical"] = {
        k: report["one_device"][k]["tokens"] == report["partitioned"][k]["tokens"]
        for k in ("plain", "speculative")}
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
