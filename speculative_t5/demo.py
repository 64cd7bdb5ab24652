"""`speculative-t5 demo`: the shipped target/draft pair decodes held-out inputs of the
standard-library docstring task, plain and speculative (greedy, then temperature 1), and
reports what the paper reports: alpha, tokens per target call, c, v, measured speedup
beside eq. (5)'s prediction (with measured v and with the paper's v = 1), plus Figure 4
(tokens per call) and Figure 5 (speedup against gamma) as PNG files."""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import gin
import jax
import numpy as np
from tqdm import tqdm

from speculative_t5 import analysis, plots
from speculative_t5.alpha import measure_alpha
from speculative_t5.checkpoints import load_checkpoint
from speculative_t5.data import Vocabulary, bucket, tokenize
from speculative_t5.data.demo_corpus import build_corpus
from speculative_t5.decoding import generate
from speculative_t5.decoding.sampling import SamplingConfig
from speculative_t5.model.api import Model
from speculative_t5.timing import step_times, timed_decodes

DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_models")


def load_demo(dtype: str = "float32") -> Tuple[Model, Model, str]:
    """(target, draft, vocabulary path) of the pair shipped inside the package."""
    target_dir, draft_dir = os.path.join(DEMO_DIR, "target"), os.path.join(DEMO_DIR, "draft")
    if not os.path.isdir(target_dir) or not os.path.isdir(draft_dir):
        raise FileNotFoundError(f"the demo pair is missing from this installation ({DEMO_DIR})")
    return (load_checkpoint(target_dir, dtype=dtype), load_checkpoint(draft_dir, dtype=dtype),
            os.path.join(target_dir, "spiece.model"))


def bucketed(inputs: np.ndarray) -> List[np.ndarray]:
    """Each row of inputs [N, S] alone, padded to its length bucket ([1, W] each)."""
    return [bucket(row[row != 0]) for row in inputs]


def _decode_all(model, variants: Dict[str, Tuple], inputs, sampling, max_len, seed, bar):
    """Decode each input alone (batch 1) with every variant {name: (draft, gamma)}, the
    variants interleaved per input. Returns {name: (outputs, seconds per input)}."""
    kwargs = {k: {"draft": d, "gamma": g} for k, (d, g) in variants.items()}
    outs = {k: ([], []) for k in variants}
    for i in range(len(inputs)):
        runs = timed_decodes(model, kwargs, inputs[i], sampling, max_len,
                             jax.random.PRNGKey(seed * 100003 + i))
        for name, (res, seconds) in runs.items():
            outs[name][0].append(res)
            outs[name][1].append(seconds)
        bar.update(len(runs))
    return {k: (o, np.array(t)) for k, (o, t) in outs.items()}


