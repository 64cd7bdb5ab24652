"""Inputs: vocabularies, input files and padding (seqio tasks: speculative_t5.data.tasks)."""
from speculative_t5.data.inputs import (bucket, pad_rows, pad_to, read_inputs, tokenize,
                                        truncate)
from speculative_t5.data.bpe import BPEVocabulary
from speculative_t5.data.lookup import find_vocabulary
from speculative_t5.data.vocabulary import Vocabulary
