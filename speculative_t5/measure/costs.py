"""The cost model: a decode's walltime predicted from parts measured separately on the
device, none of them fitted to the decodes it predicts.

    plain decode        = setup_target(W) + calls * (T + L_1)
    speculative decode  = setup_target(W) + setup_draft(W)
                          + rounds * (v T + gamma c T + L_gamma) + two_token_calls * (T_d2 - c T)

setup_*(W): one model's encoder, cross-attention keys/values and cache allocation for an
input of width W (one jitted call, so its dispatch is in it too); T: a one-token target
step; v T: a target step over gamma+1 tokens (the verify pass); c T: a one-token draft step;
T_d2: a draft step over two tokens (the first draft call after a round that accepted every
draft). Steps are timed inside one compiled loop, as the decode loop runs them
(`timing.step_times`). L_1, L_gamma: the decode loop's own work per plain step and per
speculative round (sampling, the accept test, writing tokens, statistics), timed by running
the loops with model steps that cost nothing (`timing.loop_timer`). Rounds, calls and two-token calls are counted by the decode itself.
Eq. (5) is the special case with no set-up, unbounded text (eq. 1) and no two-token calls.

Zero-cost drafts (`decoding.drafts`): a PromptLookup (or Bigram) has no model, so c = 0,
T_d2 = 0 and no draft set-up; its proposing is work of the loop, so L_gamma is timed with
the draft object itself inside the free loop (a lookup over a random input of the steps'
width and the tokens emitted). A Fallback(PromptLookup, model): c, T_d2 and the set-up are
the model's, L_gamma is timed with the real lookup and a free model, and the model's steps
are charged as the decode counts them (`draft_model_steps`: gamma per round the model
drafted, none for a round the lookup served), in place of gamma per round:

    speculative  = ... + rounds * (v T + L_gamma) + draft_model_steps * c T + ...

Left out for a Fallback: after lookup rounds its model catches up in (gamma+1)-token feeds,
charged as one two-token call (T_d2 - c T) each. `timed_parts` says which parts a cell's
draft had timed (timing.json keeps it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

from speculative_t5.decoding.drafts import Fallback
from speculative_t5.decoding.sampling import SamplingConfig
from speculative_t5.generate import draft_models
from speculative_t5.measure.timing import (interleaved_medians, loop_kind, loop_timer,
                                           setup_timer, step_times)
from speculative_t5.model.api import Model


@dataclasses.dataclass
class Costs:
    """Seconds per part, batch 1; `c`, `v(gamma)` are the paper's ratios of them."""
    target_step: float                 # T
    draft_step: float                  # c T
    draft_two: float                   # T_d2
    verify: Dict[int, float]           # gamma -> v(gamma) T
    setup: Dict[int, Dict[str, float]]  # input width -> {'target': s, 'draft': s}
    plain_loop: float                  # L_1: the plain loop's own work per step
    round_loop: Dict[int, float]       # gamma -> L_gamma: the speculative loop's per round
    step_width: int                    # the input width the steps were timed at
    cache_len: int

    @property
    def c(self) -> float:
        return self.draft_step / self.target_step

    def v(self, gamma: int) -> float:
        return self.verify[gamma] / self.target_step

    def plain_seconds(self, width: int, calls: int) -> float:
        return self.setup[width]["target"] + calls * (self.target_step + self.plain_loop)

    def speculative_seconds(self, width: int, gamma: int, rounds: int, two_token_calls: int,
                            model_steps: Optional[int] = None) -> float:
        """model_steps: the draft-model steps the decode ran (default gamma per round, what a
        draft model alone runs)."""
        setup = self.setup[width]
        model_steps = rounds * gamma if model_steps is None else model_steps
        return (setup["target"] + setup["draft"]
                + rounds * (self.verify[gamma] + self.round_loop[gamma])
                + model_steps * self.draft_step
                + two_token_calls * (self.draft_two - self.draft_step))

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["verify"] = {str(g): t for g, t in self.verify.items()}
        out["setup"] = {str(w): s for w, s in self.setup.items()}
        out["round_loop"] = {str(g): t for g, t in self.round_loop.items()}
        return out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Costs":
        d = dict(d)
        d["verify"] = {int(g): t for g, t in d["verify"].items()}
        d["setup"] = {int(w): s for w, s in d["setup"].items()}
        d["round_loop"] = {int(g): t for g, t in d["round_loop"].items()}
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


