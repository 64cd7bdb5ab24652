"""What a decode produces: the token buffer (written only through `emit`, which enforces
EOS and the length cap) and the per-row statistics."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def emit(seq: Array, m: Array, done: Array, new: Array, count: Array, eos_id: int,
         max_len: int):
    """Append up to `count` tokens of new [B, K] to each row of seq [B, 1 + max_len + ...].

    seq[:, 0] is the start token and seq[:, j] the j-th emitted token; m [B] counts emitted
    tokens. Nothing is written for finished rows, after a row's first EOS, or past max_len.
    Returns (seq, m, done, emitted [B])."""
    K = new.shape[1]
    j = jnp.arange(K)[None, :]                                                 # [1, K]
    is_eos = (new == eos_id) & (j < count[:, None])
    first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1) + 1, K)      # [B]
    emitted = jnp.minimum(jnp.minimum(count, first_eos), max_len - m)
    emitted = jnp.where(done, 0, jnp.maximum(emitted, 0))                      # [B]
    cols = jnp.where(j < emitted[:, None], m[:, None] + 1 + j, seq.shape[1])   # OOB -> dropped
    seq = seq.at[jnp.arange(seq.shape[0])[:, None], cols].set(new, mode="drop")
    m = m + emitted
    done = done | jnp.any(is_eos & (j < emitted[:, None]), 1) | (m >= max_len)
    return seq, m, done, emitted


def ratio(part: float, whole: float) -> float:
    """part / whole, 0 when whole is 0 (tokens per call of a decode that made none)."""
    return part / whole if whole else 0.0


def combine(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Totals over per-row records (`GenerateOutput.row`, from one decode or many, or read
    back from JSONL): tokens, target and draft calls, tokens per target call and its
    histogram, and the acceptance rate (accepted drafts / drafts proposed)."""
    tokens = sum(r["length"] for r in rows)
    calls = sum(r["target_calls"] for r in rows)
    proposed = sum(r["draft_calls"] for r in rows)  # every draft call proposes one token
    hist = np.sum([r["tokens_per_call_hist"] for r in rows], axis=0) if rows else np.zeros(1)
    return {"tokens": tokens, "target_calls": calls, "draft_calls": proposed,
            "tokens_per_target_call": ratio(tokens, calls),
            "tokens_per_call_histogram": np.asarray(hist).astype(int).tolist(),
            "acceptance_rate": ratio(sum(r["accepted"] for r in rows), proposed)}


@dataclasses.dataclass
class GenerateOutput:
    """tokens int32 [B, max_decode_len] (0 after EOS), lengths int32 [B] (EOS included),
    stats: per-row arrays (`row(i)` for one row as plain numbers, `summary()` for totals)."""
    tokens: np.ndarray
    lengths: np.ndarray
    stats: Dict[str, Any]

    def row(self, i: int) -> Dict[str, Any]:
        """Row i's statistics as plain numbers (what a JSONL record stores)."""
        s = self.stats
        return {"length": int(self.lengths[i]), "target_calls": int(s["target_calls"][i]),
                "draft_calls": int(s["draft_calls"][i]),
                "tokens_per_call_hist": np.asarray(s["tokens_per_call_hist"][i]).tolist(),
                "two_token_draft_calls": int(s["two_token_draft_calls"][i]),
                "draft_model_steps": int(s["draft_model_steps"][i]),
                "drafts_per_round_hist": np.asarray(s["drafts_per_round_hist"][i]).tolist(),
                "accepted": int(np.sum(s["accepted_at"][i]))}

    def rows(self) -> List[Dict[str, Any]]:
        return [self.row(i) for i in range(len(self.lengths))]

    def summary(self) -> Dict[str, Any]:
        """Batch totals (`combine` over the rows), whether the decode was exact, and the
        acceptance rate at each draft position (accepted / reached; a token tree's: at each
        depth, with its shape, the nodes a target call checks and the acceptance rate of a
        node's i-th child once the earlier ones are rejected, `trees.expected_tokens`)."""
        s = self.stats
        out = dict(combine(self.rows()), exact=bool(s["exact"]), gamma=int(s["gamma"]))
        if s["gamma"]:
            reached = np.sum(s["reached_at"], 0)
            out["acceptance_rate_by_position"] = (
                np.sum(s["accepted_at"], 0) / np.maximum(reached, 1)).tolist()
        else:
            out.pop("acceptance_rate")
        if s.get("tree"):  # a token tree: gamma is its depth, positions are depths
            out.update(tree=list(s["tree"]), nodes_per_target_call=int(s["tree_nodes"]),
                       acceptance_rate_by_rank=(np.sum(s["rank_accepted"], 0) / np.maximum(
                           np.sum(s["rank_tried"], 0), 1)).tolist())
        return out


