import gc
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The commands keep compiled programs in JAX's persistent cache (~/.cache/speculative_t5/jax
# by default). Tests run with it off: the suite once crashed inside XLA reading an entry it
# had written earlier in the same process, and a test must not depend on an earlier run.
os.environ.setdefault("SPECULATIVE_T5_COMPILE_CACHE", "off")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every module's compiled programs and traced functions when it ends: the suite is
    one long process, and what XLA holds otherwise grows with every file."""
    yield
    import jax
    jax.clear_caches()
    gc.collect()