def draft_model(draft) -> Optional[Model]:
    """The model a draft runs (itself, or a Fallback's), None for a zero-cost draft."""
    models = draft_models(draft)
    if len(models) > 1:
        raise ValueError(f"the cost model times one draft model, {draft!r} holds {len(models)}")
    return models[0] if models else None


def draft_label(draft) -> str:
    """A short description of a draft (a Model's config class and size, not its weights)."""
    if isinstance(draft, Fallback):
        return f"Fallback({draft_label(draft.first)}, {draft_label(draft.then)})"
    if isinstance(draft, Model):
        return f"{type(draft.config).__name__} model ({draft.num_params():,} parameters)"
    return repr(draft)


def timed_parts(draft) -> Dict[str, Any]:
    """What `measure_costs` timed for this draft, for timing.json."""
    model = draft_model(draft)
    proposing = ("draft-model steps (c T, T_d2), their set-up; the loop (L_gamma) with free "
                 "model steps" if loop_kind(draft)[0] == "model" else
                 "the zero-cost draft itself inside the loop timer (L_gamma: its work on a "
                 "random input of the steps' width), with free model steps for a fallback's model")
    return {"draft": draft_label(draft), "draft_model_steps_timed": model is not None,
            "zero_cost_draft_in_loop": loop_kind(draft)[0] != "model",
            "proposing": proposing,
            "left_out": ("a fallback model's catch-up feeds after lookup rounds are charged as "
                         "two-token calls" if isinstance(draft, Fallback) else None)}


def measure_costs(target, draft, gammas: Sequence[int], widths: Sequence[int], step_width: int,
                  cache_len: int, rounds: int = 20,
                  sampling: SamplingConfig = SamplingConfig()) -> Costs:
    """Time every part of the model on this device: steps at input width `step_width` and
    cache length `cache_len`, set-up at every width in `widths`, the loops' own work with
    `sampling`'s static top-k / top-p; interleaved medians. draft: a draft Model, a
    zero-cost draft (no model: c = 0, its work timed in the loop) or a Fallback of the two."""
    model = draft_model(draft)
    specs = {"target_1": (target, 1), **{f"target_{g + 1}": (target, g + 1) for g in gammas}}
    if model is not None:
        specs.update(draft_1=(model, 1), draft_2=(model, 2))
    steps = step_times(specs, 1, step_width, cache_len, cache_len // 2, rounds)
    timers = {(w, name): setup_timer(m, w, cache_len)
              for w in widths for name, m in (("target", target), ("draft", model)) if m is not None}
    setup = interleaved_medians(timers, rounds, warmup=2)
    loops = {g: loop_timer(target.config.vocab_size, g, sampling, cache_len,
                           draft=draft if g else None, width=step_width) for g in [0, *gammas]}
    loop = interleaved_medians({g: run for g, (run, _) in loops.items()}, rounds, warmup=1)
    per_call = {g: loop[g] / calls for g, (_, calls) in loops.items()}
    return Costs(target_step=steps["target_1"], draft_step=steps.get("draft_1", 0.0),
                 draft_two=steps.get("draft_2", 0.0),
                 verify={g: steps[f"target_{g + 1}"] for g in gammas},
                 setup={w: {name: setup.get((w, name), 0.0) for name in ("target", "draft")}
                        for w in widths},
                 plain_loop=per_call[0], round_loop={g: per_call[g] for g in gammas},
                 step_width=step_width, cache_len=cache_len)