@dataclasses.dataclass
class BeamSearchOutput:
    """tokens int32 [B, W, max_decode_len] best beam first (0 after EOS), scores float32
    [B, W] (finished: log-prob / brevity penalty; a row with none finished: its live beams'
    log-probs), lengths int32 [B, W] (through EOS), stats: per-row target_calls and
    beam_steps [B] (one target call a beam step), beam_size, alpha; with a draft
    (`decoding.speculative_beam`) also gamma, paths and per row draft_calls, rounds (the
    batch's target calls) and steps_per_call_hist [B, gamma + 2] (rounds by the beam steps
    their target call covered)."""
    tokens: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray
    stats: Dict[str, Any]

    def summary(self) -> Dict[str, Any]:
        """Batch totals: target calls, beam steps and beam steps per target call (with a
        draft also draft calls, the rounds and the steps-per-call histogram)."""
        s = self.stats
        calls, steps = int(np.sum(s["target_calls"])), int(np.sum(s["beam_steps"]))
        out = {"target_calls": calls, "beam_steps": steps,
               "beam_steps_per_target_call": ratio(steps, calls),
               "beam_size": int(s["beam_size"]), "alpha": float(s["alpha"])}
        if s.get("gamma"):
            out.update(gamma=int(s["gamma"]), paths=int(s["paths"]),
                       draft_calls=int(np.sum(s["draft_calls"])),
                       rounds=int(np.max(s["rounds"], initial=0)),
                       steps_per_call_histogram=np.sum(s["steps_per_call_hist"], 0).tolist())
        return out


def init_stats(batch: int, gamma: int) -> Dict[str, Array]:
    z = jnp.zeros((batch,), jnp.int32)
    return {"target_calls": z, "draft_calls": z, "two_token_draft_calls": z, "draft_model_steps": z,
            "tokens_per_call_hist": jnp.zeros((batch, gamma + 1), jnp.int32),
            "drafts_per_round_hist": jnp.zeros((batch, gamma + 1), jnp.int32),
            "accepted_at": jnp.zeros((batch, gamma), jnp.int32),
            "reached_at": jnp.zeros((batch, gamma), jnp.int32)}


def record_call(stats: Dict[str, Array], active: Array, emitted: Array, drafts=0,
                accepted: Array | None = None, reached: Array | None = None,
                two_token: Array | None = None, model_steps: Array | None = None) -> Dict[str, Array]:
    """Count one target call for the rows that were active, and the drafts [B] each proposed
    before it (`two_token` [B] when a draft model's first call fed more than one token;
    `model_steps` [B] the draft-model steps run for it: a zero-cost draft runs none)."""
    a = active.astype(jnp.int32)                                               # [B]
    size = stats["tokens_per_call_hist"].shape[1]                             # gamma + 1
    hist = jax.nn.one_hot(emitted - 1, size, dtype=jnp.int32) * a[:, None]
    new = dict(stats, target_calls=stats["target_calls"] + a,
               draft_calls=stats["draft_calls"] + a * drafts,
               tokens_per_call_hist=stats["tokens_per_call_hist"] + hist,
               drafts_per_round_hist=stats["drafts_per_round_hist"]
               + jax.nn.one_hot(drafts, size, dtype=jnp.int32) * a[:, None])
    if accepted is not None:
        new["accepted_at"] = stats["accepted_at"] + accepted.astype(jnp.int32) * a[:, None]
        new["reached_at"] = stats["reached_at"] + reached.astype(jnp.int32) * a[:, None]
        new["two_token_draft_calls"] = stats["two_token_draft_calls"] + two_token.astype(jnp.int32) * a
        if model_steps is not None:
            new["draft_model_steps"] = stats["draft_model_steps"] + model_steps * a
    return new
