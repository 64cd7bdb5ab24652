"""What the cost model leaves unexplained in a walltime cell's own records, per decode:
measured minus predicted seconds for plain and speculative decoding, by input width, and
a least-squares fit  excess = a + b * calls  (a: per decode, b: per target call / round),
so a gap can be told apart as a fixed cost or a per-round one; and measured / predicted
speedup with the parts timed beside each decode against the parts timed once before the
cell. Reads only the run
directory (examples.jsonl, timing.json), e.g. the demo's:

    python experiments/cost_residuals.py runs/demo_output/walltime/docstrings_t0
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from speculative_t5.experiments.rundir import RunDir
from speculative_t5.experiments.timed import costs_of, load_timing, predicted_seconds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cell_dir", help="a walltime_table cell's run directory")
    args = p.parse_args()
    run = RunDir(args.cell_dir)
    recs = [r for r in run.records() if "seconds" in r]
    timing = load_timing(run)
    costs = costs_of(timing, recs)
    gamma = int(next(iter(timing["costs"]["verify"])))
    rows = []
    for r in recs:
        pred = predicted_seconds(costs, gamma, [r])
        rows.append((r["width"], r["plain"]["target_calls"], r["spec"]["target_calls"],
                     1e3 * (r["seconds"]["plain"] - pred["plain"]),
                     1e3 * (r["seconds"]["spec"] - pred["spec"]),
                     1e3 * r.get("parts", {}).get(f"setup_target_{r['width']}", np.nan)))
    a = np.array(rows, dtype=float)
    print(f"{os.path.basename(args.cell_dir)}: {len(a)} decodes, gamma {gamma}; measured - "
          f"predicted, ms per decode (medians)")
    for w in sorted(set(a[:, 0])):
        s = a[a[:, 0] == w]
        print(f"  width {int(w)} ({len(s)}): plain {np.median(s[:, 3]):+.2f}, speculative "
              f"{np.median(s[:, 4]):+.2f}; the target's set-up part {np.nanmedian(s[:, 5]):.2f}")
    for name, calls, excess in (("plain", 1, 3), ("speculative", 2, 4)):
        X = np.stack([np.ones(len(a)), a[:, calls]], 1)
        (fixed, per), *_ = np.linalg.lstsq(X, a[:, excess], rcond=None)
        print(f"  {name}: excess = {fixed:+.2f} ms per decode {per:+.3f} ms per "
              f"{'target call' if calls == 1 else 'round'}")
    measured = {k: sum(r["seconds"][k] for r in recs) for k in ("plain", "spec")}
    beside = predicted_seconds(costs, gamma, recs)
    # the same decodes predicted from the parts timed once before the cell (no "parts")
    before = predicted_seconds(costs_of(timing), gamma,
                               [{k: v for k, v in r.items() if k != "parts"} for r in recs])
    print(json.dumps({"measured_over_predicted": {k: measured[k] / beside[k] for k in measured},
                      "measured_over_full": {name: (measured["plain"] / measured["spec"])
                                             / (p["plain"] / p["spec"])
                                             for name, p in (("parts beside each decode", beside),
                                                             ("parts before the cell", before))}}))


if __name__ == "__main__":
    main()
