"""Training and distillation (optax, gin-configured, resumable)."""
from speculative_t5.training.trainer import (distill, fit, prepare_data, read_split,
                                             teacher_outputs, train)
