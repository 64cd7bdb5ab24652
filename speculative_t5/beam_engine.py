"""`st.beam_search`: T5X's beam search over a model (`decoding.beam`), or with a draft model
the exact speculative beam search (`decoding.speculative_beam`: several beam steps a target
call, the same beams). Validates the arguments (`engine`'s checks), builds the caches
(repeated per beam) and step functions, and runs one jitted program per shape/config."""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.decoding.beam import beam_search as beam_decode
from speculative_t5.decoding.output import BeamSearchOutput
from speculative_t5.decoding.speculative_beam import speculative_beam_search
from speculative_t5.engine import (_place, _to_host, check_inputs, check_int, check_memory,
                                   check_pair, check_partitioner, check_prompt_lengths,
                                   decode_bytes, on_accelerator, step_fn)
from speculative_t5.model.api import Model, cache_axes, start_cache
from speculative_t5.partitioning import Partitioner


@functools.partial(jax.jit, static_argnames=("beam_size", "max_decode_len", "gamma", "paths",
                                             "partitioner"))
def _beam_search(model: Model, draft: Optional[Model], input_ids, eos, alpha, lengths=None, *,
                 beam_size: int, max_decode_len: int, gamma: int = 0, paths: int = 0,
                 partitioner: Optional[Partitioner] = None):
    """One program per shape and static setting (eos and alpha traced): each model's cache
    built for the B rows, repeated per beam (row b's beams at b*W .. b*W + W - 1), then the
    loop: plain (draft None) or speculative. -> (tokens, scores, lengths, stats)."""
    B = input_ids.shape[0]
    start = offset = None
    if model.decoder_only:
        start = jnp.take_along_axis(input_ids, (lengths - 1)[:, None], 1)[:, 0]  # [B]
        offset = lengths

    def setup(m: Model, role: str):
        cache = start_cache(m, input_ids, lengths, max_decode_len)
        cache = jax.tree_util.tree_map(lambda x: jnp.repeat(x, beam_size, axis=0), cache)
        if partitioner is not None:
            cache = partitioner.constrain(cache, cache_axes(cache), role)
        return cache
    step = functools.partial(step_fn, beside_cache=on_accelerator(partitioner))
    if draft is None:
        tokens, scores, out_lengths, steps = beam_decode(
            step(model), setup(model, "target"), B, beam_size, max_decode_len, eos, alpha,
            start, offset)
        calls = jnp.full((B,), steps, jnp.int32)
        return tokens, scores, out_lengths, {"target_calls": calls, "beam_steps": calls}
    return speculative_beam_search(step(model), setup(model, "target"), step(draft),
                                   setup(draft, "draft"), B, beam_size, max_decode_len, eos,
                                   alpha, gamma, paths, start, offset)


PATHS_PER_BEAM = 4  # a speculative beam search's default path rows per input, per beam


