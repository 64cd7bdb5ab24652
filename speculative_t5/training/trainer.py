"""Training (teacher-forced cross-entropy) and distillation (token-level KL to a teacher,
as in DistillSpec) with optax, gin-configured like a T5X training launch.

Both share one loop: deterministic data order (a permutation per epoch from the seed, so a
resumed run sees exactly the batches it would have seen), orbax checkpoints of params,
optimizer state and step every `checkpoint_every` steps, resume from the latest, a
progress bar with loss and tokens/s, and the final model written in the native format
(`MODEL_DIR/model`) and as a Hugging Face directory (`MODEL_DIR/hf`) with the vocabulary.

A rerun resumes only the run its model_dir holds (`runs.check_run`): any setting that
changes the result (model config, optimizer, learning rate and schedule, batch size,
`steps`, seed, data, teacher) changed is refused, naming it; `restart=True` (`--restart`)
moves the old run aside and starts over. `steps` is part of the run because the cosine
schedule decays to it: a 600-step run continued to 1000 is not the 1000-step run. To train
further, start a new model_dir with `init_from` the finished one. Not part of it:
checkpoint_every, max_steps_per_run, export_dtype (a finished run rerun writes its final
model again, so a new export_dtype applies), quiet, and init_from (it only gives the first
step's weights; run_config.json records it as started_from). A rerun of a finished run says
so and appends nothing to train_log.json.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import time
from typing import Callable, Dict, Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from speculative_t5.checkpoints import export_hf, load_checkpoint, save_checkpoint
from speculative_t5.data.bpe import BPEVocabulary
from speculative_t5.data.demo_corpus import write_corpus
from speculative_t5.data.inputs import pad_rows, tokenize
from speculative_t5.data.vocabulary import Vocabulary
from speculative_t5.model.api import Model, cast_params, init_model
from speculative_t5.model.config import T5Config
from speculative_t5.model.t5 import T5
from speculative_t5.training.runs import open_run, settings, sha256_of


# ----------------------------------------------------------------------------- data
def prepare_data(data_dir: str, vocab_size: int, packages: bool = False,
                 target_weight: int = 1, task: str = "summarize",
                 vocab_file: Optional[str] = None) -> Vocabulary:
    """Build the demo corpus (`demo_corpus.write_corpus`: the standard library's functions
    as `task` examples; with `packages` the installed packages' too, in train) and its
    SentencePiece vocabulary in data_dir if missing. A data_dir built with other options is
    refused, not reused. vocab_file: an existing SentencePiece model to copy in instead of
    training one (a warm start keeps the vocabulary its weights were trained with)."""
    import sentencepiece as spm
    manifest = os.path.join(data_dir, "manifest.json")
    if not os.path.exists(os.path.join(data_dir, "train.jsonl")):
        write_corpus(data_dir, packages=packages, target_weight=target_weight, task=task)
    built = json.load(open(manifest)) if os.path.exists(manifest) else {}
    asked = {"packages": packages, "target_weight": target_weight, "task": task}
    found = {k: built.get(k, default) for k, default in
             (("packages", False), ("target_weight", 1), ("task", "summarize"))}
    if found != asked:
        raise ValueError(f"data_dir {data_dir} holds a corpus built with {found}, but {asked} "
                         f"was asked for: use another data_dir")
    model = os.path.join(data_dir, "spiece.model")
    if vocab_file is not None:
        if not os.path.exists(model):
            shutil.copy(vocab_file, model)
        elif open(model, "rb").read() != open(vocab_file, "rb").read():
            raise ValueError(f"data_dir {data_dir} holds another vocabulary than {vocab_file}: "
                             f"use another data_dir")
    if not os.path.exists(model):
        spm.SentencePieceTrainer.Train(
            input=os.path.join(data_dir, "vocab_text.txt"), model_prefix=model[:-6],
            vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
            max_sentence_length=20000, minloglevel=2, num_threads=2,
            input_sentence_size=400000, shuffle_input_sentence=True)
    return Vocabulary(model)


def read_split(data_dir: str, split: str):
    path = os.path.join(data_dir, f"{split}.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Example indices of batch `step`: epoch-wise permutations, reproducible on resume."""
    per_epoch = n // batch_size
    epoch, k = divmod(step, per_epoch)
    perm = np.random.RandomState(seed + epoch).permutation(n)
    return perm[k * batch_size:(k + 1) * batch_size]


def shift_right(targets: jnp.ndarray) -> jnp.ndarray:
    return jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))


