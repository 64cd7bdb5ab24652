"""The demo corpus, built from a source every Python installation has: its standard library.

Each example is one documented function, its target the docstring's first sentence. Its
input, by `task`: "summarize" (the shipped pair's) "summarize: " + the function's source with
its docstring removed (normalised by `ast.unparse`); "summary_line" the same with the rest
of the docstring left in (the function as written, its summary line missing; a one-sentence
docstring leaves none); "summarize_named" the first with the function's name spelled out
as words on a line before it ("type repr" for `_type_repr`: the words a summary most often
repeats, which a small model copies more easily as words than from inside an identifier).
Examples are split into train / validation / test by a hash of the module name, so no
module contributes to two splits. Nothing here is downloaded or committed.

The held-out splits are the standard library's alone (every installation has them, so the
demo's test inputs are the same wherever Python of one version runs). Training may add the
documented functions of the installed packages (`package_examples`: jax, tensorflow, ...
as `pip install` left them; 13x the standard library's examples), all of them "train",
with every function that also occurs in the standard library dropped so none of the
held-out functions leaks in through a vendored copy."""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import signal
import sysconfig
from multiprocessing import Pool
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

PREFIX = "summarize: "
SPLITS = ("train", "validation", "test")
TASKS = ("summarize", "summary_line", "summarize_named")
_SKIP_DIRS = {"test", "tests", "site-packages", "idle_test", "lib2to3", "__pycache__",
              "ensurepip", "turtledemo"}


