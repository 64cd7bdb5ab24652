"""`Partitioner`: a ('data', 'model') device mesh and T5X's logical axis rules.

T5X's names and meaning (`t5x.partitioning.PjitPartitioner`): `num_partitions` devices
hold one copy of the model, each a 1/num_partitions slice of every partitioned parameter
(vocab, mlp, heads, joined_kv over 'model'); the remaining factor of the device count runs
copies side by side on different rows of the batch ('data'). The model only names its axes
(`model.api.param_axes`, `model.api.cache_axes`); this module turns names into shardings.
"""
from __future__ import annotations

import math
import os
import re
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from speculative_t5 import layouts
from speculative_t5.model.api import Model, param_axes, param_shapes
from speculative_t5.model.config import T5Config

# t5x.partitioning.standard_logical_axis_rules() with 1-D parameter and activation
# partitioning: the rules every T5X gin file starts from.
STANDARD_RULES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("batch", "data"), ("vocab", "model"), ("embed", None), ("mlp", "model"),
    ("heads", "model"), ("kv", None), ("joined_kv", "model"), ("relpos_buckets", None),
    ("abspos_buckets", None), ("length", None), ("layers", None), ("stack", None),
    ("mlp_activations", None))
DRAFT_MODES = ("replicated", "partitioned")
LAYOUT_MODES = ("compiler", "default")


