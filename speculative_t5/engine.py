"""`st.generate`: validate arguments, build the models' step functions, run one jitted
program (the encoders, the cache set-up and the whole decode loop) per shape/config
(`beam_engine` does the same for `st.beam_search`, with the checks here).

This is the layer above both the model and the loops (T5X's split: the model side builds
`tokens_to_logits`, the decode loops know no model)."""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.calibration import (GammaCosts, check_gamma_costs, interleaved_medians,
                                        step_times)
from speculative_t5.decoding.drafts import Fallback, ModelDraft
from speculative_t5.decoding.loops import plain_decode, speculative_decode
from speculative_t5.decoding.output import GenerateOutput
from speculative_t5.decoding.sampling import (SamplingConfig, check_verification, keys_per_row,
                                              row_keys)
from speculative_t5.decoding.tree_loop import tree_decode
from speculative_t5.decoding.trees import TreeShape
from speculative_t5.model import gpt2
from speculative_t5.model.api import (Model, beside_cache_default, cache_axes, decode,
                                      host_memory, keep_path, start_cache)
from speculative_t5.partitioning import Partitioner


def step_fn(model: Model, beside_cache: Optional[bool] = None):
    """The model as the loops see it: logits [B, K, V], cache = step(cache, tokens [B, K], pos [B]).
    beside_cache: `model.api.decode`'s (None: by the default backend)."""
    return functools.partial(decode, model, beside_cache=beside_cache)


@functools.partial(jax.jit, static_argnames=("gamma", "max_decode_len",
                                             "lenience", "verification", "draft_stop", "adaptive",
                                             "recompute_cross_attention", "partitioner", "tree",
                                             "tree_children"))
