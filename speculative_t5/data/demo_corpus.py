"""The demo corpus, built from a source every Python installation has: its standard library.

Each example is one documented function: input "summarize: " + the function's source with
its docstring removed (normalised by `ast.unparse`), target the docstring's first sentence.
Examples are split into train / validation / test by a hash of the module name, so no
module contributes to two splits. Nothing here is downloaded or committed."""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sysconfig
from typing import Dict, Iterator, List, Optional, Tuple

PREFIX = "summarize: "
SPLITS = ("train", "validation", "test")
_SKIP_DIRS = {"test", "tests", "site-packages", "idle_test", "lib2to3", "__pycache__",
              "ensurepip", "turtledemo"}


def split_of(module: str, validation: float = 0.05, test: float = 0.05) -> str:
    """Deterministic split from the module name alone (md5, not Python's salted hash)."""
    h = int(hashlib.md5(module.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test else "validation" if h < test + validation else "train"


def first_sentence(doc: str, max_words: int = 24) -> Optional[str]:
    """The docstring's first sentence (first paragraph up to '. '), or None if unusable."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    sentence = (m.group(1) if m else para).strip()
    words = sentence.split()
    if len(words) < 3 or len(words) > max_words or not sentence[0].isalpha():
        return None
    if any(bad in sentence for bad in (">>>", "::", "XXX", "TODO")):
        return None
    return sentence


def _functions(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def examples_from_source(source: str, module: str, max_source_chars: int = 1500) -> List[Dict]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in _functions(tree):
        doc = ast.get_docstring(node, clean=True)
        target = first_sentence(doc) if doc else None
        if target is None:
            continue
        body = node.body[1:] or [ast.Pass()]
        stripped = type(node)(**{**{f: getattr(node, f) for f in node._fields}, "body": body})
        try:
            code = ast.unparse(ast.fix_missing_locations(stripped))
        except (ValueError, RecursionError):
            continue
        if len(code) > max_source_chars:
            continue
        out.append({"module": module, "name": node.name, "input": PREFIX + code,
                    "target": target, "split": split_of(module)})
    return out


def stdlib_modules(stdlib: Optional[str] = None, skip=_SKIP_DIRS) -> Iterator[tuple]:
    """(module name, path) for every .py file of the standard library, in sorted order,
    outside the directories named in `skip`."""
    root = stdlib or sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path


def build_corpus(stdlib: Optional[str] = None) -> List[Dict]:
    """All examples, deterministic order (module path, then position in the file). Built
    once per process (parsing the standard library takes seconds); a fresh list each call."""
    return [dict(e) for e in _build_corpus(stdlib)]


@functools.lru_cache(maxsize=2)
def _build_corpus(stdlib: Optional[str]) -> Tuple[Dict, ...]:
    examples, seen = [], set()
    for module, path in stdlib_modules(stdlib):
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for ex in examples_from_source(source, module):
            if ex["input"] not in seen:  # a function copied into two modules would leak
                seen.add(ex["input"])    # across splits: keep its first occurrence only
                examples.append(ex)
    return tuple(examples)


def write_corpus(out_dir: str, stdlib: Optional[str] = None) -> Dict[str, int]:
    """Write {split}.jsonl and a text file for vocabulary training; returns split sizes."""
    os.makedirs(out_dir, exist_ok=True)
    corpus = build_corpus(stdlib)
    counts = {}
    for split in SPLITS:
        rows = [ex for ex in corpus if ex["split"] == split]
        counts[split] = len(rows)
        with open(os.path.join(out_dir, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(ex) + "\n" for ex in rows)
    with open(os.path.join(out_dir, "vocab_text.txt"), "w") as f:
        for ex in corpus:
            if ex["split"] == "train":
                f.write(ex["input"].replace("\n", " ") + "\n" + ex["target"] + "\n")
    return counts
