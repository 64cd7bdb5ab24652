"""Checkpoint I/O: Hugging Face (T5 and GPT-2), T5X (legacy msgpack+tensorstore, orbax) and
native (orbax, both families).

`load_checkpoint(path)` detects the format from the directory's files; every reader checks
the full parameter tree (names, shapes, finite values) before returning a model."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple, Optional

from speculative_t5.checkpoints.common import CheckpointError
from speculative_t5.checkpoints.hf import WEIGHT_FILES, export_hf, load_hf
from speculative_t5.checkpoints.native import MARKER, load_native, save_native
from speculative_t5.checkpoints.t5x import (LEGACY_FILE, ORBAX_MARKERS, latest_step_dir,
                                            load_t5x)
from speculative_t5.model.api import Model, ModelConfig
from speculative_t5.model.config import T5Config

if TYPE_CHECKING:
    from speculative_t5.partitioning import Partitioner

FORMATS = ("hf", "native", "t5x", "t5x_orbax")


def detect_format(path: str) -> str:
    """'hf', 'native', 't5x' (legacy) or 't5x_orbax' from the files in `path`."""
    if path.startswith("gs://"):
        return "t5x"  # only T5X legacy checkpoints are read from GCS (through tensorstore)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: checkpoint directory does not exist"
                              if not os.path.exists(path) else f"{path}: not a directory")
    files = set(os.listdir(path))
    if "config.json" in files and files & set(WEIGHT_FILES):
        return "hf"
    if MARKER in files:
        return "native"
    if LEGACY_FILE in files:
        return "t5x"
    if files & set(ORBAX_MARKERS) or (
            os.path.isdir(os.path.join(path, "state"))
            and set(os.listdir(os.path.join(path, "state"))) & set(ORBAX_MARKERS)):
        return "t5x_orbax"
    raise CheckpointError(
        f"{path}: unknown checkpoint format (expected config.json + model.safetensors or "
        f"pytorch_model.bin for Hugging Face, {MARKER} for native, '{LEGACY_FILE}' for T5X, "
        f"or an orbax checkpoint; found {sorted(files)[:8]})")


def load_checkpoint(path: str, config: Optional[ModelConfig] = None, dtype: Optional[str] = None,
                    format: Optional[str] = None, activation_dtype: Optional[str] = None,
                    partitioner: Optional["Partitioner"] = None, role: str = "target") -> Model:
    """Load a T5 from a Hugging Face, T5X or native directory, or a GPT-2 from a Hugging
    Face or native one (the directory's config says which).

    config: optional; checked against the checkpoint (T5X stores none, so it is inferred).
    dtype:  parameter dtype to hold in memory ('float32', 'bfloat16'); default as configured.
    activation_dtype: the dtype the model computes in (T5X's `ACTIVATION_DTYPE`; T5X runs
            bfloat16 on TPU); default as configured (float32). Logits stay float32.
    partitioner: a `Partitioner`: every parameter is read shard by shard straight onto its
            devices as `partitioner.param_shardings(config, role)` places it, so no process
            holds the whole model (role 'target' or 'draft': a replicated draft is whole on
            every device). A dimension the mesh does not divide is a ValueError.
    A T5X model dir holding checkpoint_<step>/ subdirectories loads its latest step."""
    if role not in ("target", "draft"):
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    path = os.fspath(path)
    if format is None and os.path.isdir(path) and not (
            set(os.listdir(path)) & ({"config.json", MARKER, LEGACY_FILE} | set(ORBAX_MARKERS))):
        path = latest_step_dir(path) or path
    fmt = format or detect_format(path)
    if fmt == "hf":
        model = load_hf(path, config, dtype, partitioner, role)
    elif fmt == "native":
        model = load_native(path, config, dtype, partitioner, role)
    elif fmt in ("t5x", "t5x_orbax"):
        if config is not None and not isinstance(config, T5Config):
            raise CheckpointError(f"{path}: a T5X checkpoint holds a T5, not a "
                                  f"{type(config).__name__}")
        model = load_t5x(path, config, dtype, fmt, partitioner, role)
    else:
        raise CheckpointError(f"unknown checkpoint format {fmt!r}; known: {FORMATS}")
    if activation_dtype is not None:
        model = Model(model.config.replace(dtype=activation_dtype), model.params)
    return model


ZERO_COST = "prompt_lookup"
BIGRAM = "bigram"
SPEC_FORMS = (f"a checkpoint path, '{ZERO_COST}[:MAX[:MIN]]', '{BIGRAM}:TABLE.npz' or "
              "'FIRST,THEN'")


class BigramFile(NamedTuple):
    """A 'bigram:PATH' part of a draft spec: a table `Bigram.save` (or `speculative-t5
    fit_bigram`) wrote, read by `load_draft`."""
    path: str


def draft_parts(spec: str) -> list:
    """The parts of a draft spec (see `load_draft`), each a checkpoint path, a
    `PromptLookup` or a `BigramFile`; a malformed spec is a ValueError (nothing is loaded;
    a bigram table must exist)."""
    from speculative_t5.decoding.drafts import PromptLookup
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"draft must be {SPEC_FORMS}, got {spec!r}")
    parts = spec.split(",")
    if len(parts) > 2:
        raise ValueError(f"draft {spec!r}: at most two drafts, 'FIRST,THEN' (a fallback)")
    out = []
    for part in parts:
        name, *ngrams = part.strip().split(":")
        if name == BIGRAM:
            path = part.strip()[len(BIGRAM) + 1:]
            if not path:
                raise ValueError(f"draft {part!r}: '{BIGRAM}:PATH', PATH a table from "
                                 "Bigram.save or `speculative-t5 fit_bigram`")
            if not os.path.isfile(path):
                raise ValueError(f"draft {part!r}: no bigram table at {path}")
            out.append(BigramFile(path))
            continue
        if name != ZERO_COST:
            out.append(part.strip())
            continue
        try:
            sizes = [int(n) for n in ngrams]
            if len(sizes) > 2:
                raise ValueError
        except ValueError:
            raise ValueError(f"draft {part!r}: '{ZERO_COST}', '{ZERO_COST}:MAX_NGRAM' or "
                             f"'{ZERO_COST}:MAX_NGRAM:MIN_NGRAM' (integers)") from None
        try:
            out.append(PromptLookup(*sizes))
        except ValueError as e:  # out of range: name the spec too
            raise ValueError(f"draft {part.strip()!r}: {e}") from None
    return out


def names_a_model(spec: str) -> bool:
    """Whether a draft spec is one draft model checkpoint (what a token tree expands)."""
    parts = draft_parts(spec)
    return len(parts) == 1 and isinstance(parts[0], str)


def load_draft(spec: str, vocab_size: Optional[int] = None, **load_kwargs):
    """A draft from its command-line / gin spec:
       PATH                          a draft model checkpoint (`load_checkpoint(PATH, ...)`)
       prompt_lookup[:MAX[:MIN]]     `PromptLookup(max_ngram=MAX (3), min_ngram=MIN (1))`
       bigram:TABLE.npz              `Bigram.load(TABLE.npz)` (the paper's bigram draft)
       FIRST,THEN                    `Fallback(FIRST, THEN)`, e.g. 'prompt_lookup,PATH'
    vocab_size: the target's, when known: a table of another size is refused before its
    data is read. load_kwargs go to `load_checkpoint` (role 'draft'). A table that is not
    one (truncated, hostile header, bad rows) is a one-line ValueError naming it."""
    from speculative_t5.decoding.drafts import Bigram, Fallback
    drafts = [load_checkpoint(p, role="draft", **load_kwargs) if isinstance(p, str) else
              Bigram.load(p.path, vocab_size) if isinstance(p, BigramFile) else p
              for p in draft_parts(spec)]
    return drafts[0] if len(drafts) == 1 else Fallback(*drafts)


def save_checkpoint(model: Model, path: str, overwrite: bool = False) -> None:
    """Write `model` in the native format (orbax params + speculative_t5.json)."""
    save_native(model, path, overwrite)


__all__ = ["BigramFile", "CheckpointError", "FORMATS", "detect_format", "draft_parts", "export_hf",
           "load_checkpoint", "load_draft", "save_checkpoint"]
