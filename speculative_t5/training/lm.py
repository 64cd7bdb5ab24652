"""Decoder-only (GPT-2) training on the standard library's source: a target trained with
next-token cross-entropy, a draft distilled from it (forward KL per token, as `distill` does
for T5). Both run through `trainer.fit`, so they resume the same way: a rerun continues
from the latest orbax checkpoint in MODEL_DIR/checkpoints; once every step is done, the
final model is written to MODEL_DIR/model and MODEL_DIR/hf (config.json, model.safetensors,
vocab.json, merges.txt). A rerun with other settings is refused and `restart` starts over, as
for `trainer.train` (the window and corpus options are part of the run).

The data is the token stream of the train split (files joined by the end token, id 0) cut
into windows of `window` + 1 tokens: the model reads the first `window`, predicts the last.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.checkpoints import load_checkpoint
from speculative_t5.data.bpe import BPEVocabulary, has_bpe, train_bpe
from speculative_t5.data.code_corpus import read_sources, write_code_corpus
from speculative_t5.model import gpt2
from speculative_t5.model.api import Model
from speculative_t5.model.gpt2 import GPT2Config
from speculative_t5.training.runs import open_run, settings, sha256_of
from speculative_t5.training.trainer import SCHEDULE, _fit_and_export, _fit_kwargs

CONFIG_FILE = "config.json"   # the run's GPT2Config (`to_dict`), beside checkpoints/


# ----------------------------------------------------------------------------- data
def prepare_code_data(data_dir: str, vocab_size: int,
                      max_files: Optional[int] = None) -> BPEVocabulary:
    """The code corpus and its byte-level BPE (data_dir/bpe) in data_dir, built if missing."""
    if not os.path.exists(os.path.join(data_dir, "train.txt")):
        write_code_corpus(data_dir, max_files=max_files)
    bpe_dir = os.path.join(data_dir, "bpe")
    if not has_bpe(bpe_dir):
        return train_bpe(read_sources(data_dir, "train"), bpe_dir, vocab_size)
    return BPEVocabulary(bpe_dir)


def token_stream(data_dir: str, split: str, vocab: BPEVocabulary) -> np.ndarray:
    """The split's files encoded, each followed by the end token: int32 [N] (cached)."""
    cache = os.path.join(data_dir, f"{split}_tokens.npy")
    if os.path.exists(cache):
        return np.load(cache)
    encoded = vocab.tokenizer.encode_batch(read_sources(data_dir, split))
    stream = np.concatenate([np.append(np.asarray(e.ids, np.int32), np.int32(vocab.eos_id))
                             for e in encoded]).astype(np.int32)
    np.save(cache, stream)
    return stream


def token_windows(stream: np.ndarray, window: int) -> np.ndarray:
    """Consecutive windows [N, window + 1] with stride `window` (each shares its last token
    with the next window's first, so every token is predicted once)."""
    n = (len(stream) - 1) // window
    if n < 1:
        raise ValueError(f"a token stream of {len(stream)} is shorter than one window "
                         f"({window} + 1)")
    return stream[np.arange(n)[:, None] * window + np.arange(window + 1)[None, :]]


def _windows(data_dir: str, split: str, vocab: BPEVocabulary, config: GPT2Config, window: int,
             max_windows: Optional[int]) -> np.ndarray:
    vocab.check_fits(config.vocab_size)
    if config.eos_id != vocab.eos_id:
        raise ValueError(f"GPT2Config.eos_id is {config.eos_id} but the vocabulary's end token "
                         f"is {vocab.eos_id} (bind GPT2Config.eos_id and pad_id to it)")
    if window > config.n_positions:
        raise ValueError(f"window {window} is longer than n_positions {config.n_positions}")
    return token_windows(token_stream(data_dir, split, vocab), window)[:max_windows]


def next_token_nll(config: GPT2Config, params, tokens: jax.Array) -> jax.Array:
    """-log p(token t+1 | tokens <= t) for windows [B, W+1] -> [B, W]."""
    logp = jax.nn.log_softmax(gpt2.forward(config, params, tokens[:, :-1]), -1)    # [B, W, V]
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]


