"""`speculative-t5 demo --family gpt2`: the classic decoder-only demo, on the shipped GPT-2
pair (code completion of held-out standard-library modules).

Each prompt is continued plainly and speculatively at batch 1, greedy and at temperature T,
the two decodes of an example timed back to back (compile kept apart) as the walltime
driver does; alpha is measured along the target's own (plain) continuations; c, v, the
prompt's prefill and the loops' own work are timed apart for the cost model
(`measure.costs`), so the measured speedup stands beside eq. (5) and the full prediction.
Writes summary.json, report.md and tokens_per_call.png into output_dir."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Sequence

import jax
import numpy as np

from speculative_t5.checkpoints import load_checkpoint
from speculative_t5.data import BPEVocabulary, pad_to
from speculative_t5.decoding import SamplingConfig
from speculative_t5.decoding.output import combine, ratio
from speculative_t5.paper import plots
from speculative_t5.paper.timed import predicted_seconds
from speculative_t5.engine import cache_positions, check_pair
from speculative_t5.measure.alpha import alpha_of, overlap_sums
from speculative_t5.measure.analysis import predictions
from speculative_t5.measure.costs import measure_costs
from speculative_t5.measure.timing import timed_decodes

WIDTH = 64  # prompts are right-padded to a multiple of this: few programs, little padding


def decode_setting(target, draft, prompts: Sequence[List[int]], sampling: SamplingConfig,
                   gamma: int, max_new_tokens: int, seed: int = 0) -> Dict[str, Any]:
    """Batch-1 plain and speculative decodes of every prompt, timed back to back; the first
    prompt of each width compiles untimed. Returns {'records', 'compile_seconds'}."""
    records, warm, compile_seconds = [], set(), 0.0
    for i, ids in enumerate(prompts):
        width = -(-len(ids) // WIDTH) * WIDTH
        x, lengths = pad_to([ids], width), np.array([len(ids)])               # [1, W], [1]
        variants = {"plain": dict(prompt_lengths=lengths),
                    "spec": dict(draft=draft, gamma=gamma, prompt_lengths=lengths)}
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), i)
        if width not in warm:
            t0 = time.perf_counter()
            timed_decodes(target, variants, x, sampling, max_new_tokens, rng)
            compile_seconds += time.perf_counter() - t0
            warm.add(width)
        out = timed_decodes(target, variants, x, sampling, max_new_tokens, rng)
        rec = {"index": i, "width": width, "prompt_length": len(ids)}
        for name, (res, seconds) in out.items():
            n = int(res.lengths[0])
            rec[name] = dict(res.row(0), tokens=res.tokens[0, :n].tolist(), seconds=seconds)
        records.append(rec)
    return {"records": records, "compile_seconds": compile_seconds}


def summarize(target, draft, prompts, run: Dict[str, Any], costs, sampling: SamplingConfig,
              gamma: int) -> Dict[str, Any]:
    """alpha (along the plain outputs), tokens per call, measured speedup, and the three
    predictions (cost model, eq. (5) with the measured v, eq. (5) with v = 1)."""
    recs = run["records"]
    sums = []
    for rec, ids in zip(recs, prompts):
        if rec["plain"]["tokens"]:
            sums += overlap_sums(target, draft, pad_to([ids], rec["width"]),
                                 np.asarray([rec["plain"]["tokens"]]), sampling,
                                 np.array([len(ids)]))
    alpha = alpha_of(sums)
    spec = combine([r["spec"] for r in recs])
    plain_s, spec_s = (sum(r[k]["seconds"] for r in recs) for k in ("plain", "spec"))
    predicted = predicted_seconds(costs, gamma, recs)
    eq5 = predictions(alpha["alpha"], gamma, costs.c, costs.v(gamma))
    out = dict(alpha, c=costs.c, v=costs.v(gamma), gamma=gamma,
               tokens_per_target_call=spec["tokens_per_target_call"],
               tokens_per_call_histogram=spec["tokens_per_call_histogram"],
               speedup_measured=ratio(plain_s, spec_s),
               speedup_predicted_full=ratio(predicted["plain"], predicted["spec"]),
               measured_over_full=ratio(ratio(plain_s, spec_s),
                                        ratio(predicted["plain"], predicted["spec"])),
               tokens_per_s_plain=ratio(sum(r["plain"]["length"] for r in recs), plain_s),
               tokens_per_s_spec=ratio(spec["tokens"], spec_s),
               target_step_ms=1e3 * costs.target_step, compile_seconds=run["compile_seconds"],
               **eq5)
    if sampling.greedy:
        out["identical_fraction"] = float(np.mean([r["plain"]["tokens"] == r["spec"]["tokens"]
                                                   for r in recs]))
    return out


def demo_gpt2(output_dir: str, examples: Sequence[Dict[str, str]], target: str, draft: str,
              num_examples: int = 32, gamma: int = 4, temperature: float = 1.0,
              max_new_tokens: int = 32, max_prompt_tokens: int = 192, timing_rounds: int = 10,
              show: int = 3, quiet: bool = False) -> Dict[str, Any]:
    """Run the demo over `examples` ({'prompt', 'reference'} texts) with the GPT-2 pair in
    the `target` and `draft` directories (the target's holds vocab.json + merges.txt)."""
    t_start = time.perf_counter()
    if not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(f"num_examples must be an int >= 1, got {num_examples!r}")
    vocab = BPEVocabulary(target)
    target_model, draft_model = load_checkpoint(target), load_checkpoint(draft, role="draft")
    if not target_model.decoder_only:
        raise ValueError(f"{target}: demo --family gpt2 needs a GPT-2 target, this is a T5")
    check_pair(target_model, draft_model)
    vocab.check_fits(target_model.config.vocab_size)
    examples = list(examples)[:num_examples]
    keep = min(max_prompt_tokens, target_model.config.n_positions - max_new_tokens)
    prompts = [vocab.encode(e["prompt"])[-keep:] for e in examples]  # the latest context
    widths = sorted({-(-len(p) // WIDTH) * WIDTH for p in prompts})
    step_width = widths[len(widths) // 2]
    # the positions beyond the prompt that `generate` gives a decode at the steps' width
    cache_len = cache_positions(max_new_tokens, step_width)
    costs = measure_costs(target_model, draft_model, [gamma], widths, step_width,
                          cache_len, timing_rounds, plain_len=max_new_tokens)
    settings = {"greedy": SamplingConfig(0.0), "sampled": SamplingConfig(float(temperature))}
    summary, runs = {}, {}
    for name, sampling in settings.items():
        runs[name] = decode_setting(target_model, draft_model, prompts, sampling, gamma,
                                    max_new_tokens)
        summary[name] = summarize(target_model, draft_model, prompts, runs[name], costs,
                                  sampling, gamma)
    os.makedirs(output_dir, exist_ok=True)
    g = summary["greedy"]
    plots.tokens_per_call(os.path.join(output_dir, "tokens_per_call.png"),
                          g["tokens_per_call_histogram"], g["alpha"], gamma,
                          f"GPT-2 pair, greedy, gamma={gamma}")
    summary.update(family="gpt2", temperature=float(temperature), num_examples=len(prompts),
                   max_new_tokens=max_new_tokens, seconds=time.perf_counter() - t_start,
                   device=f"{jax.devices()[0].platform} ({os.cpu_count()} cores)")
    shown = [dict(prompt=e["prompt"], reference=e.get("reference", ""),
                  plain=vocab.decode(r["plain"]["tokens"]), spec=vocab.decode(r["spec"]["tokens"]))
             for e, r in zip(examples, runs["greedy"]["records"])][:show]
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(output_dir, "report.md"), "w") as f:
        f.write(_report(summary, shown))
    if not quiet:
        print(_report(summary, shown))
    return summary


def _report(s: Dict[str, Any], shown: List[Dict[str, str]]) -> str:
    lines = ["# speculative_t5 demo: GPT-2 pair (code completion)", "",
             f"{s['num_examples']} held-out prompts, {s['max_new_tokens']} new tokens, batch 1, "
             f"{s['device']}, {s['seconds']:.0f} s.", "",
             "| setting | alpha | tokens/target call | c | v | speedup measured | cost model | "
             "measured / cost model | eq. (5), measured v | eq. (5), v = 1 | identical to plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, label in (("greedy", "greedy"), ("sampled", f"temperature {s['temperature']:g}")):
        r = s[name]
        ident = f"{r['identical_fraction']:.2f}" if "identical_fraction" in r else "n/a (sampled)"
        lines.append(f"| {label} | {r['alpha']:.3f} | {r['tokens_per_target_call']:.2f} | "
                     f"{r['c']:.3f} | {r['v']:.2f} | {r['speedup_measured']:.2f} | "
                     f"{r['speedup_predicted_full']:.2f} | {r['measured_over_full']:.2f} | "
                     f"{r['speedup_predicted']:.2f} | {r['speedup_predicted_paper']:.2f} | {ident} |")
    lines += ["", "![tokens per call](tokens_per_call.png)", "", "## Examples (greedy)", ""]
    for ex in shown:
        lines += [f"```python\n{ex['prompt'][-300:]}\n```", f"- reference: `{ex['reference']!r}`",
                  f"- plain: `{ex['plain']!r}`", f"- speculative: `{ex['spec']!r}`", ""]
    return "\n".join(lines)
