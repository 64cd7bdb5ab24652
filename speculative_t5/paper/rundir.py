"""One experiment's output directory, resumable: per-example records appended to a JSONL
file as they are produced (flushed and fsynced), so a run that is killed and restarted
with the same command skips what is done, loses nothing and counts nothing twice; plus the
summary as CSV and markdown, the gin config used, and the software/device environment.
The paper drivers write through this."""
from __future__ import annotations

import atexit
import csv
import io
import json
import os
import platform
import shutil
import tarfile
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np


def fingerprint(path: str) -> Optional[str]:
    """sha256 of a file's content, or of a directory's files (relative names, sizes, the
    whole of files up to 1 MiB and the first and last MiB of larger ones: tells checkpoints
    apart without reading 40 GB). None for a remote (gs://) path, which is known by name."""
    import hashlib
    if "://" in path:
        return None
    h = hashlib.sha256()
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    for name in files:
        size = os.path.getsize(name)
        h.update(f"{os.path.relpath(name, path)}\0{size}\0".encode())
        with open(name, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
            elif size > 1 << 20:
                h.update(f.read())
    return h.hexdigest()


def differences(old: Any, new: Any, prefix: str = "") -> List[str]:
    """'field: old -> new' for every leaf where two JSON-like dicts differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


class JsonlLog:
    """An append-only JSONL file of records keyed by `key`, safe to resume: each append is
    flushed and fsynced; on opening, a torn last line (a kill mid-write: no newline at its
    end) is dropped so it is redone, while a corrupt line elsewhere, a missing key or a
    duplicate is an error.

    header: what makes the run (a JSON dict), kept as the file's first line. A file whose
    first line is not a header of this tool is never modified; a header of another run
    stops with the differing fields named."""

    def __init__(self, path: str, key: str = "id", header: Optional[Dict[str, Any]] = None):
        self.path, self.key = path, key
        self._ids = set()
        self._header = None if header is None else (
            json.dumps({"speculative_t5": {"header": header}}) + "\n").encode()
        self._repair_and_load()

    def _check_header(self, data: bytes) -> bytes:
        """The records after a header that is this run's; raises (writing nothing) otherwise."""
        first, newline, rest = data.partition(b"\n")
        try:
            found = json.loads(first)["speculative_t5"]["header"]
        except (ValueError, TypeError, KeyError):
            if not newline and self._header.startswith(data):
                return b""  # our own header, torn by a kill as it was written
            raise ValueError(f"{self.path} exists and is not a speculative-t5 output (its first "
                             "line is not this tool's header); it was left untouched: choose "
                             "another output path") from None
        diff = differences(found, json.loads(self._header)["speculative_t5"]["header"])
        if diff:
            raise ValueError(f"{self.path} holds another run, so it cannot be resumed by this "
                             f"one; nothing was changed. Differences: {'; '.join(diff)}. "
                             "Use another output path, or the same settings to resume.")
        return rest

    def _repair_and_load(self) -> None:
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if not exists:
            if self._header is not None:
                self._write(self._header, "wb")
            return
        with open(self.path, "rb") as f:
            data = f.read()
        body = data if self._header is None else self._check_header(data)
        lines = body.split(b"\n")
        lines.pop()  # after the last newline: empty, or a record torn by a kill (redone)
        good = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise ValueError(f"{self.path}: corrupt record {i + 1}; refusing to guess "
                                 "what is done") from None
            if not isinstance(rec, dict) or self.key not in rec or rec[self.key] in self._ids:
                raise ValueError(f"{self.path}: record {i + 1} has no {self.key!r} or a "
                                 f"duplicate one; move the file away or choose another")
            self._ids.add(rec[self.key])
            good.append(line)
        repaired = (self._header or b"") + b"".join(line + b"\n" for line in good)
        if repaired != data:
            self._write(repaired, "wb")

    def _write(self, data: bytes, mode: str) -> None:
        with open(self.path, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    @property
    def done(self) -> set:
        return set(self._ids)

    def __contains__(self, key) -> bool:
        return key in self._ids

    def append(self, record: Dict[str, Any]) -> None:
        if self.key not in record:
            raise ValueError(f"every record needs an {self.key!r}")
        if record[self.key] in self._ids:
            raise ValueError(f"record {self.key} {record[self.key]!r} is already in {self.path}")
        self._write((json.dumps(record) + "\n").encode(), "ab")
        self._ids.add(record[self.key])

    def records(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            lines = f.read().split("\n")
        if self._header is not None:
            lines = lines[1:]
        return [json.loads(line) for line in lines if line.strip()]


def coordinated_dir(path: str) -> str:
    """Where this process writes a run directory that several processes fill in lock-step
    (one program over every process's devices, outputs gathered to all): process 0, the
    coordinator, writes `path` itself; every other process gets a private scratch copy of
    what `path` held when the run started (sent from the coordinator, so hosts need not
    share a disk). Every process then resumes from the same state and takes the same
    branches; the copies are thrown away at exit. One process: `path`."""
    import jax
    if jax.process_count() == 1:
        return path
    from jax.experimental import multihost_utils
    data = b""
    if jax.process_index() == 0 and os.path.isdir(path):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(path, arcname=".")
        data = buf.getvalue()
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(data))))
    payload = np.frombuffer(data, np.uint8) if data else np.zeros(size, np.uint8)
    payload = np.asarray(multihost_utils.broadcast_one_to_all(payload)) if size else payload
    if jax.process_index() == 0:
        return path
    scratch = tempfile.mkdtemp(prefix=f"speculative_t5_process{jax.process_index()}_")
    atexit.register(shutil.rmtree, scratch, True)
    copy = os.path.join(scratch, os.path.basename(os.path.abspath(path)))
    os.makedirs(copy)
    if size:
        with tarfile.open(fileobj=io.BytesIO(payload.tobytes()), mode="r") as tar:
            tar.extractall(copy, filter="data")
    return copy


