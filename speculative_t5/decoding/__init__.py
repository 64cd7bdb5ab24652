"""Decoding: sampling rules, the plain, speculative and beam-search loops, and what they
output.

This layer knows only step functions (`logits, cache = step(cache, tokens, pos)`), never a
model: `speculative_t5.engine` builds those from models and calls the loops. `drafts`:
what proposes a speculative round's tokens (a model's step function, prompt lookup, a
bigram table) behind one protocol."""
from speculative_t5.decoding import drafts
from speculative_t5.decoding.output import BeamSearchOutput, GenerateOutput
from speculative_t5.decoding.sampling import SamplingConfig, adjust, verify, verify_block
