"""`speculative-t5 demo`: the paper drivers run over the demo cells, plus a console report.

The shipped pair decodes held-out inputs of the standard-library docstring task: the
`walltime_table` driver over the greedy and the sampled demo cell (`configs/demo/*.gin`,
written into the output directory so that a command-line change of gamma, temperature or
models is a cell like any other), then `gamma_sweep` over the greedy cell and
`walltime_table` over the beam-search cell (T5X's beam search against the exact speculative
one: a line of the report). From their rows:
summary.json, report.md, tokens_per_call.png (paper Figure 4) and speedup_vs_gamma.png
(Figure 5), and a table of a few outputs on the console. Every measurement is the drivers'.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import gin
import jax

from speculative_t5.data.demo_corpus import source_of
from speculative_t5.paper import drivers, timed
from speculative_t5.paper.gamma_sweep import choose_gamma
from speculative_t5.paper.rundir import RunDir
from speculative_t5.measure.quality import name_baseline, summary_quality

PAIR = "the shipped demo pair (16.1M target, 0.66M draft)"
TASK = "task (held-out stdlib functions -> docstring sentence)"


class DemoCell(NamedTuple):
    header: Tuple[str, ...]         # the config's comment lines
    blocks: Tuple[str, ...]         # gin/decoding/ blocks after the task
    lines: Tuple[str, ...] = ()     # the cell's own bindings (its draft)
    draft_macro: Optional[str] = "DRAFT_CHECKPOINT"  # where --draft goes (None: no model)
    max_examples: Optional[int] = None  # at most this many of the demo's --num_examples


def _pair_header(setting: str) -> Tuple[str, ...]:
    return (f"# The drivers on this machine: {PAIR} on its own",
            f"# {TASK}, {setting}, float32.")


CELLS = {"docstrings_t0": DemoCell(_pair_header("argmax (temperature 0)"), ("speculative_greedy",)),
         "docstrings_t1": DemoCell(_pair_header("temperature 1"), ("speculative_sampling",))}
# The draft table (`demo --drafts`): draft kind x verification, beside the model draft above.
DRAFT_CELLS = {
    "docstrings_lookup_t0": DemoCell(
        ("# The demo target with no draft model: prompt lookup (copies what followed the last",
         "# 1-3 tokens' most recent earlier occurrence in the input or the output), argmax.",
         "#   speculative-t5 walltime_table --cell configs/demo/docstrings_lookup_t0.gin --output_dir runs/lookup"),
        ("speculative_greedy",),
        ("DRAFT_CHECKPOINT = 'prompt_lookup:3:1'", "DRAFT_NAME = 'prompt lookup'"), None),
    "docstrings_fallback_t0": DemoCell(
        ("# The demo pair as Fallback(prompt lookup, demo draft): per row and round the lookup's",
         "# copy where it matches, the draft model's tokens elsewhere; argmax.",
         "#   speculative-t5 walltime_table --cell configs/demo/docstrings_fallback_t0.gin --output_dir runs/fallback"),
        ("speculative_greedy",),
        ("DRAFT_CHECKPOINT = @fallback_draft()", "fallback_draft.first = 'prompt_lookup:3:1'",
         "fallback_draft.then = @draft/demo_model_dir()",
         "DRAFT_NAME = 'prompt lookup, else demo draft'"), "fallback_draft.then"),
    "docstrings_bigram_t0": DemoCell(
        ("# The demo target with the paper's bigram draft (no model: each token's 256 most",
         "# frequent successors in the demo corpus's train targets, `Bigram.fit`), argmax.",
         "#   speculative-t5 walltime_table --cell configs/demo/docstrings_bigram_t0.gin --output_dir runs/bigram"),
        ("speculative_greedy",),
        ("DRAFT_CHECKPOINT = @demo_bigram()", "demo_bigram.vocabulary = %VOCABULARY",
         "demo_bigram.target = %TARGET_CHECKPOINT", "DRAFT_NAME = 'bigram'"), None),
    "docstrings_t1_block": DemoCell(
        ("# The T = 1 demo cell with block verification (Sun et al. 2025) instead of token-wise:",
         "#   speculative-t5 walltime_table --cell configs/demo/docstrings_t1.gin \\",
         "#       --cell configs/demo/docstrings_t1_block.gin --output_dir runs/block"),
        ("speculative_sampling", "block_verification"))}


def _sampled(cell: DemoCell) -> DemoCell:
    """An argmax draft cell at temperature 1 (its sampled twin)."""
    header = tuple(h.replace("argmax.", "temperature 1.").replace("_t0.gin", "_t1.gin")
                   for h in cell.header)
    return cell._replace(header=header, blocks=("speculative_sampling",))


# every zero-cost draft sampled too: a copy's one-hot q is accepted with probability p(copy)
DRAFT_CELLS.update({name.replace("_t0", "_t1"): _sampled(DRAFT_CELLS[name])
                    for name in ("docstrings_lookup_t0", "docstrings_fallback_t0",
                                 "docstrings_bigram_t0")})
# The demo's beam-search line: T5X's beam search (4 beams) against the exact speculative one.
BEAM_CELL = {"docstrings_beam4": DemoCell(
    ("# The demo pair's beam search: T5X's (4 beams, alpha 0.6) against the exact speculative",
     "# beam search (the draft's beam search drafts GAMMA tokens on 16 path rows per input,",
     "# the target checks them in one call): the same beams, fewer target calls.",
     "#   speculative-t5 walltime_table --cell configs/demo/docstrings_beam4.gin --output_dir runs/beam"),
    ("beam_search",), ("GAMMA = 2",), max_examples=16)}
RUN_DIRS = ("cells", "walltime", "gamma_sweep", "beam", "drafts")
FAMILIES = ("t5", "gpt2")


def cell_text(name: str, gamma: int = 4, num_examples: int = 32, temperature: float = 1.0,
              target: Optional[str] = None, draft: Optional[str] = None,
              vocab: Optional[str] = None, adaptive: bool = False) -> str:
    """A demo cell's gin config; with the defaults, the text of configs/demo/<name>.gin.
    adaptive: each round drafts 0..gamma (ADAPTIVE_GAMMA)."""
    cell = {**CELLS, **DRAFT_CELLS, **BEAM_CELL}[name]
    own = {line.split("=")[0].strip() for line in cell.lines}  # a cell's own GAMMA first
    num_examples = min(num_examples, cell.max_examples or num_examples)
    lines = [*cell.header, "include 'runs/paper.gin'", "include 'tasks/demo_docstrings.gin'",
             *(f"include 'decoding/{b}.gin'" for b in cell.blocks), "",
             *(f"{macro} = {value}" for macro, value in (("GAMMA", gamma),
                                                          ("NUM_EXAMPLES", num_examples))
               if macro not in own), *cell.lines]
    if name.endswith(("_t1", "_t1_block")) and temperature != 1.0:
        lines.append(f"TEMPERATURE = {float(temperature)!r}")
    if adaptive:
        lines.append("ADAPTIVE_GAMMA = True")
    for macro, path in (("TARGET_CHECKPOINT", target), (cell.draft_macro, draft),
                        ("VOCABULARY", vocab)):
        if path and macro:
            lines.append(f"{macro} = {os.path.abspath(path)!r}")
    return "\n".join(lines) + "\n"


def _write_cell(output_dir: str, name: str, *settings, **kwargs) -> str:
    """The named cell's config (`cell_text(name, *settings, **kwargs)`) in output_dir/cells/
    -> its path."""
    path = os.path.join(output_dir, "cells", name + ".gin")
    with open(path, "w") as f:
        f.write(cell_text(name, *settings, **kwargs))
    return path


def _write_cells(output_dir: str, names, *settings) -> List[str]:
    return [_write_cell(output_dir, name, *settings) for name in names]


def _fresh(output_dir: str) -> None:
    """The demo measures anew each time: remove the run directories an earlier demo wrote."""
    for name in RUN_DIRS:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
    os.makedirs(os.path.join(output_dir, "cells"), exist_ok=True)


@gin.configurable(denylist=["quiet"])
def demo(output_dir: Optional[str] = None, num_examples: int = 32, gamma: Optional[int] = None,
         temperature: float = 1.0, gammas: Sequence[int] = (1, 2, 3, 4),
         sweep_examples: int = 12, timing_rounds: Optional[int] = None, target: Optional[str] = None,
         draft: Optional[str] = None, vocab: Optional[str] = None, show: int = 3,
         family: str = "t5", drafts: bool = False, quiet: bool = False) -> Dict:
    """Run the demo; returns the summary also written to output_dir/summary.json (default
    runs/demo_output, runs/demo_gpt2 for family 'gpt2': the decoder-only demo on the
    shipped GPT-2 pair, `demo_gpt2`).
    gamma: None (the default): each setting (greedy, sampled) decodes as its own `gamma_sweep`
    over `gammas` on the demo's inputs chooses (`gamma_sweep.choose_gamma`: adaptive gamma
    where it measured at least as fast as the fastest fixed gamma, else the cost model's
    fastest fixed gamma); an int: both decode with that gamma.
    drafts: also run `walltime_table` over DRAFT_CELLS (prompt lookup, bigram, Fallback(lookup,
    draft), block verification at T = 1) for the table draft kind x verification (opt-in:
    it adds minutes to the demo; at the greedy setting's gamma).
    timing_rounds: rounds of the cost model's up-front part timing; default 3 for T5 (its
    drivers time every part again beside each example, and predict from those), 10 for
    GPT-2 (predicted from the up-front parts alone)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    output_dir = output_dir or ("runs/demo_gpt2" if family == "gpt2" else "runs/demo_output")
    if gamma is not None and (not isinstance(gamma, int) or gamma < 1):
        raise ValueError(f"gamma must be None (chosen by a sweep) or an int >= 1, got {gamma!r}")
    if family == "gpt2":
        return _gpt2(output_dir, num_examples, gamma or 4, temperature, timing_rounds or 10,
                     target, draft, vocab, show, quiet)
    t_start = time.perf_counter()
    if (target or draft or vocab) and not (target and draft and vocab):
        raise ValueError("give --target, --draft and --vocab together (or none: the shipped pair)")
    if not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(f"num_examples must be an int >= 1, got {num_examples!r}")
    _fresh(output_dir)
    pair = (num_examples, temperature, target, draft, vocab)
    rounds = [f"{driver}.timing_rounds = {timing_rounds or 3}"
              for driver in ("walltime_cell", "gamma_sweep_cell")]
    # first the sweep over both settings (fixed gammas and adaptive): what each decodes with
    sweeps = drivers.run(
        "gamma_sweep", _write_cells(output_dir, CELLS, gamma or 4, *pair),
        os.path.join(output_dir, "gamma_sweep"),
        bindings=[f"gamma_sweep_cell.gammas = {sorted(set(gammas))}",
                  "gamma_sweep_cell.one_width = True", "gamma_sweep_cell.adaptive = True",
                  f"gamma_sweep_cell.max_examples = {sweep_examples}", *rounds], quiet=quiet)
    choices = {name: choose_gamma(swept) if gamma is None else
               {"adaptive": False, "gamma": gamma, "why": f"gamma {gamma}, as asked"}
               for name, swept in zip(CELLS, sweeps)}
    cells = [_write_cell(output_dir, name, c["gamma"], *pair, adaptive=c["adaptive"])
             for name, c in choices.items()]
    greedy, sampled = drivers.run(
        "walltime_table", cells, os.path.join(output_dir, "walltime"),
        bindings=["walltime_cell.t5x_baseline = False", *rounds], quiet=quiet)
    beam, = drivers.run(
        "walltime_table", _write_cells(output_dir, BEAM_CELL, 4, *pair),
        os.path.join(output_dir, "beam"), quiet=quiet)
    extra = _draft_cells(output_dir, greedy["gamma"], *pair, rounds, quiet) if drafts else None
    shutil.copy(os.path.join(output_dir, "walltime", "docstrings_t0", "tokens_per_call.png"),
                os.path.join(output_dir, "tokens_per_call.png"))
    shutil.copy(os.path.join(output_dir, "gamma_sweep", "docstrings_t0", "speedup_vs_gamma.png"),
                os.path.join(output_dir, "speedup_vs_gamma.png"))
    summary = _summary(greedy, sampled, sweeps, choices, output_dir, temperature)
    summary["beam"] = {k: beam[k] for k in BEAM_KEYS}
    summary["compile_seconds"] += beam["compile_seconds"]
    if extra is not None:
        rows, seconds = extra
        summary["drafts"] = [_draft_row(r) for r in (greedy, sampled, *rows)]
        summary["drafts_seconds"] = seconds
    summary["seconds"] = time.perf_counter() - t_start
    records = RunDir(os.path.join(output_dir, "walltime", "docstrings_t0")).records()
    records = sorted(records, key=lambda r: r["index"])
    references = [r["reference"] for r in records]
    summary["quality"] = summary_quality(references, [r["plain_output"] for r in records])
    summary["quality_name_baseline"] = summary_quality(  # no model: what a pair must beat
        references, [name_baseline(r["input"]) for r in records])
    examples = records[:show]
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(output_dir, "report.md"), "w") as f:
        f.write(_report(summary, examples))
    if not quiet:
        _print(summary, examples, output_dir)
    return summary