def heldout_loss(model: Model, windows: np.ndarray, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats) of `model` over windows [N, W+1]."""
    nll = jax.jit(next_token_nll, static_argnums=0)
    total = sum(float(jnp.sum(nll(model.config, model.params, windows[i:i + batch_size])))
                for i in range(0, len(windows), batch_size))
    return total / (len(windows) * (windows.shape[1] - 1))


# ----------------------------------------------------------------------------- teacher
def _write_config(model_dir: str, config: GPT2Config) -> None:
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, CONFIG_FILE), "w") as f:
        json.dump(config.to_dict(), f, indent=2)


def load_trained(model_dir: str) -> Model:
    """The final float32 model of a finished train_lm run, from its last orbax checkpoint
    (needs no exported copy); an unfinished run is a ValueError."""
    import orbax.checkpoint as ocp
    with open(os.path.join(model_dir, CONFIG_FILE)) as f:
        config = GPT2Config.from_dict(json.load(f))
    with open(os.path.join(model_dir, "train_log.json")) as f:
        steps = json.loads(f.readlines()[-1])["steps"]
    ckpt_dir = os.path.abspath(os.path.join(model_dir, "checkpoints"))
    with ocp.CheckpointManager(ckpt_dir) as manager:
        latest = manager.latest_step()
        if latest != steps:
            raise ValueError(f"{model_dir}: training stopped at step {latest} of {steps}; "
                             "rerun train_lm to finish it")
        state = manager.restore(latest, args=ocp.args.StandardRestore())
    return Model(config, jax.tree_util.tree_map(jnp.asarray, state["params"]))


def load_teacher(path: str) -> Model:
    """A train_lm run directory (its final checkpoint), or any checkpoint directory."""
    if os.path.exists(os.path.join(path, CONFIG_FILE)) and os.path.isdir(
            os.path.join(path, "checkpoints")):
        return load_trained(path)
    return load_checkpoint(path, dtype="float32")


# ----------------------------------------------------------------------------- commands
LM_DATA = ["window", "vocab_size", "max_files", "max_windows"]


@gin.configurable(denylist=["quiet", "restart"])
def train_lm(model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
             config: GPT2Config = gin.REQUIRED, steps: int = 1000, batch_size: int = 32,
             learning_rate: float = 1e-3, warmup_steps: int = 100, weight_decay: float = 0.01,
             optimizer: str = "adamw", window: int = 128, vocab_size: int = 4096, seed: int = 0,
             checkpoint_every: int = 100, max_files: Optional[int] = None,
             max_windows: Optional[int] = None, export_dtype: str = "bfloat16",
             max_steps_per_run: Optional[int] = None, restart: bool = False,
             quiet: bool = False) -> Model:
    """Train a GPT-2 from scratch on the code corpus (next-token cross-entropy). A rerun
    resumes this run only; restart: start over (see `trainer`)."""
    vocab = prepare_code_data(data_dir, vocab_size, max_files)
    data = {"tokens": _windows(data_dir, "train", vocab, config, window, max_windows)}

    def loss_fn(params, batch, rng):  # rng: the step's dropout key (GPT-2 here has none)
        nll = next_token_nll(config, params, batch["tokens"])                   # [B, W]
        return jnp.mean(nll), jnp.float32(nll.size)

    run = settings(locals(), SCHEDULE + LM_DATA, data_sha256=sha256_of(data))
    with open_run(model_dir, "train_lm", run, restart, quiet=quiet):
        _write_config(model_dir, config)
        return _fit_and_export(model_dir, config, loss_fn, data, vocab, "train_lm",
                               export_dtype, run=run, **_fit_kwargs(locals()))


@gin.configurable(denylist=["quiet", "restart"])
def distill_lm(model_dir: str = gin.REQUIRED, teacher: str = gin.REQUIRED,
               data_dir: str = gin.REQUIRED, config: GPT2Config = gin.REQUIRED,
               steps: int = 1000, batch_size: int = 32, learning_rate: float = 1e-3,
               warmup_steps: int = 100, weight_decay: float = 0.01, optimizer: str = "adamw",
               window: int = 128, vocab_size: int = 4096, seed: int = 0,
               checkpoint_every: int = 100, max_files: Optional[int] = None,
               max_windows: Optional[int] = None, temperature: float = 1.0,
               export_dtype: str = "bfloat16", max_steps_per_run: Optional[int] = None,
               restart: bool = False, quiet: bool = False) -> Model:
    """Train a GPT-2 draft to match a teacher (a train_lm run directory or a checkpoint):
    forward KL(p_teacher || q_draft) at every position of the training windows. restart: as
    in `train_lm` (the teacher's weights are part of the run)."""
    vocab = prepare_code_data(data_dir, vocab_size, max_files)
    teacher_model = load_teacher(teacher)
    if teacher_model.config.vocab_size != config.vocab_size:
        raise ValueError(f"draft vocab_size {config.vocab_size} != teacher's "
                         f"{teacher_model.config.vocab_size}")
    data = {"tokens": _windows(data_dir, "train", vocab, config, window, max_windows)}
    tconfig, tparams = teacher_model.config, teacher_model.params

    def loss_fn(params, batch, rng):
        x = batch["tokens"][:, :-1]
        p = jax.nn.log_softmax(jax.lax.stop_gradient(
            gpt2.forward(tconfig, tparams, x)) / temperature, -1)             # [B, W, V]
        q = jax.nn.log_softmax(gpt2.forward(config, params, x) / temperature, -1)
        kl = jnp.sum(jnp.exp(p) * (p - q), axis=-1)                           # [B, W]
        return jnp.mean(kl), jnp.float32(kl.size)

    run = settings(locals(), SCHEDULE + LM_DATA + ["temperature"], data_sha256=sha256_of(data),
                   teacher_sha256=sha256_of(tparams))
    with open_run(model_dir, "distill_lm", run, restart, quiet=quiet):
        _write_config(model_dir, config)
        return _fit_and_export(model_dir, config, loss_fn, data, vocab, "distill_lm",
                               export_dtype, run=run, **_fit_kwargs(locals()))
