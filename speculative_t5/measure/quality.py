"""How good the demo target's summaries are: ROUGE against the held-out references, and the
fraction of output words that are real words (they occur in the standard library's
docstrings) — a cheap check that a summary is English and not invented pieces
("viewerimect")."""
from __future__ import annotations

import re
from typing import Dict, FrozenSet, Optional, Sequence

from speculative_t5.data.demo_corpus import docstring_words, name_words, words
from speculative_t5.data.tasks import rouge


def real_word_fraction(texts: Sequence[str], known: Optional[FrozenSet[str]] = None) -> float:
    """Fraction of the texts' words (all texts pooled) found in `known` (default: the
    standard library's docstring words); nan for texts without words."""
    known = docstring_words() if known is None else known
    found = [w in known for t in texts for w in words(t)]
    return sum(found) / len(found) if found else float("nan")


def name_baseline(source: str) -> str:
    """The summary a reader could write with no model at all: "Return the <the first
    function's name as words>." ("def _type_repr(obj):" -> "Return the type repr."; "" when
    the source defines none). A target that scores below it has not learnt the task."""
    m = re.search(r"\bdef\s+(\w+)", source)
    named = name_words(m.group(1)) if m else []
    return f"Return the {' '.join(named)}." if named else ""


def summary_quality(references: Sequence[str], outputs: Sequence[str]) -> Dict[str, float]:
    """ROUGE-1/2/Lsum (x 100, `tasks.rouge`) and the real-word fraction of the outputs."""
    if len(references) != len(outputs):
        raise ValueError(f"{len(references)} references for {len(outputs)} outputs")
    return {**rouge(references, outputs), "real_words": real_word_fraction(outputs)}