def _draft_cells(output_dir, gamma, num_examples, temperature, target, draft, vocab, rounds,
                 quiet):
    """walltime_table over the draft cells -> (their rows, the seconds it took)."""
    t0 = time.perf_counter()
    cells = _write_cells(output_dir, DRAFT_CELLS, gamma, num_examples, temperature, target,
                         draft, vocab)
    rows = drivers.run("walltime_table", cells, os.path.join(output_dir, "drafts"),
                       bindings=["walltime_cell.t5x_baseline = False", *rounds], quiet=quiet)
    return rows, time.perf_counter() - t0


BEAM_KEYS = ("examples", "beam_size", "gamma", "beam_paths", "beam_steps_per_target_call",
             "target_calls_plain", "target_calls_spec", "speedup_measured",
             "identical_fraction", "max_score_diff", "ms_per_example_plain",
             "ms_per_example_spec")
DRAFT_KEYS = ("alpha", "coverage", "tokens_per_target_call", "c", "v", "speedup_measured",
              "speedup_predicted_full", "speedup_predicted", "identical_fraction")


def _draft_row(row: Dict) -> Dict:
    """A walltime row as a line of the draft table."""
    return {"cell": row["cell"], "draft": row["draft"], "verification": row["verification"],
            "temperature": row["temperature"], **{k: row.get(k) for k in DRAFT_KEYS}}