# ----------------------------------------------------------------------------- the loop
def _optimizer(name: str, learning_rate: float, warmup: int, steps: int, weight_decay: float):
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup, 1),
                                                  max(steps, warmup + 1), learning_rate * 0.1)
    if name == "adamw":
        opt = optax.adamw(schedule, weight_decay=weight_decay)
    elif name == "adafactor":
        opt = optax.adafactor(schedule, weight_decay_rate=weight_decay or None)
    else:
        raise ValueError(f"optimizer must be 'adamw' or 'adafactor', got {name!r}")
    return optax.chain(optax.clip_by_global_norm(1.0), opt)


def fit(model_dir: str, model: Model, loss_fn: Callable, data: Dict[str, np.ndarray],
        steps: int, batch_size: int, learning_rate: float, warmup_steps: int,
        weight_decay: float, optimizer: str, seed: int, checkpoint_every: int,
        desc: str, quiet: bool = False, max_steps_per_run: Optional[int] = None,
        init_from: Optional[str] = None, run: Optional[Dict] = None):
    """Minimise loss_fn(params, batch, rng) -> (loss, num_tokens) over batches of `data`;
    rng: the step's dropout key, fold_in(PRNGKey(seed), step) (a resumed run draws the same).
    max_steps_per_run: stop (with a checkpoint) after this many steps; rerun to continue.
    Each session that ran steps appends a line to MODEL_DIR/train_log.json (its steps, final
    loss, null if not finite, and `run`: the settings); one with nothing left to do says so
    and appends nothing. Returns (model, whether all `steps` are done)."""
    import orbax.checkpoint as ocp
    n = len(next(iter(data.values())))
    if n < batch_size:
        raise ValueError(f"{n} training examples is fewer than batch_size {batch_size}")
    tx = _optimizer(optimizer, learning_rate, warmup_steps, steps, weight_decay)
    state = {"params": model.params, "opt_state": tx.init(model.params), "step": jnp.zeros((), jnp.int32)}
    ckpt_dir = os.path.abspath(os.path.join(model_dir, "checkpoints"))
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(max_to_keep=2))
    start = 0
    if manager.latest_step() is not None:
        start = int(manager.latest_step())
        try:
            state = manager.restore(start, args=ocp.args.StandardRestore(state))
        except (ValueError, TypeError, KeyError) as e:  # orbax: a tree diff of many lines
            manager.close()
            raise ValueError(f"{ckpt_dir} holds a step-{start} checkpoint of another model or "
                             f"optimizer ({type(e).__name__}); pass --restart to start over or "
                             "use a new directory") from None
        if not quiet:
            print(f"{desc}: all {steps} steps were already done in {model_dir}; nothing to "
                  "train" if start >= steps else f"resuming {desc} from step {start} ({ckpt_dir})")
    elif init_from is not None:  # a warm start: another run's weights, a fresh optimizer
        state["params"] = _newest_params(init_from, state["params"])
        state["opt_state"] = tx.init(state["params"])

    @functools.partial(jax.jit, donate_argnums=(0,))
    def train_step(state, batch):
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), state["step"])
        (loss, ntok), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], batch, rng)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, loss, ntok

    t0, tokens, loss = time.perf_counter(), 0, float("nan")
    stop = steps if max_steps_per_run is None else min(steps, start + max_steps_per_run)
    stop = max(start, stop)
    bar = tqdm(total=steps, initial=start, desc=desc, disable=quiet or stop == start)
    for step in range(start, stop):
        idx = batch_indices(n, batch_size, step, seed)
        state, loss, ntok = train_step(state, {k: v[idx] for k, v in data.items()})
        tokens += int(ntok)
        if (step + 1) % checkpoint_every == 0 or step + 1 == stop:
            manager.save(step + 1, args=ocp.args.StandardSave(state))
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}",
                        tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    bar.close()
    manager.wait_until_finished()
    manager.close()
    trained = Model(model.config, state["params"])
    if stop > start and jax.process_index() == 0:
        loss = float(loss)
        record = {"desc": desc, "steps": steps, "start_step": start, "end_step": stop,
                  "final_loss": loss if np.isfinite(loss) else None, "run": run}
        with open(os.path.join(model_dir, "train_log.json"), "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
    return trained, stop >= steps


def _newest_params(init_from: str, like):
    """The weights to warm-start from, which must have the tree and shapes of `like` (this
    run's params): another run's model_dir (its newest training checkpoint), or a released
    checkpoint directory that `load_checkpoint` reads (Hugging Face, T5X or native; T5X's
    `initial_checkpoint_path`), held in float32 whatever dtype it was saved in."""
    import orbax.checkpoint as ocp
    ckpt_dir = os.path.abspath(os.path.join(init_from, "checkpoints"))
    if os.path.isdir(ckpt_dir):
        with ocp.CheckpointManager(ckpt_dir) as manager:
            step = manager.latest_step()
            if step is None:
                raise ValueError(f"init_from {init_from}: no training checkpoint in {ckpt_dir}")
            params, source = manager.restore(step)["params"], f"its step-{step} weights"
    else:
        try:
            params = load_checkpoint(init_from, dtype="float32").params
        except (OSError, ValueError) as e:
            raise ValueError(f"init_from {init_from}: neither a training run's model_dir (no "
                             f"checkpoints/) nor a checkpoint load_checkpoint reads: {e}") from e
        source = "its weights"
    shapes = [jax.tree_util.tree_map(jnp.shape, p) for p in (params, like)]
    if shapes[0] != shapes[1]:
        raise ValueError(f"init_from {init_from}: {source} do not fit this run's model config")
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)


