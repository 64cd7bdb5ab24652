"""Our native format: `speculative_t5.json` (format version, model family, config) beside
an orbax `params/` directory holding the parameter tree (T5X's names for T5, ours for GPT-2).
The family is 't5' or 'gpt2'; files written before GPT-2 existed have none and are T5."""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import numpy as np
from flax import traverse_util

from speculative_t5.checkpoints.common import (CheckpointError, build_model, check_shapes,
                                               flat_params, orbax_metadata, orbax_shapes,
                                               restore_orbax)
from speculative_t5.model.api import FAMILIES, Model, ModelConfig, family

MARKER = "speculative_t5.json"
FORMAT_VERSION = 1


def save_native(model: Model, path: str, overwrite: bool = False) -> None:
    import orbax.checkpoint as ocp
    path = os.path.abspath(path)
    if os.path.exists(path) and os.listdir(path):
        if not overwrite:
            raise FileExistsError(f"{path} exists and is not empty (pass overwrite=True)")
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)
    params = traverse_util.unflatten_dict(flat_params(model), sep="/")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(path, "params"), params)
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump({"format": "speculative_t5", "version": FORMAT_VERSION,
                   "family": family(model.config),
                   "config": model.config.to_dict()}, f, indent=2)


def read_native_config(path: str) -> ModelConfig:
    """The config a native directory's speculative_t5.json records (no weights read)."""
    marker = os.path.join(path, MARKER)
    try:
        with open(marker) as f:
            meta = json.load(f)
        name = meta.get("family", "t5")
        if name not in FAMILIES:
            raise ValueError(f"model family {name!r} is not supported; known: "
                             f"{', '.join(FAMILIES)}")
        config = FAMILIES[name].from_dict(meta["config"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{marker}: cannot read model config ({type(e).__name__}: {e})") from None
    if meta.get("version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{marker}: format version {meta.get('version')} is newer than "
                              f"this speculative_t5 reads ({FORMAT_VERSION})")
    return config


def load_native(path: str, config: Optional[ModelConfig] = None, dtype: Optional[str] = None,
                partitioner=None, role: str = "target") -> Model:
    """A native directory; with a partitioner each tensor is restored into its shards."""
    import orbax.checkpoint as ocp
    marker = os.path.join(path, MARKER)
    file_config = read_native_config(path)
    if config is not None and config.replace(dtype=file_config.dtype,
                                             param_dtype=file_config.param_dtype) != file_config:
        raise CheckpointError(f"{marker}: the checkpoint's config differs from the config given")
    config = config or file_config
    if dtype:
        config = config.replace(param_dtype=dtype)
    params_dir = os.path.join(os.path.abspath(path), "params")
    if partitioner is not None:
        return restore_orbax(params_dir, config, orbax_metadata(params_dir), partitioner, role)
    check_shapes(config, orbax_shapes(params_dir), params_dir)  # before restoring anything
    try:
        with ocp.StandardCheckpointer() as ckptr:
            tree = ckptr.restore(params_dir)
    except Exception as e:  # orbax surfaces tensorstore/json failures as many types
        raise CheckpointError(f"{params_dir}: cannot restore parameters "
                              f"({type(e).__name__}: {e})") from None
    flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep="/").items()}
    return build_model(config, flat, params_dir)
