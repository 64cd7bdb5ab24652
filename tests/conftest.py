import gc
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# One compile cache per test run, shared by its pytest workers and every subprocess they start
# (two-process runs, the 8-device mesh checks, the CLI in a subprocess), so a program compiled
# once in the run is read, not compiled again, wherever it recurs. Created by the process that
# starts the run (xdist's workers and subprocesses inherit the environment) and removed when
# the run ends: a run never reads another run's programs. Bounded, so JAX locks the directory
# around each read and write (`commands.enable_compile_cache`): an unbounded cache writes in
# place, and a half-written entry read by a worker beside it once crashed XLA.
_OWN_CACHE = None
if "SPECULATIVE_T5_TEST_RUN_CACHE" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="st5_test_jax_")
    os.environ["SPECULATIVE_T5_TEST_RUN_CACHE"] = _OWN_CACHE
os.environ["SPECULATIVE_T5_COMPILE_CACHE"] = os.environ["SPECULATIVE_T5_TEST_RUN_CACHE"]

from speculative_t5.commands import enable_compile_cache  # noqa: E402

enable_compile_cache()
import jax  # noqa: E402

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_unconfigure(config):
    if _OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every module's compiled programs and traced functions when it ends: the suite is
    one long process, and what XLA holds otherwise grows with every file. A program a later
    module needs again comes back from the run's compile cache."""
    yield
    jax.clear_caches()
    gc.collect()