def _write_outputs(model_dir: str, model: Model, vocab, export_dtype: str):
    save_checkpoint(model, os.path.join(model_dir, "model"), overwrite=True)
    hf = os.path.join(model_dir, "hf")
    shutil.rmtree(hf, ignore_errors=True)
    export_hf(cast_params(model, export_dtype), hf)
    if isinstance(vocab, BPEVocabulary):  # GPT-2's vocab.json + merges.txt
        for path in vocab.files:
            shutil.copy(path, hf)
    else:
        shutil.copy(vocab.path, os.path.join(hf, "spiece.model"))


def _masked_mean(values, targets):
    """Mean of values [B, T] over real (non-pad) target tokens, and their count."""
    mask = (targets != 0).astype(jnp.float32)
    ntok = jnp.sum(mask)
    return jnp.sum(values * mask) / jnp.maximum(ntok, 1.0), ntok


def target_loss(module: T5, params, inputs, targets, rng=None):
    """Teacher-forced cross-entropy of targets [B, T] given inputs [B, S], per real target
    token (the training loss; also a held-out score steadier than ROUGE), and that count.
    rng: training, with the config's dropout; None: deterministic (scoring)."""
    logits = module.apply({"params": params}, inputs, shift_right(targets),
                          enable_dropout=rng is not None,
                          rngs=None if rng is None else {"dropout": rng})
    return _cross_entropy(logits, targets)


def _cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return _masked_mean(-jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0], targets)


def _fit_and_export(model_dir, config, loss_fn, data, vocab, desc, export_dtype, **fit_kw):
    """fit() from a fresh init; once all steps are done, write model/ and hf/."""
    model, finished = fit(model_dir, init_model(config, fit_kw["seed"]), loss_fn, data,
                          desc=desc, **fit_kw)
    if finished:
        _write_outputs(model_dir, model, vocab, export_dtype)
    return model


def _fit_kwargs(scope: dict) -> dict:
    names = ("steps", "batch_size", "learning_rate", "warmup_steps", "weight_decay", "optimizer",
             "seed", "checkpoint_every", "quiet", "max_steps_per_run")
    return {k: scope[k] for k in names}


# the settings that decide a run's result (beside its data's and teacher's sha256)
SCHEDULE = ["config", "steps", "batch_size", "learning_rate", "warmup_steps", "weight_decay",
            "optimizer", "seed"]
T5_DATA = ["input_len", "target_len", "vocab_size", "max_examples", "packages",
           "target_weight", "task"]


