"""One experiment's output directory, resumable: per-example records appended to a JSONL
file as they are produced (flushed and fsynced), so a run that is killed and restarted
with the same command skips what is done, loses nothing and counts nothing twice; plus the
summary as CSV and markdown, the gin config used, and the software/device environment.
The paper drivers write through this."""
from __future__ import annotations

import csv
import json
import os
import platform
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple


class JsonlLog:
    """An append-only JSONL file of records keyed by `key`, safe to resume: each append is
    flushed and fsynced; on opening, a torn last line (a kill mid-write) is dropped so it
    is redone, while a corrupt line elsewhere, a missing key or a duplicate is an error."""

    def __init__(self, path: str, key: str = "id"):
        self.path, self.key = path, key
        self._ids = set()
        self._repair_and_load()

    def _repair_and_load(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            data = f.read()
        lines = [line for line in data.split(b"\n") if line.strip()]
        good = []
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:
                    break
                raise ValueError(f"{self.path}: corrupt record {i + 1} in the middle of the "
                                 "file; refusing to guess what is done") from None
            if not isinstance(rec, dict) or self.key not in rec or rec[self.key] in self._ids:
                raise ValueError(f"{self.path}: record {i + 1} has no {self.key!r} or a "
                                 f"duplicate one; move the file away or choose another")
            self._ids.add(rec[self.key])
            good.append(line)
        repaired = b"".join(line + b"\n" for line in good)
        if repaired != data:
            with open(self.path, "wb") as f:
                f.write(repaired)

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
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._ids.add(record[self.key])

    def records(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]


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
               "cpu_count": os.cpu_count()}
        with open(os.path.join(self.path, "environment.json"), "w") as f:
            json.dump(env, f, indent=2)
        return env
