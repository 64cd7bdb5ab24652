"""Training and distillation (optax, gin-configured, resumable): T5 (`trainer`) and the
decoder-only GPT-2 (`lm`)."""
from speculative_t5.training.lm import distill_lm, train_lm
from speculative_t5.training.trainer import (distill, fit, prepare_data, read_split,
                                             teacher_outputs, train)
