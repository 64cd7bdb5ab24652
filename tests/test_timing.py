"""The step timer runs real decoder steps inside one compiled loop (what c and v are made
of); no timing is asserted (the machines are shared), only what is run."""
import jax.numpy as jnp
import numpy as np

import speculative_t5 as st
from helpers import tiny_config
from speculative_t5.calibration import _steps, step_times
from speculative_t5.measure.timing import decoder_step_bytes


def test_loop_steps_feed_each_argmax_to_the_next_step():
    model = st.init_model(tiny_config(), seed=0)
    x = jnp.asarray(np.arange(2, 12)[None], jnp.int32)
    tokens = jnp.asarray([[5, 7]], jnp.int32)
    pos = jnp.asarray([3], jnp.int32)
    _, out = _steps(model, st.init_cache(model, x, 16), tokens, pos, 3)
    cache, toks = st.init_cache(model, x, 16), tokens
    for _ in range(3):
        logits, cache = st.decode(model, cache, toks, pos)
        toks = jnp.argmax(logits, -1).astype(jnp.int32)
    np.testing.assert_array_equal(out, toks)


def test_step_times_and_bytes():
    target = st.init_model(tiny_config(), seed=0)
    draft = st.init_model(tiny_config(num_decoder_layers=1), seed=1)
    t = step_times({"t1": (target, 1), "t4": (target, 4), "d1": (draft, 1)}, input_len=8,
                   max_len=16, pos=4, rounds=2, steps=2)
    assert set(t) == {"t1", "t4", "d1"} and all(v > 0 for v in t.values())
    assert decoder_step_bytes(draft) < decoder_step_bytes(target) < target.num_bytes()
    assert decoder_step_bytes(target, 4) > decoder_step_bytes(target, 1)  # K embedding rows
