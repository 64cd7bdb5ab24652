"""T5's SentencePiece vocabulary (pad 0, eos 1, unk 2), by path or from a model directory."""
from __future__ import annotations

import os
from typing import List, Sequence

VOCAB_FILES = ("spiece.model", "sentencepiece.model", "vocab.model")


def _read_bytes(path: str) -> bytes:
    """A local file, or a remote one (gs://..., as T5's public vocabulary is) through
    TensorFlow's filesystem layer (the `data` extra)."""
    if "://" in path:
        try:
            import tensorflow as tf
        except ImportError:
            raise ImportError(f"reading {path} needs TensorFlow: pip install "
                              "'speculative_t5[data]'") from None
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f"SentencePiece model {path} does not exist")
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SentencePiece model {path} does not exist")
    with open(path, "rb") as f:
        return f.read()


class BaseVocabulary:
    """What T5's and GPT-2's vocabularies share: `size`, the check that a model has a row
    for every token, and decoding's stop at the first end token (pads dropped)."""
    path: str
    eos_id: int
    pad_id: int

    @property
    def size(self) -> int:
        raise NotImplementedError

    def check_fits(self, vocab_size: int) -> None:
        """A model with vocab_size output rows must have a row for every token."""
        if self.size > vocab_size:
            raise ValueError(f"vocabulary {self.path} has {self.size} tokens, more than the "
                             f"model's vocab_size {vocab_size}")

    def _until_eos(self, ids: Sequence[int]) -> List[int]:
        out = []
        for i in map(int, ids):
            if i == self.eos_id:
                break
            if i != self.pad_id:
                out.append(i)
        return out


class Vocabulary(BaseVocabulary):
    """Encode text to ids (EOS appended, as T5 inputs carry it) and decode ids to text."""

    def __init__(self, path: str):
        import sentencepiece as spm
        self.path = path
        self.sp = spm.SentencePieceProcessor()
        proto = _read_bytes(path)
        try:
            self.sp.LoadFromSerializedProto(proto)
        except (OSError, RuntimeError) as e:
            raise ValueError(f"{path}: not a SentencePiece model ({e})") from None
        self.eos_id = self.sp.eos_id()
        self.pad_id = self.sp.pad_id()
        if (self.pad_id, self.eos_id) != (0, 1):
            raise ValueError(f"{path}: T5 vocabularies have pad 0 and eos 1, this one has pad "
                             f"{self.pad_id} and eos {self.eos_id}")

    @property
    def size(self) -> int:
        return self.sp.GetPieceSize()

    def encode(self, text: str) -> List[int]:
        return list(self.sp.EncodeAsIds(text)) + [self.eos_id]

    def decode(self, ids: Sequence[int]) -> str:
        """Text up to the first EOS; ids past the vocabulary (T5 models have 32128 rows for
        32100 pieces) decode as unk, as seqio does."""
        size, unk = self.size, self.sp.unk_id()
        return self.sp.DecodeIds([i if i < size else unk for i in self._until_eos(ids)])
