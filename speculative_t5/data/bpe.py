"""GPT-2's byte-level BPE vocabulary (`vocab.json` + `merges.txt`, as a Hugging Face GPT-2
directory holds them), read with the `tokenizers` package.

Prompts carry no end token (a decoder-only model continues them); `decode` stops at the
first end token, as `Vocabulary.decode` does for T5."""
from __future__ import annotations

import json
import os
from typing import List, Sequence

from speculative_t5.data.vocabulary import BaseVocabulary

BPE_FILES = ("vocab.json", "merges.txt")
END_OF_TEXT = "<|endoftext|>"


def has_bpe(directory: str) -> bool:
    return bool(directory) and all(os.path.isfile(os.path.join(directory, f)) for f in BPE_FILES)


class BPEVocabulary(BaseVocabulary):
    """Encode text to ids (no end token appended) and decode ids to text (up to the end
    token). `path` is the directory; `files` the two files (both part of a run's identity)."""

    def __init__(self, directory: str):
        missing = [f for f in BPE_FILES if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            raise FileNotFoundError(f"{directory}: no GPT-2 tokenizer ({' and '.join(missing)} "
                                    "missing; a GPT-2 directory holds vocab.json + merges.txt)")
        try:
            from tokenizers import ByteLevelBPETokenizer
        except ImportError:
            raise ImportError("GPT-2 tokenizers need the `tokenizers` package: "
                              "pip install tokenizers") from None
        self.path = directory
        self.files = tuple(os.path.join(directory, f) for f in BPE_FILES)
        try:
            self.tokenizer = ByteLevelBPETokenizer(*self.files, add_prefix_space=False)
        except Exception as e:  # tokenizers raises its own exception type for bad files
            raise ValueError(f"{directory}: cannot read vocab.json / merges.txt ({e})") from None
        with open(self.files[0]) as f:
            vocab = json.load(f)
        if END_OF_TEXT not in vocab:
            raise ValueError(f"{self.files[0]}: has no {END_OF_TEXT!r} token (GPT-2's end token)")
        self.eos_id = self.pad_id = int(vocab[END_OF_TEXT])

    @property
    def size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> List[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(self._until_eos(ids))


def train_bpe(texts, directory: str, vocab_size: int) -> BPEVocabulary:
    """A byte-level BPE (GPT-2's kind) fitted to `texts`, written to directory as vocab.json +
    merges.txt; the end token is id 0."""
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=[END_OF_TEXT], show_progress=False)
    os.makedirs(directory, exist_ok=True)
    tok.save_model(directory)
    return BPEVocabulary(directory)
