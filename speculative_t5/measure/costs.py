"""The cost model: a decode's walltime predicted from parts measured separately on the
device, none of them fitted to the decodes it predicts.

    plain decode        = call + setup_target(W) + calls * (T_plain + L_1)
    speculative decode  = call + setup_target(W) + setup_draft(W)
                          + rounds * (R_gamma + L_gamma) + two_token_calls * (T_d2 - c T)

call: what a call of `st.generate` pays besides the device's work (argument checks, keys,
dispatch, moving the output to the host): a 1-token plain decode at the steps' width less
its set-up, step and loop parts (`timing.call_timer`), charged alike to both decoders.
setup_*(W): one model's encoder, cross-attention keys/values and cache allocation for an
input of width W, timed with the decode's first one-token step in one jitted call (so its
dispatch is in it too) less a steady-state step: what a decode pays once, including its
first pass over the weights from a colder cache (`timing.setup_timer`); T: a one-token target
step (over the speculative caches' length; T_plain: over the plain decode's, max_decode_len
positions, where it was timed); v T: a target step over gamma+1 tokens (the verify pass);
c T: a one-token draft step;
T_d2: a draft step over two tokens (the first draft call after a round that accepted every
draft). Steps are timed inside one compiled loop, as the decode loop runs them
(`calibration.step_timer`). R_gamma: a round's model steps, gamma draft steps then the verify
pass, timed as one compiled loop of rounds with the two models in turn (`timing.round_timer`):
what v T + gamma c T, each model timed alone, leave out (one model's pass evicting the
other's weights from the caches) is there; without it (a cost model from parts alone) it is
v T + gamma c T. L_1, L_gamma: the decode loop's own work per plain step and per
speculative round (sampling, the accept test, writing tokens, statistics), timed by running
the loops with model steps that cost nothing (`timing.loop_timer`), at the decode's own
sampling settings (a sampled round does more work than an argmax one). Rounds, calls and
two-token calls are counted by the decode itself. The walltime drivers time every part once
more right after each example's decodes (`PartTimers.once`) and predict each decode from
the parts timed beside it, so the machine's drift moves both alike.
Eq. (5) is the special case with no set-up, unbounded text (eq. 1) and no two-token calls.

Zero-cost drafts (`decoding.drafts`): a PromptLookup (or Bigram) has no model, so c = 0,
T_d2 = 0 and no draft set-up; its proposing is work of the loop, so L_gamma is timed with
the draft object itself inside the free loop (a lookup over a random input of the steps'
width and the tokens emitted). A Fallback(PromptLookup, model): c, T_d2 and the set-up are
the model's, L_gamma is timed with the real lookup and a free model, and the model's steps
are charged as the decode counts them (`draft_model_steps`: gamma per round the model
drafted, none for a round the lookup served), in place of gamma per round:

    speculative  = ... + rounds * (v T + L_gamma) + draft_model_steps * c T + ...

(no R_gamma: the model drafts in some rounds only).

Left out for a Fallback: after lookup rounds its model catches up in (gamma+1)-token feeds,
charged as one two-token call (T_d2 - c T) each. `timed_parts` says which parts a cell's
draft had timed (timing.json keeps it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

import jax
import numpy as np

from speculative_t5.decoding.drafts import Fallback
from speculative_t5.decoding.sampling import SamplingConfig
from speculative_t5.engine import draft_models
from speculative_t5.calibration import interleaved_medians, step_timer
from speculative_t5.measure.timing import (call_timer, call_width, loop_kind, loop_timer,
                                           round_timer, setup_timer)
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
    model_round: Dict[int, float] = dataclasses.field(default_factory=dict)
    # gamma -> R_gamma: a round's model steps, both models in turn (a draft model only)
    call: float = 0.0                  # st.generate's own cost per decode
    plain_step: Optional[float] = None  # T over the plain decode's cache (None: target_step)

    @property
    def c(self) -> float:
        return self.draft_step / self.target_step

    def v(self, gamma: int) -> float:
        return self.verify[gamma] / self.target_step

    def plain_seconds(self, width: int, calls: int) -> float:
        step = self.target_step if self.plain_step is None else self.plain_step
        return self.call + self.setup[width]["target"] + calls * (step + self.plain_loop)

    def speculative_seconds(self, width: int, gamma: int, rounds: int, two_token_calls: int,
                            model_steps: Optional[int] = None) -> float:
        """model_steps: the draft-model steps the decode ran (default gamma per round, what a
        draft model alone runs); where that is gamma every round, a round's model steps are
        R_gamma (timed in turn) if it was timed."""
        setup = self.setup[width]
        model_steps = rounds * gamma if model_steps is None else model_steps
        if model_steps == rounds * gamma and gamma in self.model_round:  # gamma every round
            steps = rounds * self.model_round[gamma]
        else:
            steps = rounds * self.verify[gamma] + model_steps * self.draft_step
        return (self.call + setup["target"] + setup["draft"] + steps + rounds * self.round_loop[gamma]
                + two_token_calls * (self.draft_two - self.draft_step))

    def interleave(self, gamma: int) -> float:
        """Seconds a round's model steps cost in turn beyond their parts timed alone:
        R_gamma - (v T + gamma c T) (0 where R_gamma was not timed)."""
        if gamma not in self.model_round:
            return 0.0
        return self.model_round[gamma] - self.verify[gamma] - gamma * self.draft_step

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["verify"] = {str(g): t for g, t in self.verify.items()}
        out["setup"] = {str(w): s for w, s in self.setup.items()}
        out["round_loop"] = {str(g): t for g, t in self.round_loop.items()}
        out["model_round"] = {str(g): t for g, t in self.model_round.items()}
        return out

    def parts(self) -> Dict[str, float]:
        """The parts by name, as `PartTimers` names them: target_1 (T), target_{g+1} (v T),
        draft_1 (c T), draft_2 (T_d2), setup_{target,draft}_{W}, loop_0 (L_1), loop_{g},
        round_{g} (R_gamma), call, plain_1 (T_plain, where timed)."""
        out = {"target_1": self.target_step, "draft_1": self.draft_step,
               "draft_2": self.draft_two, "loop_0": self.plain_loop, "call": self.call}
        if self.plain_step is not None:
            out["plain_1"] = self.plain_step
        out.update({f"target_{g + 1}": t for g, t in self.verify.items()})
        out.update({f"loop_{g}": t for g, t in self.round_loop.items()})
        out.update({f"round_{g}": t for g, t in self.model_round.items()})
        for w, s in self.setup.items():
            out.update({f"setup_{role}_{w}": t for role, t in s.items()})
        return out

    @classmethod
    def from_parts(cls, parts: Dict[str, float], step_width: int, cache_len: int) -> "Costs":
        """Costs from parts by name (`parts`); a draft's parts absent are 0 (no draft model)."""
        setup: Dict[int, Dict[str, float]] = {}
        for name, t in parts.items():
            if name.startswith("setup_"):
                _, role, w = name.split("_")
                setup.setdefault(int(w), {"target": 0.0, "draft": 0.0})[role] = t
        gammas = [int(n.split("_")[1]) - 1 for n in parts
                  if n.startswith("target_") and n != "target_1"]
        return cls(target_step=parts["target_1"], draft_step=parts.get("draft_1", 0.0),
                   draft_two=parts.get("draft_2", 0.0),
                   verify={g: parts[f"target_{g + 1}"] for g in gammas}, setup=setup,
                   plain_loop=parts["loop_0"], round_loop={g: parts[f"loop_{g}"] for g in gammas},
                   step_width=step_width, cache_len=cache_len,
                   model_round={g: parts[f"round_{g}"] for g in gammas if f"round_{g}" in parts},
                   call=parts.get("call", 0.0), plain_step=parts.get("plain_1"))

    def median_with(self, measured: Sequence[Dict[str, float]]) -> "Costs":
        """These costs with each part replaced by its median over `measured` (parts timed
        beside the decodes, `PartTimers.once`), where it was measured there."""
        parts = self.parts()
        for name in parts:
            values = [m[name] for m in measured if name in m]
            if values:
                parts[name] = float(np.median(values))
        return Costs.from_parts(parts, self.step_width, self.cache_len)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Costs":
        d = dict(d)
        d["verify"] = {int(g): t for g, t in d["verify"].items()}
        d["setup"] = {int(w): s for w, s in d["setup"].items()}
        d["round_loop"] = {int(g): t for g, t in d["round_loop"].items()}
        d["model_round"] = {int(g): t for g, t in d.get("model_round", {}).items()}
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


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
    proposing = ("draft-model steps (c T, T_d2), their set-up, a round's model steps in turn "
                 "(R_gamma); the loop (L_gamma) with free "
                 "model steps" if loop_kind(draft)[0] == "model" else
                 "the zero-cost draft itself inside the loop timer (L_gamma: its work on a "
                 "random input of the steps' width), with free model steps for a fallback's model")
    return {"draft": draft_label(draft), "draft_model_steps_timed": model is not None,
            "zero_cost_draft_in_loop": loop_kind(draft)[0] != "model",
            "proposing": proposing,
            "left_out": ("a fallback model's catch-up feeds after lookup rounds are charged as "
                         "two-token calls" if isinstance(draft, Fallback) else None)}