@gin.configurable(denylist=["quiet", "restart"])
def train(model_dir: str = gin.REQUIRED, data_dir: str = gin.REQUIRED,
          config: T5Config = gin.REQUIRED, steps: int = 1000, batch_size: int = 32,
          learning_rate: float = 1e-3, warmup_steps: int = 100, weight_decay: float = 0.01,
          optimizer: str = "adamw", input_len: int = 128, target_len: int = 32,
          vocab_size: int = 2048, seed: int = 0, checkpoint_every: int = 100,
          max_examples: Optional[int] = None, export_dtype: str = "bfloat16",
          max_steps_per_run: Optional[int] = None, packages: bool = False,
          target_weight: int = 1, task: str = "summarize", vocab_file: Optional[str] = None,
          init_from: Optional[str] = None, restart: bool = False, quiet: bool = False) -> Model:
    """Train a T5 on the demo corpus (teacher-forced cross-entropy), from scratch or, with
    `init_from` (another run's model_dir, or a checkpoint directory such as a released
    pair's), from those weights with a fresh optimizer and schedule. packages, target_weight,
    task, vocab_file: how the corpus is built (`prepare_data`; a warm start passes the
    vocabulary its weights know). A rerun resumes this run only; restart: start over (the
    module docstring says which settings make the run)."""
    vocab = prepare_data(data_dir, vocab_size, packages, target_weight, task, vocab_file)
    if vocab.size > config.vocab_size:
        raise ValueError(f"vocabulary has {vocab.size} pieces but config.vocab_size is "
                         f"{config.vocab_size}")
    rows = read_split(data_dir, "train")[:max_examples]
    data = {"inputs": tokenize([r["input"] for r in rows], vocab, input_len),
            "targets": tokenize([r["target"] for r in rows], vocab, target_len)}
    module = T5(config)

    def loss_fn(params, batch, rng):
        return target_loss(module, params, batch["inputs"], batch["targets"], rng)

    run = settings(locals(), SCHEDULE + T5_DATA, data_sha256=sha256_of(data))
    with open_run(model_dir, "train", run, restart, init_from, quiet):
        return _fit_and_export(model_dir, config, loss_fn, data, vocab, "train", export_dtype,
                               init_from=init_from, run=run, **_fit_kwargs(locals()))


def _outputs_key(teacher: Model, inputs: np.ndarray, length: int, temperature: float = 0.0,
                 seed: int = 0) -> str:
    """What a cache of teacher outputs was made from: the teacher's weights, the inputs, the
    length and the sampling (sha256), so a cache left by another teacher, corpus or setting
    is never mixed in."""
    import hashlib
    sampling = "" if temperature == 0 else f"T={temperature!r}\0seed={seed}\0"
    h = hashlib.sha256(f"{length}\0{inputs.shape}\0{sampling}".encode())
    h.update(np.ascontiguousarray(inputs, np.int32).tobytes())
    for leaf in jax.tree_util.tree_leaves(teacher.params):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def teacher_outputs(teacher: Model, inputs: np.ndarray, length: int, batch_size: int = 64,
                    cache: Optional[str] = None, save_every: int = 64,
                    temperature: float = 0.0, seed: int = 0) -> np.ndarray:
    """The teacher's outputs for every input [N, length]: greedy, or sampled at `temperature`
    (batch i drawn with fold_in(PRNGKey(seed), i), so a resumed run draws what it would
    have). cache: an .npz written every `save_every` batches (atomically), so a killed run
    continues where it stopped; one made by another teacher, for other inputs or with other
    sampling is refused, not reused."""
    from speculative_t5.engine import generate
    key, outs = _outputs_key(teacher, inputs, length, temperature, seed), []
    if cache and os.path.exists(cache):
        with np.load(cache) as saved:
            if str(saved["key"]) != key:
                raise ValueError(f"{cache} holds the outputs of another teacher, other inputs "
                                 f"or other sampling: delete it or use another model_dir")
            outs = [saved["outputs"]]
    done = len(outs[0]) if outs else 0

    def save():
        tmp = cache + ".tmp.npz"
        np.savez(tmp, key=key, outputs=np.concatenate(outs).astype(np.int32))
        os.replace(tmp, cache)

    for n, i in enumerate(range(done, len(inputs), batch_size), 1):
        chunk = inputs[i:i + batch_size]
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), i // batch_size)
        outs.append(np.asarray(generate(teacher, pad_rows(chunk, batch_size), max_decode_len=length,
                                        temperature=temperature, rng=rng).tokens[:len(chunk)]))
        if cache and (n % save_every == 0 or i + batch_size >= len(inputs)):
            save()
    return np.concatenate(outs).astype(np.int32) if outs else np.zeros((0, length), np.int32)


