"""Decoding: sampling rules, the plain and speculative loops, and `generate`."""
from speculative_t5.decoding.generate import generate
from speculative_t5.decoding.output import GenerateOutput
from speculative_t5.decoding.sampling import SamplingConfig, adjust, verify