STEPS = 8  # decoder steps per step-timer call


class PartTimers:
    """A timer for every part of the cost model, built once per pair and lengths: `measure`
    takes interleaved medians (the parts of a cell, measured before its decodes), `once`
    times each part one more time (the walltime drivers call it right after each example's
    decodes, so the machine's drift hits the parts as it hits the decodes they predict)."""

    def __init__(self, target, draft, gammas: Sequence[int], widths: Sequence[int],
                 step_width: int, cache_len: int, sampling: SamplingConfig = SamplingConfig(),
                 plain_len: Optional[int] = None):
        """plain_len: the plain decode's cache length (max_decode_len), where it differs from
        the speculative caches' cache_len: its one-token step is timed there too (plain_1)."""
        model = draft_model(draft)
        self.step_width, self.cache_len = step_width, cache_len
        specs = {"target_1": (target, 1, cache_len),
                 **{f"target_{g + 1}": (target, g + 1, cache_len) for g in gammas}}
        if plain_len is not None and plain_len != cache_len:
            specs["plain_1"] = (target, 1, plain_len)
        if model is not None:
            specs.update(draft_1=(model, 1, cache_len), draft_2=(model, 2, cache_len))
        self.timers = {name: (step_timer(m, 1, K, step_width, L, L // 2, STEPS), STEPS)
                       for name, (m, K, L) in specs.items()}              # name -> (fn, units)
        if isinstance(draft, Model):            # a draft model drafts every round: R_gamma
            for g in gammas:
                self.timers[f"round_{g}"] = (round_timer(target, draft, g, step_width, cache_len,
                                                         STEPS), STEPS)
        self.timers["call"] = (call_timer(target, step_width), 1)
        self.call_width = call_width(target, step_width)   # its set-up is timed too
        self.widths = {}                      # the set-up timers' names by input width
        for w in sorted(set(widths) | {step_width, self.call_width}):
            for role, m in (("target", target), ("draft", model)):
                if m is not None:
                    self.timers[f"setup_{role}_{w}"] = (setup_timer(m, w, cache_len), 1)
                    self.widths.setdefault(w, []).append(f"setup_{role}_{w}")
        for g in [0, *gammas]:
            self.timers[f"loop_{g}"] = loop_timer(target.config.vocab_size, g, sampling,
                                                  cache_len, draft=draft if g else None,
                                                  width=step_width)

    def _names(self, width: Optional[int]):
        """The timers `once(width)` runs: all but other widths' set-up (the target's at the
        steps' width and at the call's always: the decodes' set-up is reckoned beside the
        first, `call` from the second)."""
        always = {f"setup_target_{self.step_width}", f"setup_target_{self.call_width}"}
        return [n for n in self.timers if not n.startswith("setup_") or width is None
                or n in self.widths[width] or n in always]

    def measure(self, rounds: int, warmup: int = 2) -> "Costs":
        """Median seconds per unit of every part, timed in turn within each round."""
        med = interleaved_medians({n: self.timers[n][0] for n in self._names(None)}, rounds,
                                  warmup)
        return Costs.from_parts(self._parts(med), self.step_width, self.cache_len)

    def warm(self) -> None:
        """Run every timer once (compiling it), timing nothing."""
        for name in self._names(None):
            jax.block_until_ready(self.timers[name][0]())

    def once(self, width: int) -> Dict[str, float]:
        """Each part timed once more (set-up at this input width only): {name: seconds}."""
        return self._parts(interleaved_medians(
            {n: self.timers[n][0] for n in self._names(width)}, 1, warmup=0))

    def _parts(self, seconds: Dict[str, float]) -> Dict[str, float]:
        """Seconds per call -> per unit; a set-up timer's call ends with its model's first
        one-token step (`setup_timer`), so a steady-state step is subtracted (never below 0:
        a tiny model's set-up can be within a step's noise)."""
        per = {n: t / self.timers[n][1] for n, t in seconds.items()}
        # a 1-token decode at the steps' width less its device work: the set-up timer's call
        # (set-up and first step) and one plain step's loop work
        per["call"] = max(per["call"] - per[f"setup_target_{self.call_width}"] - per["loop_0"], 0.0)
        for n in per:
            if n.startswith("setup_"):
                per[n] = max(per[n] - per[n.split("_")[1] + "_1"], 0.0)
        return per


def measure_costs(target, draft, gammas: Sequence[int], widths: Sequence[int], step_width: int,
                  cache_len: int, rounds: int = 20,
                  sampling: SamplingConfig = SamplingConfig(),
                  plain_len: Optional[int] = None) -> Costs:
    """Time every part of the model on this device: steps at input width `step_width` and
    cache length `cache_len`, set-up at every width in `widths`, the loops' own work with
    `sampling`'s static top-k / top-p; interleaved medians. draft: a draft Model, a
    zero-cost draft (no model: c = 0, its work timed in the loop) or a Fallback of the two.
    plain_len: the plain decode's cache length, where its one-token step is timed too."""
    return PartTimers(target, draft, gammas, widths, step_width, cache_len,
                      sampling, plain_len).measure(rounds)
