"""`speculative-t5 convert`: read any supported checkpoint, write it as native or Hugging Face.

The destination is built in a temporary directory beside it and moved into place only when
complete (with --overwrite, replacing the old one then), so an interrupted or failed convert
leaves the destination as it was, never half old and half new."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

import gin

from speculative_t5.commands import interrupt


def _check_paths(source: str, destination: str, overwrite: bool) -> None:
    src, dst = os.path.realpath(source), os.path.realpath(destination)
    if os.path.exists(destination) and not os.path.isdir(destination):
        raise ValueError(f"--to {destination} is a file; give a directory")
    if src == dst or dst.startswith(src + os.sep) or src.startswith(dst + os.sep):
        raise ValueError(f"--to {destination} and --from {source} overlap; write elsewhere")
    if os.path.isdir(destination) and os.listdir(destination) and not overwrite:
        raise ValueError(f"{destination} exists and is not empty (pass --overwrite to replace it)")


@gin.configurable
def convert(source: str = gin.REQUIRED, destination: str = gin.REQUIRED, format: str = "native",
            dtype: Optional[str] = None, overwrite: bool = False) -> None:
    """Read any supported checkpoint and write it as native (orbax) or Hugging Face."""
    from speculative_t5.checkpoints import export_hf, load_checkpoint, save_checkpoint
    if format not in ("native", "hf"):
        raise ValueError(f"--format must be 'native' or 'hf', got {format!r}")
    _check_paths(source, destination, overwrite)
    model = load_checkpoint(source, dtype=dtype)
    parent = os.path.dirname(os.path.abspath(destination))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(destination))}.tmp-",
                            dir=parent)
    cancel = interrupt.on_interrupt(lambda: shutil.rmtree(work, ignore_errors=True))
    try:
        built = os.path.join(work, "new")
        if format == "hf":
            export_hf(model, built)
        else:
            save_checkpoint(model, built)
        if os.path.exists(destination):  # swap: the old one is removed only once the new is in
            os.rename(destination, os.path.join(work, "old"))
        os.rename(built, destination)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        cancel()
    c = model.config
    shape = (f"GPT-2, {c.n_layer} layers, emb {c.n_embd}" if model.decoder_only else
             f"{c.num_encoder_layers}+{c.num_decoder_layers} layers, emb {c.emb_dim}")
    print(f"converted {source} -> {destination} ({format}): {model.num_params():,} parameters, "
          f"{shape}, vocab {c.vocab_size}, {c.param_dtype}")
