"""The package's layers (docs/design.md): a module imports only from its own layer or the
layers below it; the decode loops know step functions, never a model."""
import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "speculative_t5")
# lowest first; one layer may hold several independent packages
LAYERS = [{"model", "decoding", "data", "locks"}, {"layouts"}, {"partitioning"}, {"checkpoints"}, {"calibration"},
          {"engine"}, {"beam_engine"}, {"measure"},
          {"training"}, {"paper"}, {"commands"}]


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


def _modules():
    """Every module of the package by dotted name -> its file."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, f), os.path.dirname(PACKAGE))[:-3]
                name = rel.replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = \
                    os.path.join(root, f)
    return out


def _module_imports(name, path, modules):
    """The package's modules that `name` imports anywhere in its file (in functions too: a
    lazy import still ties the two modules together)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for a in node.names:
                target = f"{base}.{a.name}"
                yield target if target in modules else base
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_no_import_cycle():
    """No module reaches itself through the package's imports (a package's __init__ that
    gathers its submodules is left out: it imports them, they never need it)."""
    modules = _modules()
    graph = {m: {i for i in _module_imports(m, p, modules) if i in modules and i != m}
             for m, p in modules.items()}
    inits = {m for m, p in modules.items() if p.endswith("__init__.py")}
    graph = {m: deps - inits for m, deps in graph.items() if m not in inits}
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_no_module_hidden_by_the_public_api():
    """`speculative_t5.NAME` is one thing: no name the package exports is also a module of
    it (as `speculative_t5.generate`, a module rebound to the function, once was)."""
    import speculative_t5 as st
    names = {n[:-3] if n.endswith(".py") else n for n in os.listdir(PACKAGE)}
    hidden = sorted(n for n in names & set(vars(st))
                    if not isinstance(getattr(st, n), type(os)))
    assert not hidden, hidden
