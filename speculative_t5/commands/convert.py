"""`speculative-t5 convert`: read any supported checkpoint, write it as native or Hugging Face."""
from __future__ import annotations

import os
from typing import Optional

import gin


@gin.configurable
def convert(source: str = gin.REQUIRED, destination: str = gin.REQUIRED, format: str = "native",
            dtype: Optional[str] = None, overwrite: bool = False) -> None:
    """Read any supported checkpoint and write it as native (orbax) or Hugging Face."""
    from speculative_t5.checkpoints import export_hf, load_checkpoint, save_checkpoint
    if format not in ("native", "hf"):
        raise SystemExit(f"error: --format must be 'native' or 'hf', got {format!r}")
    model = load_checkpoint(source, dtype=dtype)
    if format == "hf":
        if os.path.exists(destination) and os.listdir(destination) and not overwrite:
            raise SystemExit(f"error: {destination} exists and is not empty (pass --overwrite)")
        export_hf(model, destination)
    else:
        save_checkpoint(model, destination, overwrite=overwrite)
    c = model.config
    print(f"converted {source} -> {destination} ({format}): {model.num_params():,} parameters, "
          f"{c.num_encoder_layers}+{c.num_decoder_layers} layers, emb {c.emb_dim}, "
          f"vocab {c.vocab_size}, {c.param_dtype}")
