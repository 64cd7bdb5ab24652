"""speculative_t5: exact speculative decoding for T5 encoder-decoder models in JAX/Flax."""
from speculative_t5.model import (Model, T5Config, cast_params, decode, encode, forward,
                                  init_cache, init_model, param_axes, param_shapes, preset_names)

__version__ = "0.1.0"
from speculative_t5.checkpoints import (CheckpointError, detect_format, export_hf,
                                        load_checkpoint, save_checkpoint)
from speculative_t5.decoding import GenerateOutput, generate
from speculative_t5 import data
from speculative_t5.demo import load_demo