def check_alpha(alpha) -> float:
    """Beam search's length-penalty exponent: a number >= 0 (0 = no length normalization)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) \
            or not 0.0 <= alpha < float("inf"):
        raise ValueError(f"alpha must be a number >= 0 (0 = no length normalization), got "
                         f"{alpha!r}")
    return float(alpha)


def check_beam_draft(model: Model, draft, gamma, paths, beam_size: int):
    """A beam search's draft: a Model of the target's family and vocabulary (`check_pair`;
    the zero-cost drafts propose one path, not beams), gamma >= 1, paths (path rows per
    input, default 4 * beam_size) >= beam_size -> (gamma, paths); paths without a draft is
    an error."""
    gamma = check_int("gamma", gamma, 1)
    if draft is None:
        if paths is not None:
            raise ValueError("paths is for a speculative beam search: give a draft model too")
        return gamma, 0
    if not isinstance(draft, Model):
        raise TypeError(f"a beam search's draft must be a speculative_t5.Model (it drafts "
                        f"beams; the zero-cost drafts of st.drafts propose one path), got "
                        f"{type(draft).__name__}")
    check_pair(model, draft)
    paths = PATHS_PER_BEAM * beam_size if paths is None else check_int("paths", paths,
                                                                        beam_size)
    return gamma, paths


def beam_search(model: Model, input_ids, beam_size: int = 4, alpha: float = 0.6,
                max_decode_len: int = 64, prompt_lengths=None,
                partitioner: Optional[Partitioner] = None,
                max_input_len: Optional[int] = None, draft: Optional[Model] = None,
                gamma: int = 4, paths: Optional[int] = None) -> BeamSearchOutput:
    """T5X's `beam_search` (`decoding.beam`): beam_size beams per row of input_ids (int32
    [B, S], 0 = pad), length-normalized by ((5 + length) / 6) ** alpha, up to max_decode_len
    tokens. A decoder-only model (GPT-2) continues right-padded prompts of prompt_lengths
    [B] (as `generate`; the prompt counts in the penalty's length, as T5X's initial_index).
    partitioner: as `generate` (rows padded to a multiple of 'data', then repeated per beam).
    draft: a smaller Model of the same family and vocabulary -> the exact speculative beam
    search (`decoding.speculative_beam`): each round the draft's own beam search drafts
    gamma tokens on `paths` path rows per input (default 4 * beam_size; more rows cover more
    of the target's beams, at a wider target call), the target scores them all in one call
    and T5X's steps are replayed on its logits as far as the paths cover the live beams.
    Same beams, scores and lengths as without a draft (up to the float rounding of a
    (gamma + 1)-token target call against a one-token one: scores within ~1e-5).
    -> BeamSearchOutput: tokens [B, beam_size, max_decode_len] best first, scores [B, beam_size]
    (a row with fewer finished beams than slots fills them with scores near -1e7);
    `summary()["beam_steps_per_target_call"]` (1.0 without a draft)."""
    if not isinstance(model, Model):
        raise TypeError(f"model must be a speculative_t5.Model, got {type(model).__name__}")
    beam_size = check_int("beam_size", beam_size, 1)
    max_decode_len = check_int("max_decode_len", max_decode_len, 1)
    check_alpha(alpha)
    gamma, paths = check_beam_draft(model, draft, gamma, paths, beam_size)
    check_partitioner(partitioner)
    ids, lengths = check_inputs(model, input_ids, prompt_lengths, max_decode_len, max_input_len)
    if draft is not None and draft.decoder_only:
        check_prompt_lengths(draft, ids, lengths, max_decode_len)
    rows_per_input = beam_size + paths  # the live beams' caches, and the paths' in a round
    check_memory(decode_bytes(model, draft, ids.shape[0] * rows_per_input, ids.shape[1],
                              max_decode_len, gamma), ids.shape, max_decode_len)
    rows = ids.shape[0]
    lengths = None if lengths is None else np.asarray(lengths, np.int32)
    if partitioner is not None:
        model = partitioner.shard(model, "target")
        draft = None if draft is None else partitioner.shard(draft, "draft")
        ids = _place(partitioner, ids.astype(np.int32), ("batch", "length"))
        lengths = None if lengths is None else _place(partitioner, lengths, ("batch",))
    tokens, scores, out_lengths, stats = _to_host(_beam_search(
        model, draft, jnp.asarray(ids, jnp.int32), jnp.int32(model.config.eos_id),
        jnp.float32(alpha), None if lengths is None else jnp.asarray(lengths),
        beam_size=beam_size, max_decode_len=max_decode_len, gamma=gamma, paths=paths,
        partitioner=partitioner))
    stats = {k: v[:rows] for k, v in stats.items()}
    stats.update(beam_size=beam_size, alpha=float(alpha))
    if draft is not None:
        stats.update(gamma=gamma, paths=paths)
    return BeamSearchOutput(tokens[:rows], scores[:rows], out_lengths[:rows], stats)
