"""Plain text / TSV input files (one example a line; in TSV the first column is the input
and an optional second column the reference), and turning id sequences into the
fixed-shape int32 arrays the compiled decoders take."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np


def read_inputs(path: str, prefix: str = "") -> List[Tuple[str, Optional[str]]]:
    """[(input text, reference or None)]; empty lines are an error (they would shift ids)."""
    examples = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte "
                                 f"{e.start})") from None
            if not line.strip():
                raise ValueError(f"{path}:{lineno}: empty line (every line is one example)")
            text, _, ref = line.partition("\t") if path.endswith(".tsv") else (line, "", "")
            examples.append((prefix + text, ref or None))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def pad_rows(rows: np.ndarray, batch_size: int) -> np.ndarray:
    """rows [n <= batch_size, ...] filled up to a fixed batch with copies of the first row
    (fixed shapes compile once; callers drop the copies' outputs)."""
    return np.concatenate([rows, np.repeat(rows[:1], batch_size - len(rows), 0)])


def truncate(ids: Sequence[int], length: int, eos_id: int = 1) -> List[int]:
    """ids cut to `length`, EOS kept last (as seqio's append_eos_after_trim does)."""
    ids = list(ids)
    return ids if len(ids) <= length else ids[:length - 1] + [eos_id]


def pad_to(seqs: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """int32 [len(seqs), width]: each id sequence 0-padded on the right."""
    out = np.zeros((len(seqs), width), np.int32)
    for i, ids in enumerate(seqs):
        out[i, :len(ids)] = ids
    return out


def tokenize(texts: Sequence[str], vocab, length: int) -> np.ndarray:
    """int32 [N, length]: ids with EOS, truncated (EOS kept last) and 0-padded."""
    return pad_to([truncate(vocab.encode(t), length, vocab.eos_id) for t in texts], length)


def bucket(ids: Sequence[int], smallest: int = 32) -> np.ndarray:
    """int32 [1, W]: one input padded to the next power of two >= its length (>= smallest),
    so batch-1 decoding pays for the text, not for padding, while only a few shapes are
    compiled (as a server batching by length buckets would)."""
    n = max(len(ids), 1)
    return pad_to([ids], max(smallest, 1 << (n - 1).bit_length()))