def _gpt2(output_dir, num_examples, gamma, temperature, timing_rounds, target, draft, vocab,
          show, quiet) -> Dict:
    """The GPT-2 demo: held-out stdlib modules' function bodies to complete."""
    from speculative_t5.checkpoints.demo import demo_paths
    from speculative_t5.data.code_corpus import heldout_prompts
    from speculative_t5.paper.demo_gpt2 import demo_gpt2
    if vocab:
        raise ValueError("a GPT-2 reads vocab.json + merges.txt from --target's directory; "
                         "--vocab is for T5")
    if bool(target) != bool(draft):
        raise ValueError("give --target and --draft together (or neither: the shipped pair)")
    paths = demo_paths("gpt2")
    return demo_gpt2(output_dir, heldout_prompts(), target or paths["target"],
                     draft or paths["draft"], num_examples, gamma, temperature,
                     timing_rounds=timing_rounds, show=show, quiet=quiet)


SETTING_KEYS = ("alpha", "alpha_ci95", "positions", "c", "v", "gamma", "tokens_per_target_call",
                "tokens_per_call_predicted", "speedup_measured", "speedup_predicted_full",
                "speedup_predicted", "speedup_predicted_paper", "measured_over_full",
                "plain_measured_over_predicted", "spec_measured_over_predicted",
                "tokens_per_s_plain", "tokens_per_s_spec", "target_step_ms", "interleave_ms",
                "compile_seconds")