def _generate(target: Model, draft: Any, input_ids, rng, temperature, eos, lengths=None,
              top_k=0, top_p=1.0, *, gamma: int, max_decode_len: int, lenience: float,
              recompute_cross_attention: bool, partitioner: Optional[Partitioner] = None,
              verification: str = "token", draft_stop: Optional[float] = None,
              adaptive: bool = False, costs=None, tree: Optional[TreeShape] = None,
              tree_children: str = "drawn"):
    """One program per shape and static setting; the sampling settings (temperature, top_k,
    top_p) are traced, so greedy and sampled decodes share it (`SamplingConfig`). rng: [B]
    keys. With a partitioner the caches are sharded by their logical axes (rows over 'data',
    heads over 'model'); the loops' per-row state follows the rows. draft: None (plain
    decode), a Model, or a draft from `decoding.drafts` (a pytree, its settings static;
    Models inside a Fallback).
    lengths [B]: a decoder-only target's prompt lengths (input_ids are its prompts); the
    loops start each row from its last prompt token. eos: the id that ends a row (traced:
    -1, none, times a decode to max_decode_len in the same program). tree: a token tree's
    shape (`tree_loop.tree_decode`, a Model draft); its caches hold the tree past the end."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    B = input_ids.shape[0]
    if target.decoder_only:
        start = jnp.take_along_axis(input_ids, (lengths - 1)[:, None], 1)[:, 0]  # [B]
        mask = jnp.arange(input_ids.shape[1])[None, :] < lengths[:, None]         # [B, S]
    else:
        start, mask = None, input_ids != target.config.pad_id

    def setup(model: Model, ids, length: int, role: str = "target"):
        cache = start_cache(model, ids, lengths, length, recompute_cross_attention)
        return cache if partitioner is None else partitioner.constrain(
            cache, cache_axes(cache), role)
    accelerator = on_accelerator(partitioner)
    step = functools.partial(step_fn, beside_cache=accelerator)
    if draft is None:
        return plain_decode(step(target), setup(target, input_ids, max_decode_len), B, max_decode_len,
                            eos, sampling, rng, start)
    prompt = input_ids.shape[1] if target.decoder_only else 0
    if tree is not None:
        length = cache_positions(max_decode_len + tree.num_nodes, prompt)
        d = ModelDraft(step(draft), functools.partial(setup, draft, role="draft"),
                       keep=functools.partial(keep_path, draft), feed_two=accelerator)
        return tree_decode(step(target), functools.partial(keep_path, target),
                           setup(target, input_ids, length), d, d.init(input_ids, length, mask),
                           B, max_decode_len, eos, tree, sampling, rng,
                           tree_children == "top_k", start)
    length = cache_positions(max_decode_len, prompt)

    def build(d, catch_up: bool):  # Models as the loops' drafts: step functions and caches
        if isinstance(d, Model):
            return ModelDraft(step(d), functools.partial(setup, d, role="draft"),
                              draft_stop, catch_up, feed_two=accelerator)
        return Fallback(build(d.first, True), build(d.then, True)) if isinstance(d, Fallback) else d
    draft = build(draft, adaptive)  # adaptive: plain rounds leave a model draft behind
    tcache, dstate = setup(target, input_ids, length), draft.init(input_ids, length, mask)
    return speculative_decode(step(target), tcache, draft, dstate, B,
                              max_decode_len, eos, gamma, sampling, rng, lenience, verification,
                              costs if adaptive else None, start)


def on_accelerator(partitioner: Optional[Partitioner]) -> bool:
    """Whether the decode runs on an accelerator (the partitioner's devices, else the default
    backend's). There a step costs its bytes whatever its width, and its compiler copies
    what a branch or a read of a written cache touches: so a model draft's first call each
    round always feeds two tokens (`ModelDraft.feed_two`: no branch on the width, which
    copied the draft's cache every round), and the models attend beside their caches
    (`model.api.decode`'s `beside_cache`: the cache written in place). On CPUs, whose
    steps are compute-bound, one token where one is new, and attention over the written
    cache."""
    if partitioner is None:
        return beside_cache_default()
    return partitioner.mesh.devices.flat[0].platform != "cpu"


CACHE_MULTIPLE = 16


def cache_positions(max_decode_len: int, prompt: int = 0) -> int:
    """The positions a speculative decode's caches hold beyond a prompt of `prompt` tokens
    (a GPT-2's cache holds its prompt too; a T5's holds none): max_decode_len, the whole
    cache rounded up to a multiple of 16 -- as many as a plain decode needs, whatever gamma.
    A round near the end feeds tokens past the last position; their cache writes are
    dropped (the models write with mode="drop"), and no token that is emitted depends on
    them: the last one, y_max_decode_len, is read off the query at max_decode_len - 1,
    which sees keys up to its own position only. Positions for the verify pass's overhang
    (max_decode_len + gamma + 1) made every step attend over more keys: at batch 64 a
    round that drafts nothing ran 0.91x a plain step, now 1.02x
    (`experiments/bench_adaptive.py`, never drafting). XLA's CPU kernels ran steps
    over an odd cache length slower (the demo pair's one-token step at batch 32: about 7%
    slower over 69 positions than over 80), hence the rounding."""
    n = prompt + max_decode_len
    return -(-n // CACHE_MULTIPLE) * CACHE_MULTIPLE - prompt


def check_int(name: str, value, lo: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    return int(value)


def check_lenience(lenience) -> float:
    if isinstance(lenience, bool) or not isinstance(lenience, (int, float)) \
            or not 0.0 < lenience <= 1.0:
        raise ValueError(f"lenience must be in (0, 1] (1 = exact), got {lenience!r}")
    return float(lenience)


def check_pair(target: Model, draft: Model) -> None:
    """A draft must share the target's vocabulary and its eos / pad ids."""
    if not isinstance(draft, Model):
        raise TypeError(f"draft must be a speculative_t5.Model or a draft from st.drafts "
                        f"(PromptLookup, Bigram), got {type(draft).__name__}")
    tc, dc = target.config, draft.config
    if type(dc) is not type(tc):
        raise ValueError(f"the draft is a {type(dc).__name__} model and the target a "
                         f"{type(tc).__name__} one: target and draft must be one family")
    if dc.vocab_size != tc.vocab_size:
        raise ValueError(f"draft vocab_size {dc.vocab_size} != target vocab_size "
                         f"{tc.vocab_size}: the two models must share one vocabulary")
    if (dc.eos_id, dc.pad_id) != (tc.eos_id, tc.pad_id):
        raise ValueError(f"draft eos/pad ids {(dc.eos_id, dc.pad_id)} differ from the "
                         f"target's {(tc.eos_id, tc.pad_id)}")


def check_draft(target: Model, draft):
    """A Model draft checked by `check_pair`; a zero-cost draft (`st.drafts`: init and
    propose) must have the target's vocabulary (a PromptLookup is given it); a Fallback's
    two drafts each. -> the draft."""
    if isinstance(draft, Fallback):
        return Fallback(check_draft(target, draft.first), check_draft(target, draft.then))
    if isinstance(draft, Model) or not (hasattr(draft, "propose") and hasattr(draft, "init")):
        check_pair(target, draft)
        return draft
    if getattr(draft, "vocab_size", 0) is None and hasattr(draft, "for_vocab"):
        draft = draft.for_vocab(target.config.vocab_size)
    V = getattr(draft, "vocab_size", None)
    if V is not None and V != target.config.vocab_size:
        raise ValueError(f"draft {draft!r} has vocab_size {V} != target vocab_size "
                         f"{target.config.vocab_size}: a draft must share the target's vocabulary")
    return draft


def check_prompt_lengths(model: Model, ids: np.ndarray, prompt_lengths,
                         max_decode_len: int) -> np.ndarray:
    """A decoder-only model's prompt lengths [B] (default: the full width), each in
    1..width, and prompt + max_decode_len within the model's positions."""
    B, S = ids.shape
    lengths = np.full((B,), S) if prompt_lengths is None else np.asarray(prompt_lengths)
    if lengths.shape != (B,) or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"prompt_lengths must be {B} ints (one per prompt), got "
                         f"{prompt_lengths!r}")
    if lengths.min() < 1 or lengths.max() > S:
        raise ValueError(f"prompt_lengths must be in [1, {S}] (the prompts' width), got "
                         f"{lengths.tolist()}")
    most = model.config.n_positions
    if lengths.max() + max_decode_len > most:
        raise ValueError(f"a prompt of {int(lengths.max())} tokens + max_decode_len "
                         f"{max_decode_len} exceeds the model's {most} positions")
    return lengths


def check_inputs(model: Model, input_ids, prompt_lengths, max_decode_len: int,
                 max_input_len: Optional[int]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """input_ids as a host array (non-empty, ints in the vocabulary), a decoder-only model's
    prompt lengths (`check_prompt_lengths`; None for a T5, which takes none), and no row
    longer than max_input_len -> (ids, lengths or None)."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer) or ids.shape[0] == 0 \
            or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty int array [batch, length], got "
                         f"shape {ids.shape} dtype {ids.dtype}")
    if ids.min() < 0 or ids.max() >= model.config.vocab_size:
        raise ValueError(f"input_ids has token ids in [{ids.min()}, {ids.max()}], outside "
                         f"[0, {model.config.vocab_size})")
    lengths = None
    if model.decoder_only:
        lengths = check_prompt_lengths(model, ids, prompt_lengths, max_decode_len)
    elif prompt_lengths is not None:
        raise ValueError("prompt_lengths is for decoder-only models (GPT-2); a T5's inputs "
                         "are 0-padded")
    if max_input_len is not None:
        lengths_in = (ids != model.config.pad_id).sum(1) if lengths is None else lengths
        if ids.shape[1] > max_input_len and lengths_in.max() > max_input_len:
            row = int(np.argmax(lengths_in))
            raise ValueError(f"input row {row} has {int(lengths_in[row])} tokens, longer than "
                             f"max_input_len {max_input_len}")
    return ids, lengths


def check_memory(need: int, shape: Tuple[int, int], max_decode_len: int) -> None:
    """A decode that needs more bytes than the device has free is refused before it starts."""
    have = device_memory()
    if have and need > have:
        raise ValueError(f"this decode needs about {need:,} bytes for its caches and buffers "
                         f"(batch {shape[0]}, input length {shape[1]}, max_decode_len "
                         f"{max_decode_len}), more than the {have:,} bytes this device has; "
                         "decode shorter outputs or fewer rows at a time")


def check_partitioner(partitioner) -> None:
    if partitioner is not None and not isinstance(partitioner, Partitioner):
        raise TypeError(f"partitioner must be a speculative_t5.Partitioner, got "
                        f"{type(partitioner).__name__}")


def draft_models(draft) -> list:
    """The Models a draft holds (itself, or a Fallback's)."""
    if isinstance(draft, Fallback):
        return draft_models(draft.first) + draft_models(draft.then)
    return [draft] if isinstance(draft, Model) else []


def map_models(draft, fn):
    """draft with fn applied to each Model it holds."""
    if isinstance(draft, Fallback):
        return Fallback(map_models(draft.first, fn), map_models(draft.then, fn))
    return fn(draft) if isinstance(draft, Model) else draft


TREE_CHILDREN = ("drawn", "top_k")


def check_tree(tree, tree_children: str, draft, verification: str, lenience: float,
               draft_stop, adaptive_gamma, model_draft: Optional[bool] = None) -> Optional[TreeShape]:
    """tree validated (None, or children per depth: `TreeShape.of`) with what it composes
    with: a Model draft (the other drafts propose chains; model_draft: whether `draft`, a
    description, names one), token-wise exact verification (a tree's rule is recursive
    rejection sampling), no draft_stop or adaptive gamma (a tree's shape is static)."""
    if tree_children not in TREE_CHILDREN:
        raise ValueError(f"tree_children must be one of {TREE_CHILDREN}, got {tree_children!r}")
    if tree is None:
        return None
    shape = TreeShape.of(tree)
    if not (isinstance(draft, Model) if model_draft is None else model_draft):
        raise ValueError(f"tree needs a draft model to expand it, got draft={draft!r} (prompt "
                         "lookup, bigram and fallback drafts propose chains: use gamma without tree)")
    for bad, why in ((verification != "token", f"verification={verification!r} (trees use "
                      "recursive rejection sampling; block verification is chain-only)"),
                     (lenience != 1.0, f"lenience {lenience} (trees are exact only)"),
                     (draft_stop is not None, "draft_stop (a tree's shape is static)"),
                     (adaptive_gamma is not False, "adaptive_gamma (a tree's shape is static)")):
        if bad:
            raise ValueError(f"tree does not combine with {why}")
    return shape


def check_draft_stop(draft_stop, draft, has_model: Optional[bool] = None) -> Optional[float]:
    """draft_stop validated: None, or a probability in (0, 1) with a draft that holds a model
    (has_model: whether it does, when `draft` is only its description)."""
    if draft_stop is None:
        return None
    if isinstance(draft_stop, bool) or not isinstance(draft_stop, (int, float)) \
            or not 0.0 < draft_stop < 1.0:
        raise ValueError(f"draft_stop must be a probability in (0, 1) (None = off), got "
                         f"{draft_stop!r}")
    if not (bool(draft_models(draft)) if has_model is None else has_model):
        raise ValueError("draft_stop needs a draft model (it ends a model's drafting early); "
                         f"the draft is {draft!r}")
    return float(draft_stop)


def decode_bytes(target: Model, draft: Optional[Model], batch: int, input_len: int,
                 max_decode_len: int, gamma: int) -> int:
    """Bytes a decode allocates besides the weights (an estimate, from above): per model the
    encoder output and its attention scores, the cross-attention keys/values and the
    self-attention cache; the token buffer; the target's and draft's distributions a round."""
    length = max_decode_len if draft is None else cache_positions(
        max_decode_len, input_len if target.decoder_only else 0)

    def model_bytes(m: Model) -> int:
        c = m.config
        if m.decoder_only:
            return gpt2.cache_bytes(c, batch, input_len + length)
        a = np.dtype(c.jnp_dtype).itemsize
        kv = c.num_decoder_layers * 2 * batch * c.num_heads * c.head_dim * a
        return (kv * (length + input_len) + batch * input_len * (c.emb_dim + c.mlp_dim) * a
                + batch * c.num_heads * input_len * input_len * 4)
    total = model_bytes(target) + sum(model_bytes(d) for d in draft_models(draft))
    rows = 2 * gamma + 2 if draft is not None else 1
    return total + batch * (max_decode_len + 2) * 4 + batch * rows * target.config.vocab_size * 4


def device_memory() -> int:
    """Bytes free on the default device (host memory for a CPU; 0 when unknown)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return host_memory()


def sampling_config(sampling: Optional[SamplingConfig], temperature: Optional[float],
                    top_k: Optional[int], top_p: Optional[float]) -> SamplingConfig:
    """`sampling` or the loose floats (defaults: argmax, no top-k, no top-p), validated."""
    loose = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    if sampling is not None:
        given = [k for k, v in loose.items() if v is not None]
        if given:
            raise ValueError(f"give either sampling=SamplingConfig(...) or {', '.join(given)}, "
                             "not both")
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
        return sampling.validate()
    defaults = SamplingConfig()
    return SamplingConfig(*(defaults[i] if v is None else v
                            for i, v in enumerate(loose.values()))).validate()


def generate(model: Model, input_ids, draft: Any = None, gamma: int = 4,
             max_decode_len: int = 64, temperature: Optional[float] = None,
             top_k: Optional[int] = None, top_p: Optional[float] = None, rng=None,
             lenience: float = 1.0, recompute_cross_attention: bool = False,
             max_input_len: Optional[int] = None,
             sampling: Optional[SamplingConfig] = None,
             partitioner: Optional[Partitioner] = None,
             verification: str = "token", draft_stop: Optional[float] = None,
             adaptive_gamma=False, prompt_lengths=None, ignore_eos: bool = False,
             tree=None, tree_children: str = "drawn") -> GenerateOutput:
    """Decode `input_ids` (int32 [B, S], 0 = pad) with `model`; with a `draft`, speculatively.
    A decoder-only model (GPT-2) continues prompts instead: input_ids are right-padded
    prompts, prompt_lengths [B] their lengths (default: all S; required when rows differ,
    since GPT-2 has no pad token); each row continues at its own position, and the output
    tokens are the continuations.
    draft: another Model (same vocabulary, eos and pad ids), a zero-cost draft from
    `st.drafts` (`PromptLookup()`, `Bigram.fit(...)`), `st.drafts.Fallback(first, then)`
    (per row, first's proposal where it has one, else then's), any object with its
    init / propose.

    The output distribution is exactly the target's (greedy: identical tokens) unless
    lenience < 1 (paper A.5: accept with min(1, p/(l q)); marked inexact in the stats).
    recompute_cross_attention: recompute cross-attention K/V every step, as T5X's example
    model does (the T5X-faithful baseline); the default computes them once per input.
    max_input_len: reject inputs longer than this (the encoder feature length).
    sampling: a `SamplingConfig` instead of temperature / top_k / top_p (give one or the
    other); temperature 0 (the default) is argmax.
    rng: one PRNG key, or one per row ([B]: a row's samples then depend on its key alone,
    not on the batch it is decoded in; the `decode` command keys each input by its index).
    partitioner: run on its mesh: the models' parameters placed as it places them (moved
    there if they are not), rows split over 'data' (padded with copies of the last row to a
    multiple of its size; a GPT-2's prompt lengths with them), caches' heads over 'model'.
    Same tokens as unpartitioned.
    verification: with a draft, "token" (Algorithm 1, token by token; the default) or "block"
    (Sun et al. 2025, Algorithm 2: the block judged jointly; as exact, never fewer tokens per
    call on average, identical when greedy; lenience must then be 1).
    draft_stop: a probability t in (0, 1): a row stops drafting after a token its draft
    model gave probability below t (fewer draft calls; still exact); needs a draft model.
    adaptive_gamma: True, or measured costs `GammaCosts(c, v[, v1[, w]])`: gamma becomes each
    round's maximum; a round drafts the number in 0..gamma that finishes the batch soonest
    (`decoding.loops.choose_gamma`; eq. (5) for one row) at the running acceptance rate of
    the batch's slowest active row (0: a plain target step, where speculation does not pay;
    the first round drafts if perfect drafts would pay). True measures c, v, v1 and w here
    at this batch size and width, once per process (a few seconds).
    ignore_eos: every row runs to max_decode_len, EOS or not (timing a known amount of work,
    as `gamma_costs` does; vLLM's option of the name).
    tree: children per depth, e.g. (3, 2, 1, 1): each round the draft model expands a token
    tree of that shape (its depth replaces gamma) and the target checks every node in one
    call, accepting a path by recursive rejection sampling (exact; greedy: the longest path
    of argmaxes). tree_children: "drawn" (each node's children drawn from the draft without
    replacement) or "top_k" (its top k, verified as fixed guesses).
    Exact: the choice depends only on earlier rounds."""
    if not isinstance(model, Model):
        raise TypeError(f"model must be a speculative_t5.Model, got {type(model).__name__}")
    gamma, max_decode_len = check_int("gamma", gamma, 1), check_int("max_decode_len", max_decode_len, 1)
    sampling = sampling_config(sampling, temperature, top_k, top_p)
    check_verification(verification, check_lenience(lenience))
    if draft is not None:
        draft = check_draft(model, draft)
    draft_stop = check_draft_stop(draft_stop, draft)
    tree = check_tree(tree, tree_children, draft, verification, lenience, draft_stop,
                      adaptive_gamma)
    if tree is not None:
        gamma = tree.depth
    if not isinstance(ignore_eos, bool):
        raise TypeError(f"ignore_eos must be a bool, got {ignore_eos!r}")
    if adaptive_gamma is not False and adaptive_gamma is not True:
        adaptive_gamma = check_gamma_costs(adaptive_gamma)
    if adaptive_gamma is not False and draft is None:
        raise ValueError("adaptive_gamma needs a draft (it chooses how many drafts a round "
                         "makes)")
    if model.decoder_only and recompute_cross_attention:
        raise ValueError("recompute_cross_attention is for T5 (a GPT-2 has no cross-attention)")
    ids, lengths = check_inputs(model, input_ids, prompt_lengths, max_decode_len, max_input_len)
    check_memory(decode_bytes(model, draft, ids.shape[0], ids.shape[1], max_decode_len, gamma),
                 ids.shape, max_decode_len)
    rng = jax.random.PRNGKey(0) if rng is None else jnp.asarray(rng)
    keys_per_row(rng, ids.shape[0])  # a bad shape is a clear error now, not in tracing
    rows = ids.shape[0]
    keys = row_keys(rng, rows)                                                 # [B]
    costs = None
    if adaptive_gamma is True:  # measured on these very inputs, before they are placed
        costs = gamma_costs(model, draft, ids, gamma, max_decode_len, sampling, lengths,
                            partitioner)
    elif adaptive_gamma is not False:
        costs = adaptive_gamma
    if costs is not None:
        costs = costs.resolved(gamma)
    ids = jnp.asarray(ids, jnp.int32)
    if partitioner is not None:
        check_partitioner(partitioner)
        model = partitioner.shard(model, "target")
        draft = map_models(draft, lambda d: partitioner.shard(d, "draft"))
        # host copies, placed straight into a global sharding (every process passes the same)
        if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
            keys = jax.random.key_data(keys)                                   # [B, 2] uint32

        ids = _place(partitioner, ids, ("batch", "length"))
        keys = _place(partitioner, keys, ("batch",))
        if lengths is not None:  # a padded row copies the last row's prompt, length and key
            lengths = _place(partitioner, np.asarray(lengths, np.int32), ("batch",))
    speculative = draft is not None
    tokens, lengths, stats = _generate(
        model, draft, ids, keys, jnp.float32(sampling.temperature),
        jnp.int32(-1 if ignore_eos else model.config.eos_id),
        None if lengths is None else jnp.asarray(lengths, jnp.int32),
        jnp.int32(sampling.top_k), jnp.float32(sampling.top_p),
        gamma=gamma if speculative else 0, max_decode_len=max_decode_len, lenience=float(lenience),
        verification=verification if speculative else "token", draft_stop=draft_stop,
        adaptive=costs is not None,
        costs=None if costs is None else jnp.asarray(costs, jnp.float32),
        recompute_cross_attention=bool(recompute_cross_attention), partitioner=partitioner,
        tree=tree, tree_children=tree_children)
    tokens, lengths, stats = _to_host((tokens, lengths, stats))
    tokens, lengths = tokens[:rows], lengths[:rows]
    stats = {k: v[:rows] for k, v in stats.items()}
    stats.update(gamma=gamma if speculative else 0, exact=lenience == 1.0,
                 lenience=float(lenience), verification=verification if speculative else None,
                 draft_stop=draft_stop, adaptive_costs=None if costs is None else costs._asdict(),
                 tree=None if tree is None else list(tree.branching),
                 tree_nodes=0 if tree is None else tree.num_nodes - 1)
    return GenerateOutput(tokens, lengths, stats)


_MEASURED: Dict[Tuple, GammaCosts] = {}


def gamma_costs(model: Model, draft, input_ids, gamma: int = 4, max_decode_len: int = 64,
                sampling: SamplingConfig = SamplingConfig(), prompt_lengths=None,
                partitioner: Optional[Partitioner] = None, rounds: int = 3) -> GammaCosts:
    """Adaptive gamma's c, v, v1 and w as this decode's loop pays them, measured on these
    inputs. P = a plain decode's seconds per loop iteration, R_g = a fixed-g speculative
    decode's seconds per round, each the slope between decodes to max_decode_len // 4 and
    to max_decode_len tokens (the added seconds over the added rounds; medians of `rounds`
    runs after a compiling one; every row run to its length, `ignore_eos`). The slope is a
    round's marginal price, what a choice between round sizes trades: a decode's total over
    its rounds also charges its set-up (encoder, caches, the host round trip; ~3.4 plain
    steps at batch 1 on the demo pair) to them, the more the fewer and longer they are --
    7-16% dear on the demo pair. Below 16 tokens the one length's total
    over its rounds is used. c = the draft models' one-token steps (timed in compiled
    loops; 0 without a draft model) over P, w = their (gamma + 1)-token steps (catching up
    after plain rounds) over P, v = R_gamma / P - gamma c, v1 = R_1 / P - c (rounds of one
    draft; a line from a plain step to v underrates them where the batch makes the target
    compute-bound). So the loop's own work (sampling, the accept test, which grow with the
    batch) is in v, where bare step times would leave it out. Once per process for each
    pair, input shape and setting; several processes in lock-step all take process 0's
    figures (each choosing its own would split the program)."""
    ids = np.asarray(input_ids)
    key = (id(model.params), id(draft.params) if isinstance(draft, Model) else id(draft),
           ids.shape, gamma, max_decode_len, sampling, partitioner)
    if key in _MEASURED:
        return _MEASURED[key]
    kw = dict(sampling=sampling, prompt_lengths=prompt_lengths, partitioner=partitioner)
    outs = {}

    def run(name, length, **extra):
        def go():
            outs[name, length] = generate(model, ids, ignore_eos=True, **kw, **extra,
                                          max_decode_len=length)
            return outs[name, length].tokens
        return go
    gammas = sorted({1, gamma})
    lengths = (max_decode_len // 4, max_decode_len) if max_decode_len >= 16 else (max_decode_len,)
    decodes = {"plain": {}, **{f"gamma {g}": dict(draft=draft, gamma=g) for g in gammas}}
    seconds = interleaved_medians({(k, n): run(k, n, **extra) for k, extra in decodes.items()
                                   for n in lengths}, rounds)
    rounds_ = {k: max(int(outs[k].stats["target_calls"].max()), 1) for k in outs}
    short, long = lengths[0], lengths[-1]

    def per_round(k):  # seconds a round: the slope between the lengths, else total / rounds
        added = rounds_[k, long] - rounds_[k, short]
        if added > 0 and seconds[k, long] > seconds[k, short]:
            return (seconds[k, long] - seconds[k, short]) / added
        return seconds[k, long] / rounds_[k, long]
    per = {k: per_round(k) for k in decodes}
    c = w = 0.0
    drafts = draft_models(draft)
    if drafts:
        B, W = ids.shape
        L = cache_positions(max_decode_len, W if model.decoder_only else 0)
        t = step_times({**{f"draft_{i}": (d, 1) for i, d in enumerate(drafts)},
                        **{f"wide_{i}": (d, gamma + 1) for i, d in enumerate(drafts)}},
                       B, W, L, L // 2, rounds=5, steps=8, warmup=1)
        c, w = (sum(t[f"{k}_{i}"] for i in range(len(drafts))) / per["plain"]
                for k in ("draft", "wide"))
    v = {g: max(per[f"gamma {g}"] / per["plain"] - g * c, 0.0) for g in gammas}  # a round's rest
    costs = np.array([c, v[gamma], v[1], w])
    if jax.process_count() > 1:  # lock-step processes must choose the same gammas
        from jax.experimental import multihost_utils
        costs = np.asarray(multihost_utils.broadcast_one_to_all(costs))
    _MEASURED[key] = GammaCosts(*map(float, costs))
    return _MEASURED[key]


def _to_host(tree):
    """numpy copies of a tree of arrays; an array spread over several processes' devices
    (multi-host) is gathered first, so every process gets the whole batch."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)
    return jax.tree_util.tree_map(one, tree)


def _place(partitioner: Partitioner, x, axes):
    """A host array's rows padded to a multiple of 'data' (`_pad_rows`) and split over it."""
    return jax.device_put(_pad_rows(np.asarray(x), partitioner.data_size),
                          partitioner.sharding(axes))


def _pad_rows(x, multiple: int):
    """x [B, ...] with copies of its last row appended up to a multiple of `multiple` rows (a
    copy of a row with its key decodes exactly as that row, so the loop ends no later)."""
    extra = -x.shape[0] % multiple
    return x if not extra else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
