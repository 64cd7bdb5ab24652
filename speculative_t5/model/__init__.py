"""The models: T5 (encoder-decoder) and GPT-2 (decoder-only): config presets, Flax modules,
and functional entry points."""
from speculative_t5.model.api import (Model, cast_params, decode, encode, forward, init_cache,
                                      init_model, param_axes, param_shapes)
from speculative_t5.model.config import T5Config, preset_names
from speculative_t5.model.gpt2 import GPT2Config