def _warm(model, draft, inputs, gamma, sampling, max_len) -> float:
    """Compile (and run once) the program for every input shape; returns the seconds."""
    t0 = time.perf_counter()
    for x in {x.shape[1]: x for x in inputs}.values():
        generate(model, x, draft=draft, gamma=gamma, max_decode_len=max_len,
                 temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    return time.perf_counter() - t0


def _setting(target, draft, padded, inputs, gamma, sampling, max_len, seed, bar, c, v) -> Dict:
    """Plain vs speculative at one sampling setting, per-example batch-1 walltime; alpha
    along the plain (target-generated) outputs, all inputs at once (padded [N, S])."""
    runs = _decode_all(target, {"plain": (None, gamma), "spec": (draft, gamma)}, inputs,
                       sampling, max_len, seed, bar)
    (plain, t_plain), (spec, t_spec) = runs["plain"], runs["spec"]
    tokens = np.concatenate([r.tokens for r in plain])
    alpha, alpha_ci, positions = measure_alpha(target, draft, padded, tokens, sampling)
    calls = sum(int(r.stats["target_calls"].sum()) for r in spec)
    emitted = sum(int(r.lengths.sum()) for r in spec)
    hist = np.sum([r.stats["tokens_per_call_hist"].sum(0) for r in spec], axis=0)
    same = [bool(np.array_equal(a.tokens, b.tokens)) for a, b in zip(plain, spec)]
    out = {"alpha": alpha, "alpha_ci95": alpha_ci, "alpha_positions": positions, "c": c, "v": v,
           "gamma": gamma, "tokens_per_target_call": emitted / max(calls, 1),
           "tokens_per_call_histogram": hist.tolist(),
           "speedup_measured": float(t_plain.sum() / t_spec.sum()),
           "plain_tokens_per_s": float(sum(int(r.lengths.sum()) for r in plain) / t_plain.sum()),
           "spec_tokens_per_s": float(emitted / t_spec.sum()),
           "identical_fraction": float(np.mean(same))}
    out.update(analysis.predictions(alpha, gamma, c, v))
    return out, plain, spec


def _plots(output_dir: str, greedy: Dict, sweep: List[Dict]) -> List[str]:
    a = greedy["alpha"]
    return [plots.tokens_per_call(os.path.join(output_dir, "tokens_per_call.png"),
                                  greedy["tokens_per_call_histogram"], a, greedy["gamma"],
                                  f"Tokens per target call, greedy, gamma={greedy['gamma']} (paper Fig. 4)"),
            plots.speedup_vs_gamma(os.path.join(output_dir, "speedup_vs_gamma.png"), sweep,
                                   f"Speedup vs gamma, greedy, alpha={a:.2f} (paper Fig. 5)")]


def _report(summary: Dict, examples: List[Dict]) -> str:
    g, t1 = summary, summary["temperature_1"]
    lines = ["# speculative_t5 demo", "",
             f"Target {summary['target']}, draft {summary['draft']}, {summary['num_examples']} "
             f"held-out inputs of the stdlib docstring task, batch 1, {summary['device']}.", "",
             "| setting | alpha | tokens/target call | c | v | speedup measured | eq. (5), measured v | eq. (5), v = 1 | identical to plain |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in (("greedy", g), ("temperature 1", t1)):
        ident = f"{g['greedy_identical_fraction']:.2f}" if name == "greedy" else "n/a (sampled)"
        lines.append(f"| {name} | {r['alpha']:.3f} | {r['tokens_per_target_call']:.2f} | "
                     f"{r['c']:.3f} | {r['v']:.2f} | {r['speedup_measured']:.2f} | "
                     f"{r['speedup_predicted']:.2f} | {r['speedup_predicted_paper']:.2f} | {ident} |")
    lines += ["", "## Speedup against gamma (greedy)", "",
              f"{summary['sweep_examples']} inputs of the most common length bucket "
              f"({summary['sweep_input_width']} tokens).", "",
              "| gamma | tokens/call | v | measured | eq. (5), measured v | eq. (5), v = 1 |",
              "|---|---|---|---|---|---|"]
    for r in summary["gamma_sweep"]:
        lines.append(f"| {r['gamma']} | {r['tokens_per_target_call']:.2f} | {r['v']:.2f} | "
                     f"{r['speedup_measured']:.2f} | {r['speedup_predicted']:.2f} | "
                     f"{r['speedup_predicted_paper']:.2f} |")
    lines += ["", "![tokens per call](tokens_per_call.png) ![speedup vs gamma](speedup_vs_gamma.png)",
              "", "## Examples (greedy)", ""]
    for ex in examples:
        lines += [f"```python\n{ex['input'][len('summarize: '):][:400]}\n```",
                  f"- reference: {ex['reference']}", f"- plain: {ex['plain']}",
                  f"- speculative: {ex['speculative']}", ""]
    return "\n".join(lines)


@gin.configurable(denylist=["quiet"])
def demo(output_dir: str = "runs/demo_output", num_examples: int = 32, gamma: int = 4,
         temperature: float = 1.0, gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7),
         sweep_examples: int = 16, max_decode_len: int = 32, input_len: int = 128,
         target: Optional[str] = None, draft: Optional[str] = None, vocab: Optional[str] = None,
         seed: int = 0, show: int = 3, quiet: bool = False) -> Dict:
    """Run the demo; returns the summary also written to output_dir/summary.json."""
    t_start = time.perf_counter()
    if target or draft:
        if not (target and draft and vocab):
            raise ValueError("give --target, --draft and --vocab together (or none: the shipped pair)")
        tm, dm, vocab_path = load_checkpoint(target, dtype="float32"), load_checkpoint(draft, dtype="float32"), vocab
    else:
        tm, dm, vocab_path = load_demo()
    vocabulary = Vocabulary(vocab_path)
    test = [e for e in build_corpus() if e["split"] == "test"][:num_examples]
    if not test:
        raise ValueError("num_examples must be >= 1")
    padded = tokenize([e["input"] for e in test], vocabulary, input_len)
    inputs = bucketed(padded)
    os.makedirs(output_dir, exist_ok=True)
    greedy_s, sampled_s = SamplingConfig(0.0), SamplingConfig(float(temperature))

    # c and v on this device, batch 1 (interleaved medians of decoder-step timings)
    ks = sorted(set(gammas) | {gamma})
    specs = {"target_1": (tm, 1), "draft_1": (dm, 1), **{f"target_{g + 1}": (tm, g + 1) for g in ks}}
    steps = step_times(specs, 1, input_len, max_decode_len + max(ks) + 1, max_decode_len // 2)
    c = steps["draft_1"] / steps["target_1"]
    v_of = {g: steps[f"target_{g + 1}"] / steps["target_1"] for g in ks}

    compile_s = sum(_warm(tm, d, inputs, g, s, max_decode_len)
                    for s in (greedy_s, sampled_s) for d, g in ((None, gamma), (dm, gamma)))
    # The gamma sweep decodes inputs of the most common length bucket only, so each gamma
    # compiles one program, not one per bucket (compilation dominates a first run).
    widths = [x.shape[1] for x in inputs]
    common = max(sorted(set(widths)), key=widths.count)
    sweep_inputs = [x for x in inputs if x.shape[1] == common][:sweep_examples]
    compile_s += sum(_warm(tm, dm, sweep_inputs, g, greedy_s, max_decode_len)
                     for g in gammas if g != gamma)
    n, m = len(inputs), len(sweep_inputs)
    total = 4 * n + sum(m for g in gammas) + m
    with tqdm(total=total, desc="demo", unit="decode", disable=quiet) as bar:
        greedy, plain, spec = _setting(tm, dm, padded, inputs, gamma, greedy_s, max_decode_len, seed, bar,
                                       c, v_of[gamma])
        greedy_identical = greedy.pop("identical_fraction")
        sampled, _, _ = _setting(tm, dm, padded, inputs, gamma, sampled_s, max_decode_len, seed, bar,
                                 c, v_of[gamma])
        sampled.pop("identical_fraction")
        variants = {"plain": (None, gamma), **{g: (dm, g) for g in gammas}}
        runs = _decode_all(tm, variants, sweep_inputs, greedy_s, max_decode_len, seed, bar)
        t_plain = runs["plain"][1]
        sweep = []
        for g in gammas:
            res, t_spec = runs[g]
            calls = sum(int(r.stats["target_calls"].sum()) for r in res)
            row = {"gamma": g, "v": v_of[g], "speedup_measured": float(t_plain.sum() / t_spec.sum()),
                   "tokens_per_target_call": sum(int(r.lengths.sum()) for r in res) / max(calls, 1)}
            row.update(analysis.predictions(greedy["alpha"], g, c, v_of[g]))
            sweep.append(row)

    summary = dict(greedy, greedy_identical_fraction=greedy_identical, temperature_1=sampled,
                   temperature=float(temperature), gamma_sweep=sweep,
                   # over the swept gammas, each with its own measured v
                   best_gamma_predicted=max(sweep, key=lambda r: r["speedup_predicted"])["gamma"],
                   best_gamma_measured=max(sweep, key=lambda r: r["speedup_measured"])["gamma"],
                   sweep_examples=m, sweep_input_width=int(common), num_examples=n, max_decode_len=max_decode_len, compile_seconds=compile_s,
                   target=f"{tm.num_params() / 1e6:.1f}M params ({tm.config.num_decoder_layers} decoder layers)",
                   draft=f"{dm.num_params() / 1e6:.2f}M params ({dm.config.num_decoder_layers} decoder layer(s))",
                   device=f"{jax.devices()[0].platform} ({os.cpu_count()} cores)",
                   step_ms={k: 1e3 * v for k, v in steps.items()})
    examples = [{"input": test[i]["input"], "reference": test[i]["target"],
                 "plain": vocabulary.decode(plain[i].tokens[0]),
                 "speculative": vocabulary.decode(spec[i].tokens[0])} for i in range(min(show, n))]
    _plots(output_dir, greedy, sweep)
    summary["seconds"] = time.perf_counter() - t_start
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(output_dir, "report.md"), "w") as f:
        f.write(_report(summary, examples))
    if not quiet:
        _print(summary, examples, output_dir)
    return summary


def _print(s: Dict, examples: List[Dict], output_dir: str) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console()
    table = Table(title="held-out inputs: plain vs speculative (greedy)", show_lines=True)
    for col in ("function (docstring removed)", "plain decode", "speculative decode"):
        table.add_column(col, overflow="fold")
    for ex in examples:
        src = ex["input"][len("summarize: "):]
        table.add_row(src[:200] + ("..." if len(src) > 200 else ""), ex["plain"], ex["speculative"])
    console.print(table)
    t1 = s["temperature_1"]
    console.print(
        f"greedy: identical outputs {s['greedy_identical_fraction']:.0%}, alpha {s['alpha']:.3f}, "
        f"{s['tokens_per_target_call']:.2f} tokens per target call, c {s['c']:.3f}, v {s['v']:.2f}\n"
        f"        speedup measured {s['speedup_measured']:.2f}x, predicted {s['speedup_predicted']:.2f}x "
        f"(eq. 5 with measured v), {s['speedup_predicted_paper']:.2f}x (paper, v = 1)\n"
        f"T={s['temperature']:g}:  alpha {t1['alpha']:.3f}, {t1['tokens_per_target_call']:.2f} tokens per "
        f"target call, speedup measured {t1['speedup_measured']:.2f}x, predicted "
        f"{t1['speedup_predicted']:.2f}x / {t1['speedup_predicted_paper']:.2f}x\n"
        f"wrote {output_dir}/summary.json, report.md, tokens_per_call.png, speedup_vs_gamma.png "
        f"({s['seconds']:.0f} s, {s['compile_seconds']:.0f} s of it compiling)")