def _mesh_devices(devices: Sequence[Any], num_partitions: int) -> np.ndarray:
    """[data, model] devices: a model group never spans processes when it fits in one
    (devices sorted by process, then id), and on TPU follows the physical topology."""
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    shape = (len(devices) // num_partitions, num_partitions)
    if devices[0].platform == "tpu":
        from jax.experimental import mesh_utils
        try:
            return mesh_utils.create_device_mesh(shape, devices)
        except (AssertionError, ValueError, NotImplementedError):
            pass  # a subset of a slice: plain order
    return np.asarray(devices, dtype=object).reshape(shape)


@gin.configurable
class Partitioner:
    """A ('data', 'model') mesh over `devices` (default: every device of every process).

    num_partitions: devices per model copy ('model' axis size); must divide the device count.
    model_parallel_submesh: T5X's TPU form, e.g. (2, 2, 1, 1): the same as num_partitions =
        the product of its entries (give one or the other).
    logical_axis_rules: (logical name, mesh axis or None) pairs; default T5X's standard rules.
    draft: 'replicated' (every device holds the whole draft: the usual choice for a small
        draft) or 'partitioned' (sliced over 'model' like the target).
    parameter_layouts: 'compiler' (parameters placed in the layouts the compiler asks for
        in a verify pass of `layout_batch` rows per model copy, `layouts.compiler_layouts`:
        on a TPU a decode of that batch then copies no weight into another layout; CPUs
        keep row-major) or 'default' (row-major everywhere).
    layout_batch: the rows per model copy that the layouts are chosen for (default 1, the
        paper's setting; the compiler wants other layouts for 32 rows than for 1)."""

    def __init__(self, num_partitions: Optional[int] = None,
                 model_parallel_submesh: Optional[Sequence[int]] = None,
                 logical_axis_rules: Optional[Sequence[Tuple[str, Optional[str]]]] = None,
                 draft: str = "replicated", devices: Optional[Sequence[Any]] = None,
                 parameter_layouts: str = "compiler", layout_batch: int = 1):
        devices = list(jax.devices() if devices is None else devices)
        if model_parallel_submesh is not None:
            sub = tuple(int(x) for x in model_parallel_submesh)
            if any(x < 1 for x in sub):
                raise ValueError(f"model_parallel_submesh entries must be >= 1, got {sub}")
            if num_partitions not in (None, math.prod(sub)):
                raise ValueError(f"num_partitions {num_partitions} and model_parallel_submesh "
                                 f"{sub} (= {math.prod(sub)} devices) disagree; give one")
            num_partitions = math.prod(sub)
        num_partitions = 1 if num_partitions is None else num_partitions
        if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)) \
                or num_partitions < 1:
            raise ValueError(f"num_partitions must be an int >= 1, got {num_partitions!r}")
        if len(devices) % num_partitions:
            raise ValueError(f"num_partitions {num_partitions} does not divide the {len(devices)} "
                             "devices: the mesh is (devices / num_partitions) x num_partitions")
        if draft not in DRAFT_MODES:
            raise ValueError(f"draft must be one of {DRAFT_MODES}, got {draft!r}")
        rules = STANDARD_RULES if logical_axis_rules is None else logical_axis_rules
        self.rules = tuple((str(name), None if axis is None else str(axis)) for name, axis in rules)
        for name, axis in self.rules:
            if axis not in (None, "data", "model"):
                raise ValueError(f"logical axis rule ({name!r}, {axis!r}): the mesh axes are "
                                 "'data' and 'model'")
        if parameter_layouts not in LAYOUT_MODES:
            raise ValueError(f"parameter_layouts must be one of {LAYOUT_MODES}, got "
                             f"{parameter_layouts!r}")
        if isinstance(layout_batch, bool) or not isinstance(layout_batch, (int, np.integer)) \
                or layout_batch < 1:
            raise ValueError(f"layout_batch must be an int >= 1, got {layout_batch!r}")
        self.num_partitions = int(num_partitions)
        self.draft = draft
        self.parameter_layouts = parameter_layouts
        self.layout_batch = int(layout_batch)
        self._formats = {}  # (config, role) -> the parameter tree's formats
        self.mesh = Mesh(_mesh_devices(devices, self.num_partitions), ("data", "model"))

    @property
    def data_size(self) -> int:
        return self.mesh.shape["data"]

    def _key(self):
        return (tuple(d.id for d in self.mesh.devices.flat), self.mesh.devices.shape, self.rules,
                self.draft, self.parameter_layouts, self.layout_batch)

    def __eq__(self, other):
        return isinstance(other, Partitioner) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"Partitioner(mesh data={self.data_size} x model={self.num_partitions}, "
                f"draft={self.draft})")

    # -- names -> shardings -------------------------------------------------------------
    def spec(self, logical_axes: Optional[Sequence[Optional[str]]]) -> PartitionSpec:
        """Logical axis names of one array -> its PartitionSpec over ('data', 'model')."""
        if logical_axes is None:
            return PartitionSpec()
        return nn.logical_to_mesh_axes(tuple(logical_axes), self.rules)

    def sharding(self, logical_axes: Optional[Sequence[Optional[str]]]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical_axes))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def param_shardings(self, config: T5Config, role: str = "target"):
        """The parameter tree's NamedShardings; a replicated draft gets P() everywhere.
        A partitioned dimension that the mesh axis does not divide is an error naming both."""
        replicate = role == "draft" and self.draft == "replicated"
        axes = param_axes(config)
        shapes = param_shapes(config)

        def one(path, spec, shape):
            if replicate:
                return self.replicated()
            mesh_spec = self.spec(tuple(spec))
            for size, axis, name in zip(shape.shape, mesh_spec, spec):
                if axis is not None and size % self.mesh.shape[axis]:
                    raise ValueError(
                        f"{jax.tree_util.keystr(path)}: its '{name}' dimension ({size}) is not "
                        f"divisible by the mesh's '{axis}' axis ({self.mesh.shape[axis]} devices); "
                        f"choose num_partitions dividing {size}")
            return NamedSharding(self.mesh, mesh_spec)
        return jax.tree_util.tree_map_with_path(
            one, axes, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))

    def param_formats(self, config: T5Config, role: str = "target"):
        """Where and how each parameter is placed: its NamedSharding, or a
        `jax.experimental.layout.Format` (sharding + layout) where the compiler asks for a
        layout other than row-major (`parameter_layouts='compiler'`; found once per config
        and role by compiling a small probe, none on CPUs)."""
        shardings = self.param_shardings(config, role)
        if self.parameter_layouts == "default":
            return shardings
        key = (config, role)
        if key not in self._formats:
            try:
                found = layouts.compiler_layouts(config, self, role)
                self._formats[key] = layouts.with_layouts(shardings, found)
            except Exception as e:  # the compiler's own errors: a performance loss only
                layouts.probe_failed(e)
                self._formats[key] = shardings
        return self._formats[key]

    def shard(self, model: Model, role: str = "target") -> Model:
        """`model` with every parameter placed in its shards and layouts (a no-op for those
        already placed so)."""
        formats = self.param_formats(model.config, role)
        return Model(model.config, jax.tree_util.tree_map(jax.device_put, model.params, formats))

    def check(self, model: Model, role: str = "target") -> None:
        """Raise unless `model`'s parameters are placed as this partitioner places them."""
        want = self.param_shardings(model.config, role)
        for (path, x), s in zip(jax.tree_util.tree_leaves_with_path(model.params),
                                jax.tree_util.tree_leaves(want)):
            have = getattr(x, "sharding", None)
            if have is None or not have.is_equivalent_to(s, x.ndim):
                raise ValueError(f"{role} parameter {jax.tree_util.keystr(path)} is not placed "
                                 f"on this partitioner's mesh ({have}); load the model with "
                                 "load_checkpoint(..., partitioner=p) or call p.shard(model)")

    def constrain(self, tree: Any, axes: Any, role: str = "target") -> Any:
        """with_sharding_constraint on every array of `tree` by its logical `axes` (same tree,
        a tuple of names per array); inside jit. A replicated draft's arrays keep only their
        rows split (over 'data'): its steps then need no communication at all."""
        return jax.tree_util.tree_map(
            lambda a, x: jax.lax.with_sharding_constraint(x, self.sharding(a)),
            self._role_axes(axes, role), tree, is_leaf=_is_axes)

    def abstract(self, tree: Any, axes: Any, role: str = "target") -> Any:
        """ShapeDtypeStructs of `tree` (arrays or `jax.eval_shape` output) carrying the
        shardings `constrain` gives them: what `jit(...).lower` takes to compile for this
        mesh with nothing allocated (a TPU topology with no TPU attached, `compile`)."""
        return jax.tree_util.tree_map(
            lambda a, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.sharding(a)),
            self._role_axes(axes, role), tree, is_leaf=_is_axes)

    def _role_axes(self, axes: Any, role: str) -> Any:
        """A replicated draft's arrays keep only their rows split (over 'data')."""
        if role == "draft" and self.draft == "replicated":
            return jax.tree_util.tree_map(
                lambda a: tuple(n if n == "batch" else None for n in a), axes, is_leaf=_is_axes)
        return axes


