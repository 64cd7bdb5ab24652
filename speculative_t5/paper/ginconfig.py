"""Gin the T5X way: the package's reusable blocks (`gin/`) on the search path, repeatable
`--gin_file`, `--gin.NAME=VALUE` bindings, `--gin_search_paths`; a bad file or binding is a
message that names it."""
from __future__ import annotations

import os
import re
from typing import List, Optional, Sequence, Tuple

import gin


def gin_root() -> str:
    """The directory holding the reusable gin blocks (`models/t5_1_1/base.gin`, ...)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # speculative_t5/
    for candidate in (os.path.join(package, "gin"), os.path.join(os.path.dirname(package), "gin")):
        if os.path.isdir(os.path.join(candidate, "models")):
            return candidate
    raise FileNotFoundError("speculative_t5's gin/ directory is missing from this installation")


def split_gin_flags(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Separate `--gin.NAME=VALUE` flags (returned as gin bindings) from the rest."""
    bindings, rest = [], []
    for arg in argv:
        if arg.startswith("--gin."):
            name, eq, value = arg[len("--gin."):].partition("=")
            if not eq or not name:
                raise SystemExit(f"error: {arg!r} must look like --gin.NAME=VALUE")
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return bindings, rest


def _resource_exists(path: str) -> bool:
    from gin import resource_reader
    try:
        return os.path.isfile(resource_reader._parse_config_path(path))
    except Exception:  # no such package, or a plain directory of that name (TypeError)
        return False


def _safe_package_includes() -> None:
    """gin also reads an include such as 'runs/paper.gin' as a file inside a Python package
    named 'runs'. Its check logs an error for every miss and raises TypeError when a plain
    directory of that name sits in the working directory; ours answers False instead."""
    from gin import config as gin_config, resource_reader
    gin_config._FILE_READERS[:] = [
        (reader, _resource_exists if exists is resource_reader.system_path_file_exists else exists)
        for reader, exists in gin_config._FILE_READERS]


def parse_gin(files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str]) -> None:
    """Apply gin files and bindings; a bad file or binding exits with a message naming it."""
    from gin import config as gin_config
    _safe_package_includes()
    gin.clear_config()
    for path in [gin_root(), os.getcwd(), *search_paths]:
        if path not in gin_config._LOCATION_PREFIXES:
            gin.add_config_file_search_path(path)
    cycle = include_cycle(files, gin_config._LOCATION_PREFIXES)
    if cycle:
        raise SystemExit(f"error: gin include cycle: {' -> '.join(cycle)}")
    try:
        gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
    except (ValueError, KeyError, IOError, SyntaxError, TypeError) as e:
        raise SystemExit(f"error: bad gin configuration: {type(e).__name__}: {e}") from None


_INCLUDE = re.compile(r"""^\s*include\s+(['"])(.+?)\1\s*(#.*)?$""")


def _resolve(name: str, prefixes: Sequence[str]) -> Optional[str]:
    """The file gin reads for `name` (the first search path holding it), None if none does."""
    for prefix in ([""] if os.path.isabs(name) else prefixes):
        path = os.path.join(prefix, name)
        if os.path.isfile(path):
            return os.path.realpath(path)
    return None


def include_cycle(files: Sequence[str], prefixes: Sequence[str]) -> Optional[List[str]]:
    """The first include cycle among `files` and what they include, as the names written
    (['a.gin', 'b.gin', 'a.gin']), or None; an include that resolves to no file is left to
    gin to report."""
    done = set()

    def visit(name: str, path: str, stack: List[Tuple[str, str]]) -> Optional[List[str]]:
        seen = [p for _, p in stack]
        if path in seen:
            return [n for n, _ in stack[seen.index(path):]] + [name]
        if path in done:
            return None
        stack.append((name, path))
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            match = _INCLUDE.match(line)
            child = match and _resolve(match.group(2), prefixes)
            if child:
                found = visit(match.group(2), child, stack)
                if found:
                    return found
        stack.pop()
        done.add(path)
        return None

    for name in files:
        path = _resolve(name, prefixes)
        found = path and visit(name, path, [])
        if found:
            return found
    return None