class RunDir:
    def __init__(self, path: str, name: str = "examples"):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.log = JsonlLog(os.path.join(path, f"{name}.jsonl"))

    @property
    def jsonl(self) -> str:
        return self.log.path

    @property
    def done(self) -> set:
        return self.log.done

    def append(self, record: Dict[str, Any]) -> None:
        self.log.append(record)

    def records(self) -> List[Dict[str, Any]]:
        return self.log.records()

    def run(self, items: Iterable[Tuple[Any, Any]], fn: Callable[[Any], Dict[str, Any]],
            progress: Optional[Callable[[int], None]] = None) -> List[Dict[str, Any]]:
        """fn(item) -> record for every (id, item) not yet done; returns all records."""
        for item_id, item in items:
            if item_id in self.log:
                continue
            self.append({"id": item_id, **fn(item)})
            if progress:
                progress(1)
        return self.records()

    def write_summary(self, rows: Sequence[Dict[str, Any]], name: str = "summary") -> None:
        """rows as {name}.csv and a markdown table {name}.md (floats to 3 decimals)."""
        if not rows:
            raise ValueError("no summary rows to write")
        cols = list(dict.fromkeys(k for r in rows for k in r))
        with open(os.path.join(self.path, f"{name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)

        def fmt(v):
            return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
        with open(os.path.join(self.path, f"{name}.md"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def write_config(self) -> str:
        """The gin configuration in force, as config.gin (T5X writes the same file)."""
        import gin
        path = os.path.join(self.path, "config.gin")
        with open(path, "w") as f:
            f.write(gin.config_str())
        return path

    @staticmethod
    def processor() -> str:
        """The CPU's model name (/proc/cpuinfo on Linux): CPU timings depend on it -- the
        demo target's 5-token verify pass cost 2.0-2.2 one-token steps on an AMD EPYC (AVX2)
        here and 1.3 in a run on another machine, which moves a measured speedup more
        than the draft does."""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()

    def write_environment(self) -> Dict[str, Any]:
        """Python, package versions, platform and devices, as environment.json."""
        from importlib import metadata
        import jax
        versions = {}
        for pkg in ("speculative_t5", "jax", "jaxlib", "flax", "numpy", "orbax-checkpoint",
                    "gin-config", "seqio", "tensorflow-datasets", "sentencepiece"):
            try:
                versions[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                versions[pkg] = None
        env = {"python": platform.python_version(), "platform": platform.platform(),
               "versions": versions, "jax": jax.__version__,
               "devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
               "cpu_count": os.cpu_count(), "processor": self.processor()}
        with open(os.path.join(self.path, "environment.json"), "w") as f:
            json.dump(env, f, indent=2)
        return env