def split_of(module: str, validation: float = 0.05, test: float = 0.05) -> str:
    """Deterministic split from the module name alone (md5, not Python's salted hash)."""
    h = int(hashlib.md5(module.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test else "validation" if h < test + validation else "train"


def first_sentence(doc: str, max_words: int = 24) -> Optional[str]:
    """The docstring's first sentence (first paragraph up to '. '), or None if unusable."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    sentence = (m.group(1) if m else para).strip()
    words = sentence.split()
    if len(words) < 3 or len(words) > max_words or not sentence[0].isalpha():
        return None
    if any(bad in sentence for bad in (">>>", "::", "XXX", "TODO")):
        return None
    return sentence


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _documented(tree: ast.AST) -> List[ast.AST]:
    """The module and its classes and functions (the nodes that hold docstrings), walk order."""
    return [node for node in ast.walk(tree) if isinstance(node, _DOCUMENTED)]


def _functions(nodes: Iterable[ast.AST]) -> List[ast.AST]:
    return [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def examples_from_source(source: str, module: str, max_source_chars: int = 1500,
                         task: str = "summarize") -> List[Dict]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return examples_from_functions(_functions(ast.walk(tree)), module, max_source_chars, task)


def name_words(name: str) -> List[str]:
    """An identifier as lower-case words, split at underscores and case changes:
    "_type_repr" -> ['type', 'repr'], "getHTTPResponse2" -> ['get', 'http', 'response']."""
    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", name)]


def after_sentence(doc: str, sentence: str) -> str:
    """The docstring after its first sentence (as `first_sentence` found it, whitespace
    normalised there), with its own line breaks."""
    m = re.search(r"\s+".join(map(re.escape, sentence.split())), doc)
    return doc[m.end():].strip() if m else ""


def examples_from_functions(functions: Iterable[ast.AST], module: str,
                            max_source_chars: int = 1500, task: str = "summarize") -> List[Dict]:
    check_task(task)
    out = []
    for node in functions:
        doc = ast.get_docstring(node, clean=True)
        target = first_sentence(doc) if doc else None
        if target is None:
            continue
        rest = after_sentence(doc, target) if task == "summary_line" else ""
        body = ([ast.Expr(ast.Constant(rest))] if rest else []) + (node.body[1:] or [ast.Pass()])
        stripped = type(node)(**{**{f: getattr(node, f) for f in node._fields}, "body": body})
        try:
            code = ast.unparse(ast.fix_missing_locations(stripped))
        except (ValueError, RecursionError):
            continue
        if len(code) > max_source_chars:
            continue
        named = " ".join(name_words(node.name)) if task == "summarize_named" else ""
        if named:
            code = named + "\n" + code
        out.append({"module": module, "name": node.name, "input": PREFIX + code,
                    "target": target, "split": split_of(module)})
    return out


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return task


def source_of(text: str) -> str:
    """The function's source in an example's input: without the prefix and, for
    "summarize_named", the line of name words before it (never a line of source: those hold
    more than lower-case letters and spaces)."""
    text = text[len(PREFIX):] if text.startswith(PREFIX) else text
    first, _, rest = text.partition("\n")
    return rest if rest and re.fullmatch(r"[a-z ]+", first) else text


_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list:
    """Lower-cased runs of letters: "get_user() Returns" -> ['get', 'user', 'returns']."""
    return _WORD.findall(text.lower())


def stdlib_modules(stdlib: Optional[str] = None, skip=_SKIP_DIRS) -> Iterator[tuple]:
    """(module name, path) for every .py file of the standard library, in sorted order,
    outside the directories named in `skip`."""
    root = stdlib or sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path


def build_corpus(stdlib: Optional[str] = None, task: str = "summarize") -> List[Dict]:
    """All examples of `task`, deterministic order (module path, then position in the
    file). Built once per process and task (parsing the standard library takes seconds);
    a fresh list each call."""
    return [dict(e) for e in _scan_stdlib(stdlib, check_task(task))[0]]


def docstring_words(stdlib: Optional[str] = None) -> FrozenSet[str]:
    """Every word of every module, class and function docstring of the standard library
    (the modules the corpus reads: tests and site-packages left out); from the same one
    parse of the standard library as `build_corpus`."""
    return _scan_stdlib(stdlib, "summarize")[1]


@functools.lru_cache(maxsize=4)
def _scan_stdlib(stdlib: Optional[str], task: str) -> Tuple[Tuple[Dict, ...], FrozenSet[str]]:
    """One parse of every standard-library module -> (the corpus, its docstrings' words)."""
    examples, seen, vocab = [], set(), set()
    for module, path in stdlib_modules(stdlib):
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
            continue
        nodes = _documented(tree)
        for node in nodes:
            doc = ast.get_docstring(node, clean=False)
            vocab.update(words(doc) if doc else ())
        for ex in examples_from_functions(_functions(nodes), module, task=task):
            if ex["input"] not in seen:  # a function copied into two modules would leak
                seen.add(ex["input"])    # across splits: keep its first occurrence only
                examples.append(ex)
    return tuple(examples), frozenset(vocab)


_PACKAGE_SKIP_DIRS = {"test", "tests", "testing", "_vendor", "vendor", "__pycache__"}


def _read_examples(item: Tuple[str, str, str]) -> List[Dict]:
    module, path, task = item
    try:
        with open(path, encoding="utf-8") as f:
            return examples_from_source(f.read(), module, task=task)
    except (UnicodeDecodeError, OSError):
        return []


def _quiet_worker() -> None:
    """A pool worker leaves Ctrl-C and SIGTERM to its parent, which ends the pool: forked,
    it would otherwise inherit the command's handlers (`commands.interrupt`) and unwind the
    parent's stack copy, printing a second "interrupted" or outliving a parent that exited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def package_examples(exclude: Iterable[Dict], roots: Optional[List[str]] = None,
                     processes: int = 2, task: str = "summarize") -> List[Dict]:
    """Training examples from the documented functions of the installed packages (the
    site-packages directories, or `roots`), module names prefixed 'pkg:', split 'train'.
    Dropped: any function whose input, or whose (name, docstring sentence), occurs in
    `exclude` (the standard-library corpus), and repeats within the packages."""
    roots = roots or sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    items = [(f"pkg:{m}", p, check_task(task))
             for r in roots for m, p in stdlib_modules(r, _PACKAGE_SKIP_DIRS)]
    with Pool(processes, initializer=_quiet_worker) as pool:  # parsing ~20k files: a minute on two cores
        per_file = pool.map(_read_examples, items, chunksize=64)
    seen = {e["input"] for e in exclude} | {(e["name"], e["target"]) for e in exclude}
    out = []
    for ex in (e for file_examples in per_file for e in file_examples):
        if ex["input"] in seen or (ex["name"], ex["target"]) in seen:
            continue
        seen.update((ex["input"], (ex["name"], ex["target"])))
        out.append({**ex, "split": "train"})
    return out


def write_corpus(out_dir: str, stdlib: Optional[str] = None, packages: bool = False,
                 target_weight: int = 1, task: str = "summarize") -> Dict[str, int]:
    """Write {split}.jsonl, a text file for vocabulary training and manifest.json (how it
    was built: split sizes, the options, which packages' functions are in train).
    target_weight: each target sentence is written this many times into the vocabulary's
    text. Code outweighs English there: at 3072 pieces one copy leaves common words split
    ("Raise" -> R a is e), four keep 59% of held-out target words whole (47% at one)."""
    os.makedirs(out_dir, exist_ok=True)
    corpus = build_corpus(stdlib, task)
    extra = package_examples(corpus, task=task) if packages else []
    counts = {}
    for split in SPLITS:
        rows = [ex for ex in corpus if ex["split"] == split] + (extra if split == "train" else [])
        counts[split] = len(rows)
        with open(os.path.join(out_dir, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(ex) + "\n" for ex in rows)
    with open(os.path.join(out_dir, "vocab_text.txt"), "w") as f:
        for ex in corpus + extra:
            if ex["split"] == "train":
                f.write(ex["input"].replace("\n", " ") + "\n"
                        + (ex["target"] + "\n") * target_weight)
    top = {}
    for ex in extra:
        name = ex["module"][4:].split(".")[0]
        top[name] = top.get(name, 0) + 1
    from importlib.metadata import packages_distributions, version
    dists = packages_distributions()
    versions = {d: version(d) for name in top for d in dists.get(name, ())}
    manifest = {"counts": counts, "packages": packages, "target_weight": target_weight,
                "task": task,
                "package_examples": top, "package_versions": versions}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return counts
