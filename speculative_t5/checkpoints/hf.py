"""Hugging Face T5 and GPT-2 checkpoints: `config.json` (its model_type, 't5' or 'gpt2',
picks the family) + `model.safetensors` (read with safetensors, no torch) or
`pytorch_model.bin` (needs torch), single-file or sharded with an index.

GPT-2 (`gpt2.hf_name`): our 'h_0/attn_c_attn/kernel' is HF's 'h.0.attn.c_attn.weight', with
or without the 'transformer.' prefix; Conv1D is already [in, out], so nothing is transposed;
`lm_head.weight`, when stored, must equal wte (the output is tied); the attention-mask
buffers older files hold ('h.N.attn.bias', 'h.N.attn.masked_bias') are skipped.

Name map (T5X path <- HF name; Linear weights are [out, in], T5X kernels [in, out]):
  token_embedder/embedding                <- shared.weight
  {enc,dec}oder/relpos_bias/rel_embedding <- {enc,dec}oder.block.0.layer.0.SelfAttention.relative_attention_bias.weight^T
  encoder/layers_i/attention/{query,key,value,out} <- encoder.block.i.layer.0.SelfAttention.{q,k,v,o}
  decoder/layers_i/self_attention         <- decoder.block.i.layer.0.SelfAttention
  decoder/layers_i/encoder_decoder_attention <- decoder.block.i.layer.1.EncDecAttention
  */mlp/{wi,wi_0,wi_1,wo}                 <- *.layer.{1 enc, 2 dec}.DenseReluDense.*
  decoder/logits_dense/kernel             <- lm_head.weight^T  (T5 1.1 only)
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, Tuple

import numpy as np

from speculative_t5.checkpoints.common import (CheckpointError, build_model, build_sharded,
                                               checked, expected_shapes, flat_params,
                                               slice_reader)
from speculative_t5.model import gpt2
from speculative_t5.model.api import FAMILIES, Model, ModelConfig
from speculative_t5.model.config import T5Config
from speculative_t5.model.gpt2 import GPT2Config

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)
# Present in HF files but not parameters of their own (tied copies, an unused bias).
_IGNORED = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
            "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}
_GPT2_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")  # causal masks, not weights
_GPT2_PREFIX = "transformer."
_ATTN = {"query": "q", "key": "k", "value": "v", "out": "o"}
_DEC_SUB = {"pre_self_attention_layer_norm": "0.layer_norm", "self_attention": "0.SelfAttention",
            "pre_cross_attention_layer_norm": "1.layer_norm",
            "encoder_decoder_attention": "1.EncDecAttention",
            "pre_mlp_layer_norm": "2.layer_norm", "mlp": "2.DenseReluDense"}
_ENC_SUB = {"pre_attention_layer_norm": "0.layer_norm", "attention": "0.SelfAttention",
            "pre_mlp_layer_norm": "1.layer_norm", "mlp": "1.DenseReluDense"}


def hf_name(path: str) -> Tuple[str, bool]:
    """T5X parameter path -> (HF tensor name, whether to transpose)."""
    parts = path.split("/")
    if path == "token_embedder/embedding":
        return "shared.weight", False
    if path == "decoder/logits_dense/kernel":
        return "lm_head.weight", True
    stack = parts[0]
    if parts[1] == "relpos_bias":
        return f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", True
    if parts[1] in ("encoder_norm", "decoder_norm"):
        return f"{stack}.final_layer_norm.weight", False
    m = re.fullmatch(r"layers_(\d+)", parts[1])
    if not m:
        raise KeyError(path)
    sub = (_ENC_SUB if stack == "encoder" else _DEC_SUB)[parts[2]]
    prefix = f"{stack}.block.{m.group(1)}.layer.{sub}"
    if parts[2].endswith("layer_norm"):
        return f"{prefix}.weight", False
    leaf = _ATTN.get(parts[3], parts[3])                       # q/k/v/o or wi/wi_0/wi_1/wo
    return f"{prefix}.{leaf}.weight", True


def _weight_files(path: str):
    for name in (SAFETENSORS_INDEX, TORCH_BIN_INDEX):
        index = os.path.join(path, name)
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
                files = sorted(set(weight_map.values()))
                if not all(isinstance(f, str) for f in files):
                    raise ValueError("file names must be strings")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{index}: not a valid weight index ({e})") from None
            root = os.path.realpath(path)
            for f in files:
                if not os.path.realpath(os.path.join(path, f)).startswith(root + os.sep):
                    raise CheckpointError(f"{index}: weight file {f!r} is outside the "
                                          "checkpoint directory")
            return [os.path.join(path, f) for f in files]
    for name in (SAFETENSORS, TORCH_BIN):
        if os.path.exists(os.path.join(path, name)):
            return [os.path.join(path, name)]
    raise CheckpointError(f"{path}: no {' or '.join(WEIGHT_FILES)} found")


def _read_tensors(file: str, lazy: bool = False) -> Dict[str, Any]:
    """{HF name: tensor} of one weight file: numpy arrays, or `_Lazy` ones (lazy=True) read
    a slice at a time (safetensors from its memory map, torch from a memory-mapped load)."""
    if not os.path.exists(file):
        raise CheckpointError(f"{file}: weight file listed in the index does not exist")
    if file.endswith(".safetensors"):
        import ml_dtypes  # noqa: F401  (numpy learns 'bfloat16', which safetensors asks for)
        from safetensors import SafetensorError, safe_open
        from safetensors.numpy import load_file
        try:
            if not lazy:
                return load_file(file)
            handle = safe_open(file, framework="numpy")
            slices = {k: handle.get_slice(k) for k in handle.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{file}: cannot read safetensors file ({e})") from None
        return {k: _Lazy(tuple(v.get_shape()), v.__getitem__, file, k) for k, v in slices.items()}
    try:
        import torch
    except ImportError:
        raise CheckpointError(f"{file}: reading pytorch_model.bin needs torch "
                              "(pip install torch), or convert it to model.safetensors") from None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=lazy)
    except Exception as e:  # torch raises several types for truncated/corrupt archives
        raise CheckpointError(f"{file}: cannot read PyTorch checkpoint ({type(e).__name__}: {e})") from None
    if lazy:
        return {k: _Lazy(tuple(v.shape), lambda index, v=v: _numpy(v[index]), file, k)
                for k, v in state.items()}
    return {k: _numpy(v) for k, v in state.items()}


def _numpy(t) -> np.ndarray:
    """A torch tensor as numpy (bfloat16, which numpy lacks, widened to float32)."""
    import torch
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


class _Lazy:
    """A tensor in a weight file, known by its shape until `read(index)` reads a slice."""

    def __init__(self, shape: tuple, getter: Callable[[tuple], Any], file: str, name: str):
        self.shape, self.getter, self.file, self.name = shape, getter, file, name

    def read(self, index: tuple) -> np.ndarray:
        try:
            return np.asarray(self.getter(index))
        except Exception as e:  # safetensors/torch raise several types on a corrupt file
            raise CheckpointError(f"{self.file}: cannot read tensor {self.name} "
                                  f"({type(e).__name__}: {e})") from None

    @property
    def T(self) -> "_Lazy":
        """HF Linear [out, in] -> T5X kernel [in, out]: slice the stored tensor at the
        reversed index and transpose only that slice."""
        return _Lazy(self.shape[::-1], lambda index: self.read(index[::-1]).T, self.file, self.name)


def read_hf_config(path: str) -> Tuple[ModelConfig, dict]:
    """(our config, the raw config.json dict) of a Hugging Face directory: a GPT2Config for
    model_type 'gpt2', a T5Config for 't5' (or none given, as old T5 files have)."""
    file = os.path.join(path, "config.json")
    try:
        with open(file) as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file}: cannot read Hugging Face config ({e})") from None
    if not isinstance(hf, dict):
        raise CheckpointError(f"{file}: not a Hugging Face config (a JSON object)")
    model_type = hf.get("model_type", "t5")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{file}: model_type {model_type!r} is not supported; known: "
                              f"{', '.join(FAMILIES)}")
    try:
        return FAMILIES[model_type].from_hf_config(hf), hf
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{file}: {e}") from None


def load_hf(path: str, config: ModelConfig | None = None, dtype: str | None = None,
            partitioner=None, role: str = "target") -> Model:
    """Read a Hugging Face T5 or GPT-2 directory into a Model (config from its config.json);
    with a partitioner each tensor is read slice by slice into its shards."""
    file_config, raw = read_hf_config(path)
    if config is not None and config.replace(param_dtype=file_config.param_dtype,
                                             dtype=file_config.dtype) != file_config:
        raise CheckpointError(f"{path}/config.json does not match the config given: "
                              f"{_diff(file_config, config)}")
    config = config or file_config
    if dtype:
        config = config.replace(param_dtype=dtype)
    tensors: Dict[str, Any] = {}
    origin: Dict[str, str] = {}
    for file in _weight_files(path):
        for k, v in _read_tensors(file, lazy=partitioner is not None).items():
            tensors[k], origin[k] = v, file
    if isinstance(config, GPT2Config):
        tensors, origin = _gpt2_tensors(tensors, origin, path)
        head = tensors.pop("lm_head.weight", None)
        name_of, ignored = (lambda key: (gpt2.hf_name(key), False)), set()
    else:
        _t5_aliases(tensors, config, raw)
        head, name_of, ignored = None, hf_name, _IGNORED | {"lm_head.weight"}
    flat, names, used = {}, {}, set()
    for key in expected_shapes(config):
        name, transpose = name_of(key)
        names[key] = f"{name} (in {origin.get(name, path)})"
        if tensors.get(name) is not None:
            flat[key] = tensors[name].T if transpose else tensors[name]
            used.add(name)
    extra = sorted(set(tensors) - used - ignored)
    if extra:
        raise CheckpointError(f"{path}: unexpected tensor(s) {', '.join(extra[:5])} for the "
                              f"architecture in config.json (in {origin[extra[0]]})")
    if head is not None and "wte" in flat and tuple(head.shape) != tuple(flat["wte"].shape):
        raise CheckpointError(f"{path}: tensor lm_head.weight has shape {tuple(head.shape)}, "
                              f"but wte.weight {tuple(flat['wte'].shape)}: this GPT-2's output "
                              f"layer is tied to wte (in {origin['lm_head.weight']})")
    if partitioner is not None:
        model = build_sharded(config, flat, path, names, partitioner, role)
    else:
        model = build_model(config, flat, path, names)
    if head is not None:
        _check_tied(model, head, f"{path} (in {origin['lm_head.weight']})")
    return model


def _t5_aliases(tensors: Dict[str, Any], config: T5Config, raw: dict) -> None:
    """The names T5 files store a tied tensor under, resolved in place."""
    if "shared.weight" not in tensors and "encoder.embed_tokens.weight" in tensors:
        tensors["shared.weight"] = tensors["encoder.embed_tokens.weight"]
    if (not config.logits_via_embedding and "lm_head.weight" not in tensors
            and raw.get("tie_word_embeddings", True)):
        # transformers >= 5 ties lm_head to shared (unscaled) and then saves it only once.
        tensors["lm_head.weight"] = tensors.get("shared.weight")


def _gpt2_tensors(tensors: Dict[str, Any], origin: Dict[str, str], path: str):
    """({HF GPT-2 name without 'transformer.': tensor}, {name: file}), mask buffers dropped;
    a name stored both with and without the prefix is an error."""
    out, files = {}, {}
    for k, v in tensors.items():
        name = k[len(_GPT2_PREFIX):] if k.startswith(_GPT2_PREFIX) else k
        if _GPT2_BUFFERS.fullmatch(name):
            continue
        if name in out:
            raise CheckpointError(f"{path}: tensor {name} is stored twice, with and without "
                                  f"the '{_GPT2_PREFIX}' prefix (in {files[name]}, {origin[k]})")
        out[name], files[name] = v, origin[k]
    return out, files


def _check_tied(model: Model, head: Any, source: str) -> None:
    """A stored lm_head.weight must equal the loaded wte (our GPT-2 ties its output layer
    to it): read shard by shard as wte is placed, so a partitioned load stays partitioned."""
    read, wte, seen = slice_reader(head), model.params["wte"], set()
    for shard in wte.addressable_shards:
        key = tuple((s.start, s.stop, s.step) for s in shard.index)
        if key in seen:
            continue
        seen.add(key)
        stored = checked(np.asarray(read(shard.index)), wte.dtype, source, "lm_head.weight")
        if not np.array_equal(stored, np.asarray(shard.data)):
            raise CheckpointError(f"{source}: tensor lm_head.weight differs from wte.weight; "
                                  "this GPT-2 ties its output layer to the token embedding, "
                                  "so an untied lm_head cannot be loaded")


def export_hf(model: Model, path: str) -> None:
    """Write config.json + model.safetensors that transformers loads: a T5 as
    T5ForConditionalGeneration, a GPT-2 as GPT2LMHeadModel (lm_head tied, so not stored)."""
    from safetensors.numpy import save_file
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for key, arr in flat_params(model).items():
        if model.decoder_only:
            name, transpose = _GPT2_PREFIX + gpt2.hf_name(key), False
        else:
            name, transpose = hf_name(key)
        arr = arr.T if transpose else arr
        tensors[name] = np.ascontiguousarray(arr)
    save_file(tensors, os.path.join(path, SAFETENSORS), metadata={"format": "pt"})
    umask = os.umask(0)  # safetensors writes 0600 whatever the umask: a shared checkpoint
    os.umask(umask)      # must be readable as config.json is
    os.chmod(os.path.join(path, SAFETENSORS), 0o666 & ~umask)
    cfg = model.config.to_hf_config()
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def _diff(a: ModelConfig, b: ModelConfig) -> str:
    if type(a) is not type(b):
        return f"a {type(a).__name__} in file vs a {type(b).__name__} given"
    da, db = a.to_dict(), b.to_dict()
    return ", ".join(f"{k}: {da[k]} in file vs {db[k]} given" for k in da if da[k] != db[k])
