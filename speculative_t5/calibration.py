"""Timing the models' steps where the decode runs, for the choices a decode makes from costs
(adaptive gamma's c and v, `engine.gamma_costs`). The one home of step timing: the cost
model (`measure.costs`) and the benchmarks import their step timers from here.

A step is timed inside one compiled loop of steps, as a decode loop pays it (no Python
dispatch per step); variants are timed in turn, medians taken, so noise hits all alike."""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5.model.api import Model, decode, init_cache, prefill_cache


@functools.partial(jax.jit, static_argnums=(4,), donate_argnums=(1,))
def _steps(model: Model, cache, tokens, pos, n: int):
    """n decoder steps inside one program, each fed the argmax of the last (a data
    dependency, as in decoding), so a step costs what it costs inside a decode loop:
    no Python dispatch per step (which, for a small draft, can exceed the step itself)."""
    def body(_, carry):
        cache, toks = carry
        logits, cache = decode(model, cache, toks, pos)                        # [B, K, V]
        return cache, jnp.argmax(logits, -1).astype(jnp.int32)                 # [B, K]
    return jax.lax.fori_loop(0, n, body, (cache, tokens))


def _block(x):
    jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)
    return x


def interleaved_medians(fns: Dict[str, Callable[[], Any]], rounds: int, warmup: int = 1,
                        before: Optional[Callable[[], Any]] = None) -> Dict[str, float]:
    """Median seconds per call of each fn, timing them in turn within every round;
    `before` (untimed) runs before each timed call (e.g. a cache flush)."""
    for fn in fns.values():
        for _ in range(warmup):
            _block(fn())
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            _block(fn())
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def step_timer(model: Model, batch: int, K: int, input_len: int = 32, max_len: int = 64,
               pos: int = 16, steps: int = 16, seed: int = 0) -> Callable[[], Any]:
    """A no-argument function running `steps` decoder steps over K tokens in one jitted
    loop (cache donated); divide its time by `steps` (as `step_times` does)."""
    rng = np.random.RandomState(seed)
    c = model.config
    x = jnp.asarray(rng.randint(2, c.vocab_size, (batch, input_len)), jnp.int32)
    tokens = jnp.asarray(rng.randint(2, c.vocab_size, (batch, K)), jnp.int32)
    positions = jnp.full((batch,), pos, jnp.int32)
    state = {"cache": prefill_cache(model, x, jnp.full((batch,), input_len), max_len)
             if model.decoder_only else init_cache(model, x, max_len)}

    def run():
        state["cache"], out = _steps(model, state["cache"], tokens, positions, steps)
        return out
    return run


def step_times(specs: Dict[str, Tuple[Model, int]], batch: int = 1, input_len: int = 32,
               max_len: int = 64, pos: int = 16, rounds: int = 20, steps: int = 16,
               warmup: int = 2) -> Dict[str, float]:
    """Median seconds per decoder step of each {name: (model, K tokens)}, as a compiled
    decode loop pays it, the variants timed in turn (c and v are ratios of these)."""
    timers = {name: step_timer(m, batch, K, input_len, max_len, pos, steps)
              for name, (m, K) in specs.items()}
    return {k: t / steps for k, t in interleaved_medians(timers, rounds, warmup).items()}


class GammaCosts(NamedTuple):
    """The paper's cost ratios as a decode loop pays them, in units of one plain decode
    iteration (a target step and its sampling): c per draft, v for the rest of a round (the
    verify pass over gamma + 1 tokens and the accept test), v1 the same for a round of one
    draft (over 2 tokens). A round of w drafts costs v1 + (v - v1)(w - 1)/(gamma - 1), a
    line through both; v1 None: 1 + (v - 1)/gamma, the line from a plain step to v (which
    underrates narrow rounds at large batches: batch 64 here, 1.57 measured, 1.22 so).
    w: the draft models' feed of gamma + 1 tokens, the chunk a draft model catches up in
    after plain rounds (`ModelDraft`); None: c, as dear as one step (at batch 64 here it
    is 3.6 c)."""
    c: float
    v: float
    v1: Optional[float] = None
    w: Optional[float] = None

    def resolved(self, gamma: int) -> "GammaCosts":
        """These costs with v1 and w filled in for rounds of at most gamma drafts."""
        v1 = self.v if gamma == 1 else self.v1
        return self._replace(v1=1.0 + (self.v - 1.0) / gamma if v1 is None else v1,
                             w=self.c if self.w is None else self.w)


def check_gamma_costs(costs) -> GammaCosts:
    """Costs given by hand (`adaptive_gamma=GammaCosts(...)` or a plain tuple) as
    GammaCosts: c and v numbers >= 0, v1 and w numbers >= 0 or None."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
    if not (isinstance(costs, tuple) and 2 <= len(costs) <= 4 and all(
            number(x) or (i >= 2 and x is None) for i, x in enumerate(costs))):
        raise ValueError(f"adaptive_gamma must be True, False or GammaCosts(c, v[, v1[, w]]) "
                         f"with c, v, v1, w >= 0 (v1, w may be None), got {costs!r}")
    return GammaCosts(*(None if x is None else float(x) for x in costs))