def _setting(row: Dict, swept: Dict, choice: Dict) -> Dict:
    """One setting's figures: its walltime row, its sweep and the gamma chosen from it."""
    return dict({k: row[k] for k in SETTING_KEYS}, adaptive_gamma=bool(row.get("adaptive_gamma")),
                gamma_choice=choice["why"], gamma_sweep=swept["rows"],
                adaptive_sweep=swept["adaptive"], best_gamma_measured=swept["best_gamma_measured"],
                best_gamma_predicted_full=swept["best_gamma_predicted_full"],
                best_gamma_predicted=swept["best_gamma_predicted"])


def _summary(greedy: Dict, sampled: Dict, sweeps: List[Dict], choices: Dict, output_dir: str,
             temperature: float) -> Dict:
    run = RunDir(os.path.join(output_dir, "walltime", "docstrings_t0"))
    costs = timed.costs_of(timed.load_timing(run), run.records())  # the parts beside the decodes
    g_choice, t_choice = choices.values()
    out = _setting(greedy, sweeps[0], g_choice)
    out.update(greedy_identical_fraction=greedy["identical_fraction"],
               # the noise floor: plain greedy itself, batch 4 against batch 1
               plain_batch_identical_fraction=greedy["plain_batch_identical_fraction"],
               temperature_1=_setting(sampled, sweeps[1], t_choice), temperature=float(temperature),
               rouge1_plain=greedy.get("rouge1_plain"), rouge1_spec=greedy.get("rouge1_spec"),
               sweep_examples=sweeps[0]["examples_swept"], sweep_input_width=sweeps[0]["width_swept"],
               num_examples=greedy["examples"],
               compile_seconds=greedy["compile_seconds"] + sampled["compile_seconds"]
               + sum(s["compile_seconds"] for s in sweeps),
               setup_ms={str(w): {k: 1e3 * t for k, t in s.items()} for w, s in costs.setup.items()},
               device=f"{jax.devices()[0].platform} ({os.cpu_count()} cores, {RunDir.processor()})")
    return out


