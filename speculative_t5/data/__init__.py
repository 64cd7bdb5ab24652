"""Inputs: vocabularies and input files (seqio tasks arrive with the paper drivers)."""
from speculative_t5.data.inputs import pad_rows, read_inputs, tokenize
from speculative_t5.data.vocabulary import Vocabulary, find_vocabulary
