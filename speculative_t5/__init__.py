"""speculative_t5: exact speculative decoding for T5 encoder-decoder models in JAX/Flax.

Layers, each importing only from those listed before it:
  model, decoding, data      the T5 family; the model-free decode loops; inputs and tasks
  locks                      one writer per run directory or output file
  partitioning               the ('data', 'model') mesh and T5X's logical axis rules
  checkpoints                Hugging Face, T5X and native I/O (and the shipped demo pair)
  calibration                model steps timed where the decode runs (adaptive gamma's c, v)
  engine                     `generate`: step functions from models, the loops
  beam_engine                `beam_search` (with a draft: the speculative beam search)
  measure                    alpha, the paper's analysis, timing, the cost model, a tree's shape
  training                   train / distill
  paper                      the paper's drivers and cells, the demo, plots, run directories
  commands                   the `speculative-t5` command line
"""
from speculative_t5.model import (GPT2Config, Model, T5Config, cast_params, decode, encode, forward,
                                  init_cache, init_model, param_axes, param_shapes, preset_names)

__version__ = "0.1.0"
from speculative_t5.checkpoints import (CheckpointError, detect_format, export_hf,
                                        load_checkpoint, save_checkpoint)
from speculative_t5.checkpoints.demo import load_demo
from speculative_t5.decoding import BeamSearchOutput, GenerateOutput, SamplingConfig, drafts
from speculative_t5.calibration import GammaCosts
from speculative_t5.engine import gamma_costs, generate
from speculative_t5.beam_engine import beam_search
from speculative_t5.measure.tree_choice import choose_tree
from speculative_t5.partitioning import Partitioner
from speculative_t5 import data