def _is_axes(a) -> bool:
    """One array's logical axes: a tuple of names (None = not partitioned)."""
    return isinstance(a, tuple) and all(n is None or isinstance(n, str) for n in a)


INIT_MARGIN = 30  # s: JAX's own deadline, this much past ours, ends the process natively
LOST_PEER = re.compile(r"gloo|connection reset|socket closed|unavailable|deadline.exceeded|"
                       r"heartbeat|coordination service|barrier|nccl|peer", re.IGNORECASE)


def check_address(address: str) -> Tuple[str, int]:
    """(host, port) of a HOST:PORT coordinator address ([v6::addr]:PORT for IPv6), or a
    one-line ValueError."""
    host, sep, port = str(address).rpartition(":")
    bare_v6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not sep or not host.strip("[]") or bare_v6 or not port.isdigit() \
            or not 1 <= int(port) <= 65535:
        raise ValueError(f"--coordinator_address {address!r} must be HOST:PORT with a port in "
                         "1..65535 (an IPv6 host in brackets: [::1]:1234)")
    return host.strip("[]"), int(port)


def _reachable(host: str, port: int) -> Optional[str]:
    """None if a TCP connection to host:port opens within a second, else why not."""
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return None
    except OSError as e:
        return e.strerror or type(e).__name__


