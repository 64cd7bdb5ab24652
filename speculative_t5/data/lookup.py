"""Which vocabulary to use: the one named, or the first found in the model directories
(T5's SentencePiece model or GPT-2's BPE files). Above both vocabulary modules, so neither
imports the other."""
from __future__ import annotations

import os
from typing import Optional

from speculative_t5.data.bpe import BPEVocabulary, has_bpe
from speculative_t5.data.vocabulary import VOCAB_FILES, Vocabulary


def find_vocabulary(vocab: Optional[str], *model_dirs: Optional[str]):
    """`vocab` if given (a SentencePiece model, or a directory with GPT-2's vocab.json +
    merges.txt), else the first vocabulary found in the model directories: a SentencePiece
    model (T5) or GPT-2's BPE files (`bpe.BPEVocabulary`)."""
    if vocab:
        return BPEVocabulary(vocab) if os.path.isdir(vocab) else Vocabulary(vocab)
    for d in model_dirs:
        for name in VOCAB_FILES:
            if d and os.path.isfile(os.path.join(d, name)):
                return Vocabulary(os.path.join(d, name))
        if d and has_bpe(d):
            return BPEVocabulary(d)
    raise FileNotFoundError("no vocabulary: pass --vocab PATH or put spiece.model (T5) or "
                            "vocab.json + merges.txt (GPT-2) in the model directory "
                            f"({', '.join(filter(None, model_dirs))})")