def _report(s: Dict, examples: List[Dict]) -> str:
    t1 = s["temperature_1"]
    lines = ["# speculative_t5 demo", "",
             f"{s['num_examples']} held-out inputs of the stdlib docstring task, batch 1, "
             f"{s['device']}. Run directories: walltime/, gamma_sweep/ (the paper drivers).", "",
             "| setting | alpha | tokens/target call | c | v | speedup measured | cost model | "
             "measured / cost model | eq. (5), measured v | eq. (5), v = 1 | identical to plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in (("greedy", s), (f"temperature {s['temperature']:g}", t1)):
        ident = (f"{s['greedy_identical_fraction']:.2f} (plain itself, batch 4 vs 1: "
                 f"{s['plain_batch_identical_fraction']:.2f})" if r is s else "n/a (sampled)")
        lines.append(f"| {name}, {_gamma(r)} | {r['alpha']:.3f} | {r['tokens_per_target_call']:.2f} | "
                     f"{r['c']:.3f} | {r['v']:.2f} | {r['speedup_measured']:.2f} | "
                     f"{_f(r['speedup_predicted_full'])} | {_f(r['measured_over_full'])} | "
                     f"{_f(r['speedup_predicted'])} | {_f(r['speedup_predicted_paper'])} | {ident} |")
    lines += ["", "Each setting's gamma, from its sweep on the demo's inputs (below): "
              f"greedy {s['gamma_choice']}; temperature {s['temperature']:g} {t1['gamma_choice']}."]
    lines += ["", _beam_line(s["beam"]) + " (beam/)."]
    lines += ["", f"Summaries (greedy): {_quality(s['quality'])}; no model, \"Return the "
              f"<function name>.\": {_quality(s['quality_name_baseline'])}.",
              "", "## Speedup against gamma", "",
              f"{s['sweep_examples']} inputs of the most common input width "
              f"({s['sweep_input_width']} tokens).", "",
              "| setting | gamma | tokens/call | v | measured | cost model | eq. (5), measured v | "
              "eq. (5), v = 1 |", "|---|---|---|---|---|---|---|---|"]
    for name, setting in (("greedy", s), (f"T = {s['temperature']:g}", t1)):
        for r in setting["gamma_sweep"]:
            lines.append(f"| {name} | {r['gamma']} | {r['tokens_per_target_call']:.2f} | "
                         f"{r['v']:.2f} | {r['speedup_measured']:.2f} | "
                         f"{r['speedup_predicted_full']:.2f} | {r['speedup_predicted']:.2f} | "
                         f"{r['speedup_predicted_paper']:.2f} |")
        a = setting["adaptive_sweep"]
        lines.append(f"| {name} | adaptive, at most {a['max_gamma']} | "
                     f"{a['tokens_per_target_call']:.2f} | | {a['speedup_measured']:.2f} | | | |")
    if "drafts" in s:
        lines += ["", "## Draft kind x verification", "",
                  f"walltime_table over configs/demo/ cells, gamma {s['gamma']}, "
                  f"{s['num_examples']} inputs each (drafts/ beside walltime/; "
                  f"{s['drafts_seconds']:.0f} s). alpha of prompt lookup: teacher-forced along "
                  "the target's text, no proposal counted as 0 (coverage: where it proposes).",
                  "", "| draft | verification | T | alpha | coverage | tokens/target call | c | "
                  "speedup measured | cost model | eq. (5), measured v | identical to plain |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in s["drafts"]:
            def f(v, spec=".2f"):
                return "" if v is None else format(v, spec)
            lines.append(f"| {r['draft']} | {r['verification']} | {r['temperature']:g} | "
                         f"{f(r['alpha'], '.3f')} | {f(r['coverage'])} | "
                         f"{f(r['tokens_per_target_call'])} | {f(r['c'], '.3f')} | "
                         f"{f(r['speedup_measured'])} | {f(r['speedup_predicted_full'])} | "
                         f"{f(r['speedup_predicted'])} | {f(r['identical_fraction'])} |")
    lines += ["", "![tokens per call](tokens_per_call.png) ![speedup vs gamma](speedup_vs_gamma.png)",
              "", "## Examples (greedy)", ""]
    for ex in examples:
        lines += [f"```python\n{source_of(ex['input'])[:400]}\n```",
                  f"- reference: {ex['reference']}", f"- plain: {ex['plain_output']}",
                  f"- speculative: {ex['spec_output']}", ""]
    return "\n".join(lines)


def _f(value: Optional[float]) -> str:
    """A ratio to two places; n/a where none applies (an adaptive decode's predictions)."""
    return "n/a" if value is None else f"{value:.2f}"


def _x(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _gamma(setting: Dict) -> str:
    return (f"adaptive gamma <= {setting['gamma']}" if setting["adaptive_gamma"]
            else f"gamma {setting['gamma']}")


def _beam_line(b: Dict) -> str:
    return (f"beam search ({b['beam_size']} beams, {b['examples']} inputs): speculative "
            f"(gamma {b['gamma']}, {b['beam_paths']} draft paths) same beams as T5X's "
            f"{b['identical_fraction']:.0%}, {b['beam_steps_per_target_call']:.2f} beam steps "
            f"per target call ({b['target_calls_spec']} target calls against "
            f"{b['target_calls_plain']}), walltime {b['speedup_measured']:.2f}x "
            f"({b['ms_per_example_spec']:.0f} against {b['ms_per_example_plain']:.0f} ms an input)")


def _quality(q: Dict) -> str:
    return (f"ROUGE-1 / 2 / Lsum {q['rouge1']:.1f} / {q['rouge2']:.1f} / {q['rougeLsum']:.1f}, "
            f"{q['real_words']:.1%} of words real (in the stdlib's docstrings)")


def _print(s: Dict, examples: List[Dict], output_dir: str) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console()
    table = Table(title="held-out inputs: plain vs speculative (greedy)", show_lines=True)
    for col in ("function (docstring removed)", "plain decode", "speculative decode"):
        table.add_column(col, overflow="fold")
    for ex in examples:
        src = source_of(ex["input"])
        table.add_row(src[:200] + ("..." if len(src) > 200 else ""), ex["plain_output"],
                      ex["spec_output"])
    console.print(table)
    t1 = s["temperature_1"]
    console.print(
        f"greedy: {s['gamma_choice']}\n"
        f"        identical outputs {s['greedy_identical_fraction']:.0%} (noise floor: plain batch 4 vs "
        f"batch 1 {s['plain_batch_identical_fraction']:.0%}), alpha {s['alpha']:.3f}, "
        f"{s['tokens_per_target_call']:.2f} tokens per target call, c {s['c']:.3f}, v {s['v']:.2f}\n"
        f"        speedup measured {s['speedup_measured']:.2f}x; predicted {_x(s['speedup_predicted_full'])} "
        f"(cost model: measured/predicted {_f(s['measured_over_full'])}), "
        f"{_x(s['speedup_predicted'])} (eq. 5 with measured v), "
        f"{_x(s['speedup_predicted_paper'])} (paper, v = 1)\n"
        f"T={s['temperature']:g}:  {t1['gamma_choice']}\n"
        f"        alpha {t1['alpha']:.3f}, {t1['tokens_per_target_call']:.2f} tokens per "
        f"target call, speedup measured {t1['speedup_measured']:.2f}x; predicted "
        f"{_x(t1['speedup_predicted_full'])} (cost model: {_f(t1['measured_over_full'])}) / "
        f"{_x(t1['speedup_predicted'])} / {_x(t1['speedup_predicted_paper'])}\n"
        f"{_beam_line(s['beam'])}\n"
        f"summaries: {_quality(s['quality'])} (no model, \"Return the <function name>.\": "
        f"{_quality(s['quality_name_baseline'])})\n"
        + "".join(f"{r['draft']}, {r['verification']}, T={r['temperature']:g}: "
                  f"{r['tokens_per_target_call']:.2f} tokens per target call, speedup measured "
                  f"{r['speedup_measured']:.2f}x, cost model {r['speedup_predicted_full']:.2f}x\n"
                  for r in s.get("drafts", ())) +
        f"wrote {output_dir}/summary.json, report.md, tokens_per_call.png, speedup_vs_gamma.png "
        f"and the drivers' run directories ({s['seconds']:.0f} s, {s['compile_seconds']:.0f} s "
        f"of it compiling)")