@gin.configurable(denylist=["quiet", "restart"])
def distill(model_dir: str = gin.REQUIRED, teacher: str = gin.REQUIRED,
            data_dir: str = gin.REQUIRED, config: T5Config = gin.REQUIRED, steps: int = 1000,
            batch_size: int = 32, learning_rate: float = 1e-3, warmup_steps: int = 100,
            weight_decay: float = 0.01, optimizer: str = "adamw", input_len: int = 128,
            target_len: int = 32, vocab_size: int = 2048, seed: int = 0,
            checkpoint_every: int = 100, max_examples: Optional[int] = None,
            temperature: float = 1.0, export_dtype: str = "bfloat16",
            max_steps_per_run: Optional[int] = None, packages: bool = False,
            target_weight: int = 1, task: str = "summarize", vocab_file: Optional[str] = None,
            sampled_outputs: int = 0, init_from: Optional[str] = None,
            restart: bool = False, quiet: bool = False) -> Model:
    """Train a draft to match a teacher: forward KL(p_teacher || q_draft) per token, on the
    data's targets, on the teacher's own greedy outputs (what it will be asked to draft
    greedily) and on `sampled_outputs` of its samples at temperature 1 per input (the
    prefixes a sampled decode asks it to draft from). data_dir, task, vocab_file: the
    teacher's corpus and vocabulary (`prepare_data`: a teacher shipped with its vocabulary
    passes that file). init_from, restart: as in `train` (the teacher's weights are part of
    the run)."""
    if not isinstance(sampled_outputs, int) or sampled_outputs < 0:
        raise ValueError(f"sampled_outputs must be an int >= 0, got {sampled_outputs!r}")
    vocab = prepare_data(data_dir, vocab_size, packages, target_weight, task, vocab_file)
    teacher_model = load_checkpoint(teacher, dtype="float32")
    if teacher_model.config.vocab_size != config.vocab_size:
        raise ValueError(f"draft vocab_size {config.vocab_size} != teacher's "
                         f"{teacher_model.config.vocab_size}")
    rows = read_split(data_dir, "train")[:max_examples]
    inputs = tokenize([r["input"] for r in rows], vocab, input_len)
    targets = tokenize([r["target"] for r in rows], vocab, target_len)
    run = settings(locals(), SCHEDULE + T5_DATA + ["temperature", "sampled_outputs"],
                   data_sha256=sha256_of({"inputs": inputs, "targets": targets}),
                   teacher_sha256=sha256_of(teacher_model.params))
    with open_run(model_dir, "distill", run, restart, init_from, quiet):
        generated = [teacher_outputs(teacher_model, inputs, target_len,
                                     cache=os.path.join(model_dir, "teacher_outputs.npz"))]
        samples = os.path.join(model_dir, "teacher_samples")  # sample k: its own cache and seed
        os.makedirs(samples, exist_ok=True)
        for k in range(sampled_outputs):
            generated.append(teacher_outputs(
                teacher_model, inputs, target_len, temperature=1.0, seed=seed + 1 + k,
                cache=os.path.join(samples, f"{k}.npz")))
        return _distill(model_dir, config, teacher_model, inputs, targets, generated, vocab,
                        temperature, export_dtype, init_from, run, _fit_kwargs(locals()))


def _distill(model_dir, config, teacher_model, inputs, targets, generated, vocab, temperature,
             export_dtype, init_from, run, fit_kw) -> Model:
    """generated: the teacher's outputs for `inputs`, greedy then sampled ([N, T] each)."""
    data = {"inputs": np.concatenate([inputs] * (1 + len(generated))),
            "targets": np.concatenate([targets, *generated])}
    module, tmodule = T5(config), T5(teacher_model.config)
    tparams = teacher_model.params

    def loss_fn(params, batch, rng):  # the student with its config's dropout, the teacher without
        dec = shift_right(batch["targets"])
        p = jax.nn.log_softmax(jax.lax.stop_gradient(
            tmodule.apply({"params": tparams}, batch["inputs"], dec)) / temperature, -1)
        q = jax.nn.log_softmax(module.apply({"params": params}, batch["inputs"], dec,
                                            enable_dropout=True, rngs={"dropout": rng})
                               / temperature, -1)
        return _masked_mean(jnp.sum(jnp.exp(p) * (p - q), axis=-1), batch["targets"])  # KL [B, T]

    return _fit_and_export(model_dir, config, loss_fn, data, vocab, "distill", export_dtype,
                           init_from=init_from, run=run, **fit_kw)
