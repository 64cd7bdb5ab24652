"""How good the demo target's summaries are: ROUGE against the held-out references, and the
fraction of output words that are real words (they occur in the standard library's
docstrings) — a cheap check that a summary is English and not invented pieces
("viewerimect")."""
from __future__ import annotations

import ast
import functools
import re
from typing import Dict, FrozenSet, Optional, Sequence

from speculative_t5.data.demo_corpus import _SKIP_DIRS, stdlib_modules
from speculative_t5.data.tasks import rouge

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list:
    """Lower-cased runs of letters: "get_user() Returns" -> ['get', 'user', 'returns']."""
    return _WORD.findall(text.lower())


@functools.lru_cache(maxsize=2)
def docstring_words(stdlib: Optional[str] = None) -> FrozenSet[str]:
    """Every word of every module, class and function docstring of the standard library
    (the modules the demo corpus reads: tests and site-packages left out)."""
    vocab = set()
    for _, path in stdlib_modules(stdlib, skip=_SKIP_DIRS):
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    vocab.update(words(doc))
    return frozenset(vocab)


def real_word_fraction(texts: Sequence[str], known: Optional[FrozenSet[str]] = None) -> float:
    """Fraction of the texts' words (all texts pooled) found in `known` (default: the
    standard library's docstring words); nan for texts without words."""
    known = docstring_words() if known is None else known
    found = [w in known for t in texts for w in words(t)]
    return sum(found) / len(found) if found else float("nan")


def summary_quality(references: Sequence[str], outputs: Sequence[str]) -> Dict[str, float]:
    """ROUGE-1/2/Lsum (x 100, `tasks.rouge`) and the real-word fraction of the outputs."""
    if len(references) != len(outputs):
        raise ValueError(f"{len(references)} references for {len(outputs)} outputs")
    return {**rouge(references, outputs), "real_words": real_word_fraction(outputs)}
