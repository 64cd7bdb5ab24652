"""The cost model: a decode's walltime predicted from parts measured separately on the
device, none of them fitted to the decodes it predicts.

    plain decode        = setup_target(W) + calls * T
    speculative decode  = setup_target(W) + setup_draft(W)
                          + rounds * (v T + gamma c T) + two_token_calls * (T_d2 - c T)

setup_*(W): one model's encoder, cross-attention keys/values and cache allocation for an
input of width W (one jitted call, so its dispatch is in it too); T: a one-token target
step; v T: a target step over gamma+1 tokens (the verify pass); c T: a one-token draft step;
T_d2: a draft step over two tokens (the first draft call after a round that accepted every
draft). Steps are timed inside one compiled loop, as the decode loop runs them
(`timing.step_times`). Rounds, calls and two-token calls are counted by the decode itself.
Eq. (5) is the special case with no set-up, unbounded text (eq. 1) and no two-token calls.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Sequence

from speculative_t5.measure.timing import interleaved_medians, setup_timer, step_times


@dataclasses.dataclass
class Costs:
    """Seconds per part, batch 1; `c`, `v(gamma)` are the paper's ratios of them."""
    target_step: float                 # T
    draft_step: float                  # c T
    draft_two: float                   # T_d2
    verify: Dict[int, float]           # gamma -> v(gamma) T
    setup: Dict[int, Dict[str, float]]  # input width -> {'target': s, 'draft': s}
    step_width: int                    # the input width the steps were timed at
    cache_len: int

    @property
    def c(self) -> float:
        return self.draft_step / self.target_step

    def v(self, gamma: int) -> float:
        return self.verify[gamma] / self.target_step

    def plain_seconds(self, width: int, calls: int) -> float:
        return self.setup[width]["target"] + calls * self.target_step

    def speculative_seconds(self, width: int, gamma: int, rounds: int,
                            two_token_calls: int) -> float:
        setup = self.setup[width]
        return (setup["target"] + setup["draft"]
                + rounds * (self.verify[gamma] + gamma * self.draft_step)
                + two_token_calls * (self.draft_two - self.draft_step))

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["verify"] = {str(g): t for g, t in self.verify.items()}
        out["setup"] = {str(w): s for w, s in self.setup.items()}
        return out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Costs":
        d = dict(d)
        d["verify"] = {int(g): t for g, t in d["verify"].items()}
        d["setup"] = {int(w): s for w, s in d["setup"].items()}
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


def measure_costs(target, draft, gammas: Sequence[int], widths: Sequence[int], step_width: int,
                  cache_len: int, rounds: int = 20) -> Costs:
    """Time every part of the model on this device: steps at input width `step_width` and
    cache length `cache_len`, set-up at every width in `widths`; interleaved medians."""
    specs = {"target_1": (target, 1), "draft_1": (draft, 1), "draft_2": (draft, 2),
             **{f"target_{g + 1}": (target, g + 1) for g in gammas}}
    steps = step_times(specs, 1, step_width, cache_len, cache_len // 2, rounds)
    timers = {(w, name): setup_timer(m, w, cache_len)
              for w in widths for name, m in (("target", target), ("draft", draft))}
    setup = interleaved_medians(timers, rounds, warmup=2)
    return Costs(target_step=steps["target_1"], draft_step=steps["draft_1"],
                 draft_two=steps["draft_2"],
                 verify={g: steps[f"target_{g + 1}"] for g in gammas},
                 setup={w: {name: setup[(w, name)] for name in ("target", "draft")} for w in widths},
                 step_width=step_width, cache_len=cache_len)
