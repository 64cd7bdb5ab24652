"""Decoding: sampling rules, the plain and speculative loops, and what they output.

This layer knows only step functions (`logits, cache = step(cache, tokens, pos)`), never a
model: `speculative_t5.generate` builds those from models and calls the loops."""
from speculative_t5.decoding.output import GenerateOutput
from speculative_t5.decoding.sampling import SamplingConfig, adjust, verify, verify_block
