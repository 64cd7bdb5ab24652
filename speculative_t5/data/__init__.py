"""Inputs: vocabularies, input files and padding (seqio tasks: speculative_t5.data.tasks)."""
from speculative_t5.data.inputs import bucket, pad_rows, read_inputs, tokenize
from speculative_t5.data.vocabulary import Vocabulary, find_vocabulary
