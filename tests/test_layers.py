"""The package's layers (README, Layout): a module imports only from its own layer or the
layers below it; the decode loops know step functions, never a model."""
import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "speculative_t5")
# lowest first; one layer may hold several independent packages
LAYERS = [{"model", "decoding", "data"}, {"partitioning"}, {"checkpoints"}, {"calibration"},
          {"generate"}, {"measure"},
          {"training"}, {"experiments"}, {"commands"}]


def _layer(part: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if part in names)


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("speculative_t5"):
            parts = node.module.split(".")
            if len(parts) == 1:  # from speculative_t5 import x
                yield from (a.name for a in node.names)
            else:
                yield parts[1]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("speculative_t5."):
                    yield a.name.split(".")[1]


def test_imports_only_go_down():
    bad = []
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, PACKAGE).split(os.sep)
            if rel == ["__init__.py"]:
                continue  # the public API gathers every layer
            own = rel[0][:-3] if rel[0].endswith(".py") else rel[0]
            for part in _imports(path):
                if part != own and _layer(part) >= _layer(own):
                    bad.append(f"{'/'.join(rel)} imports speculative_t5.{part}")
    assert not bad, bad


def test_every_package_has_a_layer():
    names = {n[:-3] if n.endswith(".py") else n for n in os.listdir(PACKAGE)
             if not n.startswith("_") and (n.endswith(".py") or os.path.isfile(os.path.join(PACKAGE, n, "__init__.py")))}
    assert names == set().union(*LAYERS)
