import gc
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# PyTorch (the reference models) on one thread: two workers' threads on two cores spin-wait
# on each other, and a tiny forward pass took ~0.7 s instead of ~4 ms
os.environ.setdefault("OMP_NUM_THREADS", "1")

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

# Tests compile small programs and run them once or over 10^4-10^5 rows (the chi-square
# tests): XLA's optimizations cost more compile time than they save in either, so they are
# off in the workers and the subprocesses they start. The chi-square tests once compiled
# with them: 285 s for those 38 tests against 215 s without (2026-12-06, 2 cores; an
# adaptive-gamma chi-square 45 s against 15 s), the 4x2 mesh's chi-square 18.6 s against
# 12.5 s. Both compile to the same results.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's fusion emitters cost compile time the tests never win back: without them a small
# speculative decode compiled in 2.0 s instead of 2.8 s, and a 60,000-row chi-square decode
# ran no slower (2026-12-06, 2 cores). Subprocesses keep these flags (helpers.xla_flags).
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false"]).strip()

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


# The files that take longest, heaviest first (worker-seconds on 2 cores, `--durations=0`,
# 2026-12-06: drafts 123, adaptive_gamma 112, block_verification 99, partitioning 97,
# gpt2_generate 93, exactness 78, paper 77, trees 67, training 52, checkpoints 36, then
# decode_cli, hardening, plan at ~30): with `-n 2 --dist loadfile` whole files go to
# whichever worker is free, in this order, so no long file starts last and leaves one
# worker idle at the end (test_trees.py, 67 s, was missing and ran among the last by
# name). The rest follow by name.
HEAVY_FILES = ("test_drafts.py", "test_adaptive_gamma.py", "test_block_verification.py",
               "test_partitioning.py", "test_gpt2_generate.py", "test_exactness.py",
               "test_paper.py", "test_trees.py", "test_training.py", "test_checkpoints.py",
               "test_decode_cli.py", "test_hardening.py", "test_plan.py", "test_generate.py",
               "test_decode_cache.py", "test_speculative_beam.py", "test_beam_search.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order set below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return HEAVY_FILES.index(name) if name in HEAVY_FILES else len(HEAVY_FILES)
    items.sort(key=rank)  # stable: tests keep their order within a file
