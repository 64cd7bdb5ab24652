"""The TPU compiler's table for T5.1.1-XXL + T5.1.1-small (bf16 weights and activations,
input 512, 128 new tokens, gamma 7): memory per chip, HBM bytes per target step and verify
pass, roofline ms, c, v and the paper's rows predicted by eq. (5) with that c and v (EnDe
greedy alpha 0.75 at gamma 7, CNN/DM 0.65 at gamma 5; v is the 8-token verify pass's)
beside the paper's measured 3.4x / 3.1x -- compiled with no TPU attached
(`speculative-t5 compile`, libtpu), so the compiler's figures, not walltime.

    python experiments/tpu_table.py [--output runs/tpu_table.jsonl] [--parts_only]
        [--parameter_layouts compiler|default]

Each configuration (topology, num_partitions, batch, parameter layouts, parts only or not)
is one JSON line in --output, written when it finishes; a rerun skips the lines already
there (a compile of the whole XXL decode takes minutes on 2 cores). Prints the markdown
table of every line in the file (rows with row-major parameters say so)."""
import argparse
import json
import os

import speculative_t5 as st
from speculative_t5.measure import tpu_compile
from speculative_t5.measure.analysis import walltime_improvement

CONFIGS = [("v4-2", 1, 1), ("v4-2", 1, 32), ("v4-8", 4, 1), ("v4-8", 4, 32),
           ("v5e-8", 8, 1), ("v5e-8", 8, 32)]
# the paper's rows (T5-XXL + small, argmax, one v4 chip): alpha, gamma, measured speedup
PAPER = {"EnDe T=0 (alpha 0.75, gamma 7)": (0.75, 7, 3.4),
         "CNN/DM T=0 (alpha 0.65, gamma 5)": (0.65, 5, 3.1)}
GiB = 1 << 30


def key(topology, partitions, batch, layouts, parts_only):
    return f"{topology}/{partitions}/{batch}/{layouts}" + ("/parts" if parts_only else "")


def run(output, parts_only, layouts):
    done = set()
    if os.path.exists(output):
        with open(output) as f:
            done = {json.loads(line)["key"] for line in f if line.strip()}
    target = st.T5Config.preset("t5_1_1_xxl").replace(param_dtype="bfloat16", dtype="bfloat16")
    draft = st.T5Config.preset("t5_1_1_small").replace(param_dtype="bfloat16", dtype="bfloat16")
    for topology, partitions, batch in CONFIGS:
        k = key(topology, partitions, batch, layouts, parts_only)
        if k in done:
            continue
        try:
            r = tpu_compile.compile_report(target, draft, topology, partitions, batch, 512,
                                           128, 7, 0.75, whole=not parts_only,
                                           parameter_layouts=layouts)
        except ValueError as e:  # does not fit: the row says so
            r = {"topology": topology, "batch": batch, "mesh": {"data": 1, "model": partitions},
                 "parameter_layouts": layouts, "error": str(e)}
        with open(output, "a") as f:
            f.write(json.dumps({"key": k, **r}) + "\n")
        print(f"{k}: {r.get('error') or 'compiled in %.0f s' % r['compile_seconds']}",
              flush=True)


def label(r):
    """A row's chips and mesh, and 'row-major' where its parameters kept that layout."""
    mesh = f"{r['mesh']['data']} x {r['mesh']['model']}"
    return (f"{r['topology']} ({r['num_devices']}), {mesh}"
            + (", row-major" if r.get("parameter_layouts") == "default" else ""))


def table(output):
    rows = [json.loads(line) for line in open(output) if line.strip()]
    head = ("| chip(s), mesh | batch | memory per chip GiB (compiler / plan) | HBM GB per target "
            "step / verify (ideal) | roofline ms step / verify / draft | c | v | "
            + " | ".join(f"{name}: predicted (paper measured)" for name in PAPER) + " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['topology']}, model {r['mesh']['model']} | {r['batch']} | "
                         f"{r['error'].split(': ', 1)[-1].split(';')[0]} |" + " |" * 4
                         + " |" * len(PAPER))
            continue
        p, m = r["parts"], r["memory_per_device_bytes"]
        mem = "-" if m is None else f"{m['total'] / GiB:.2f}"
        preds = " | ".join(f"{walltime_improvement(a, g, r['c'], r['v']):.2f}x ({x}x)"
                           for a, g, x in PAPER.values())
        lines.append(
            f"| {label(r)} | {r['batch']} | {mem} / {r['plan_total_bytes'] / GiB:.2f} | "
            f"{p['target_step']['hbm_bytes'] / 1e9:.2f} / {p['verify']['hbm_bytes'] / 1e9:.2f} "
            f"({r['ideal_step_bytes']['target_step'] / 1e9:.2f}) | "
            f"{p['target_step']['roofline_ms']:.2f} / {p['verify']['roofline_ms']:.2f} / "
            f"{p['draft_step']['roofline_ms']:.3f} | {r['c']:.3f} | {r['v']:.2f} | {preds} |")
    lines += ["", "In the whole decodes' loops, HBM GB per iteration (a plain step; a speculative "
              "round's verify pass and bookkeeping; a draft step), what copies write to HBM "
              "per iteration, c and v from them, eq. (5) at the EnDe row:", "",
              "| chip(s), mesh | batch | plain step | round | draft step | copies per "
              "iteration (plain / round) | c | v | EnDe predicted |", "|" + "---|" * 9]
    alpha, gamma, _ = PAPER[next(iter(PAPER))]
    for r in rows:
        if "in_loop" not in r:
            continue
        x, h = r["in_loop"], {n: p["hbm_bytes"] for n, p in r["programs"].items()}
        lines.append(
            f"| {label(r)} | {r['batch']} | {x['target_step_hbm_bytes'] / 1e9:.2f} | "
            f"{x['round_hbm_bytes'] / 1e9:.2f} | {x['draft_step_hbm_bytes'] / 1e9:.3f} | "
            f"{h['plain_decode']['copies_per_iteration'] / 1e9:.3f} / "
            f"{h['speculative_decode']['copies_per_iteration'] / 1e9:.3f} | {x['c']:.3f} | "
            f"{x['v']:.2f} | {walltime_improvement(alpha, gamma, x['c'], x['v']):.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="runs/tpu_table.jsonl")
    parser.add_argument("--parts_only", action="store_true",
                        help="compile the parts alone (no whole-decode memory; faster)")
    parser.add_argument("--parameter_layouts", choices=("compiler", "default"),
                        default="compiler", help="the parameters' layouts (st.Partitioner's)")
    args = parser.parse_args()
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    run(args.output, args.parts_only, args.parameter_layouts)
    print(table(args.output))
