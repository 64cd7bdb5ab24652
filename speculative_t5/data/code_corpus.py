"""A code-completion corpus from the running Python's standard library: the decoder-only
(GPT-2) demo trains on it.

Every `.py` file outside tests, IDLE, tkinter, lib2to3 and site-packages, in sorted order,
deduplicated by content (a file copied into two places counts once, so it cannot leak
across splits). Modules are split into train and held-out by a hash of the module name
(`demo_corpus.split_of`: md5, not Python's salted hash), so no held-out module is ever
trained on. Written to a data directory:
  train.txt, heldout.txt   the split's sources, one file after another, each followed by
                           the end token `<|endoftext|>` (the BPE vocabulary's id 0);
  heldout.jsonl            completion prompts from held-out modules: `prompt` is the source
                           up to the first statement of a function body (whole lines, about
                           `context_chars` of them), `reference` the source that follows.
Nothing here is downloaded or committed."""
from __future__ import annotations

import ast
import hashlib
import json
import os
from typing import Dict, List, Optional, Tuple

from speculative_t5.data.bpe import END_OF_TEXT
from speculative_t5.data.demo_corpus import _SKIP_DIRS, split_of, stdlib_modules

SKIP_DIRS = _SKIP_DIRS | {"idlelib", "tkinter"}
HELDOUT = 0.05      # fraction of modules held out
SPLITS = ("train", "heldout")


def split_of_module(module: str) -> str:
    """'train' or 'heldout', from the module name alone."""
    return "heldout" if split_of(module, validation=0.0, test=HELDOUT) == "test" else "train"


def source_files(stdlib: Optional[str] = None,
                 max_files: Optional[int] = None) -> List[Tuple[str, str]]:
    """(module, source) for every kept standard-library file, sorted by path, the first of
    any set of identical files only; at most max_files of them."""
    out, seen = [], set()
    for module, path in stdlib_modules(stdlib, skip=SKIP_DIRS):
        if max_files is not None and len(out) >= max_files:
            break
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha1(source.encode()).hexdigest()
        if not source.strip() or digest in seen or END_OF_TEXT in source:
            continue
        seen.add(digest)
        out.append((module, source))
    return out


def _line_starts(source: str) -> List[int]:
    starts, offset = [0], 0
    for line in source.splitlines(keepends=True):
        offset += len(line)
        starts.append(offset)
    return starts


def body_starts(source: str) -> List[int]:
    """Character offsets of the line on which each function's body begins (its first
    statement after the docstring), in source order; [] for a file that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    starts = _line_starts(source)
    cuts = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if body and body[0].lineno > node.lineno:  # not a one-line `def f(): return x`
                cuts.add(starts[body[0].lineno - 1])
    return sorted(cuts)


def completion_prompts(source: str, module: str, context_chars: int = 600,
                       reference_chars: int = 160, per_module: int = 4) -> List[Dict]:
    """Up to per_module prompts, spread evenly over the module's function bodies that have
    a full context before them and a full reference after them."""
    starts = _line_starts(source)
    cuts = [c for c in body_starts(source)
            if c >= context_chars and c + reference_chars <= len(source)]
    if len(cuts) > per_module:
        cuts = [cuts[i * len(cuts) // per_module] for i in range(per_module)]
    rows = []
    for cut in cuts:
        begin = next(s for s in starts if s >= cut - context_chars)  # whole lines only
        rows.append({"module": module, "offset": cut, "prompt": source[begin:cut],
                     "reference": source[cut:cut + reference_chars]})
    return rows


def heldout_prompts(stdlib: Optional[str] = None, **prompt_kw) -> List[Dict]:
    """The held-out completion prompts (what heldout.jsonl holds), built in memory: dicts
    with module, offset, prompt, reference (the GPT-2 demo's examples)."""
    return [p for m, s in source_files(stdlib) if split_of_module(m) == "heldout"
            for p in completion_prompts(s, m, **prompt_kw)]


def write_code_corpus(out_dir: str, stdlib: Optional[str] = None,
                      max_files: Optional[int] = None, **prompt_kw) -> Dict[str, int]:
    """Write train.txt, heldout.txt and heldout.jsonl; returns files per split and prompts."""
    os.makedirs(out_dir, exist_ok=True)
    files = source_files(stdlib, max_files)
    counts = {}
    for split in SPLITS:
        kept = [(m, s) for m, s in files if split_of_module(m) == split]
        counts[split] = len(kept)
        with open(os.path.join(out_dir, f"{split}.txt"), "w", encoding="utf-8") as f:
            f.writelines(s + END_OF_TEXT for _, s in kept)
        if split == "heldout":
            prompts = [p for m, s in kept for p in completion_prompts(s, m, **prompt_kw)]
            counts["prompts"] = len(prompts)
            with open(os.path.join(out_dir, "heldout.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(p) + "\n" for p in prompts)
    return counts


def read_sources(data_dir: str, split: str) -> List[str]:
    """The split's source files, as `write_code_corpus` wrote them."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    with open(os.path.join(data_dir, f"{split}.txt"), encoding="utf-8") as f:
        return f.read().split(END_OF_TEXT)[:-1]


def read_prompts(data_dir: str) -> List[Dict]:
    """The held-out completion prompts: dicts with module, offset, prompt, reference."""
    with open(os.path.join(data_dir, "heldout.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]