def _waiting(address: Optional[str], num_processes: Optional[int],
             process_id: Optional[int]) -> Callable[[bool], str]:
    """What this process waits for, as a phrase (final=True: why it gave up)."""
    if address is None:
        return lambda final: ("JAX never found and joined every process (--multiprocess)"
                              if final else "waiting for JAX to find and join every process")
    host, port = check_address(address)
    others = num_processes - 1

    def describe(final: bool) -> str:
        why = _reachable(host, port)
        if process_id == 0:
            unreachable = "" if why is None else \
                f"; this process's own service is not reachable there: {why}"
            return (f"process 0 of {num_processes} waited at {address} for {others} of "
                    f"{num_processes} processes, which never all came; start each with the "
                    f"same --coordinator_address and --num_processes {num_processes}"
                    f"{unreachable}" if final else
                    f"waiting for {others} of {num_processes} processes at {address}, as "
                    f"the coordinator (process 0){unreachable}")
        if why is not None:
            return (f"process {process_id} of {num_processes} never reached the coordinator "
                    f"(process 0) at {address}: {why}; check the address and that process 0 "
                    "runs" if final else
                    f"waiting for the coordinator (process 0) at {address}: {why}")
        return (f"process {process_id} of {num_processes} reached the coordinator at {address}, "
                f"but not all {num_processes} processes joined" if final else
                f"waiting at {address} for all {num_processes} processes to join; the "
                "coordinator answers")
    return describe


def _watch(describe: Callable[[bool], str], timeout: float, done: threading.Event,
           first: float = 2.0, every: float = 10.0) -> None:
    """Until `done`: a progress line on stderr `first` s in, then every `every` s; at
    `timeout` s, a one-line error and exit status 1 (the wait is in native code, and JAX's
    own deadline would abort with a stack trace)."""
    start = time.monotonic()
    deadline, next_line = start + timeout, start + first
    while not done.wait(max(0.0, min(next_line, deadline) - time.monotonic())):
        now = time.monotonic()
        if now >= deadline:
            print(f"error: gave up after {timeout:g} s (--initialization_timeout): "
                  f"{describe(True)}", file=sys.stderr, flush=True)
            os._exit(1)
        print(f"{describe(False)} ({now - start:.0f} s of {timeout:g} s)", file=sys.stderr,
              flush=True)
        next_line = now + every


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None, auto: bool = False,
                           initialization_timeout: float = 300) -> bool:
    """Join JAX's distributed runtime, so the mesh spans every process's devices (each
    process then runs the same program in lock-step). Explicit address/count/id for any
    cluster (and tests on localhost); `auto` lets JAX find them (Cloud TPU pod slices,
    SLURM, Open MPI). Returns whether it initialized; must run before any device is used.
    While it waits, a line on stderr every few seconds says for what; if not every process
    has joined within initialization_timeout seconds it prints one line and ends the
    process with status 1 (JAX's wait cannot be interrupted)."""
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ValueError("give --coordinator_address, --num_processes and --process_id together "
                         "(or --multiprocess alone to let JAX find them)")
    if not (all(given) or auto):
        return False
    if isinstance(initialization_timeout, bool) or \
            not isinstance(initialization_timeout, (int, float)) or \
            not 0 < initialization_timeout < float("inf"):
        raise ValueError(f"initialization_timeout must be a number of seconds > 0, got "
                         f"{initialization_timeout!r}")
    if all(given):
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id {process_id} is outside [0, {num_processes})")
        check_address(coordinator_address)
    describe = _waiting(coordinator_address, num_processes, process_id)
    done = threading.Event()
    threading.Thread(target=_watch, args=(describe, float(initialization_timeout), done),
                     daemon=True, name="distributed-wait").start()
    try:
        jax.distributed.initialize(
            coordinator_address, num_processes, process_id,
            initialization_timeout=math.ceil(initialization_timeout) + INIT_MARGIN)
    except (RuntimeError, ValueError) as e:  # found nothing to join, a bad host name, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"could not join the distributed runtime: {first}") from None
    finally:
        done.set()
    return True


def lost_peer(error: BaseException) -> Optional[str]:
    """One line for an error a multi-process run raised because it lost another process (a
    collective or the coordination service failed), None for any other error."""
    if jax.process_count() == 1 or not isinstance(error, RuntimeError):
        return None
    text = str(error).strip()
    if not LOST_PEER.search(text):
        return None
    return (f"process {jax.process_index()} of {jax.process_count()} lost contact with another "
            f"process: {text.splitlines()[0][:300]}; restart every process with the same "
            "command to resume")
