"""The package's shape: no import cycle among cvs_jax modules, and the layers of packages by role.

Every ``import`` counts, also one inside a function or under ``if TYPE_CHECKING``: a function-level
import that dodges a cycle is still a cycle (the two modules cannot be understood apart).
"""

import ast
import functools
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "cvs_jax")
COMMANDS = {"main", "compare", "search", "export", "update", "summarize", "reproduce", "info", "report"}


def _modules() -> dict[str, tuple[str, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, REPO)[: -len(".py")].split(os.sep)
                is_package = parts[-1] == "__init__"
                out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


@functools.cache
def _parse(path: str) -> ast.Module:
    """A file's syntax tree, parsed once per test process (every check below walks the same files)."""
    with open(path) as f:
        return ast.parse(f.read())


def import_graph() -> dict[str, set[str]]:
    """Module -> the cvs_jax modules it imports (``from pkg import sub``: the submodule); a fresh copy."""
    return {module: set(deps) for module, deps in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, (path, is_package) in modules.items():
        deps = set()
        tree = _parse(path)
        base = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == "cvs_jax"}
            elif isinstance(node, ast.ImportFrom):
                name = node.module or ""
                if node.level:
                    prefix = base
                    for _ in range(node.level - 1):
                        prefix = prefix.rpartition(".")[0]
                    name = prefix + ("." + name if name else "")
                if name.split(".")[0] != "cvs_jax":
                    continue
                for alias in node.names:
                    full = f"{name}.{alias.name}"
                    deps.add(full if full in modules else resolve(name))
        deps.discard(None)
        deps.discard(module)
        graph[module] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep, path)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycle_among_cvs_jax_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_finder_sees_a_function_level_cycle():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_top_level_modules_are_the_commands_and_what_they_share():
    top = {m.split(".")[1] for m, (_, is_package) in _modules().items() if m.count(".") == 1 and not is_package}
    assert top == COMMANDS | {"cli", "errors", "distributed"}, sorted(top)


def test_no_library_module_imports_a_command():
    """The commands (``python -m cvs_jax.<command>``) sit on top: nothing inside the packages imports one."""
    for module, deps in import_graph().items():
        if module.count(".") > 1:  # inside a package
            commands = sorted(d for d in deps if d.count(".") == 1 and d.split(".")[1] in COMMANDS)
            assert not commands, f"{module} imports the command(s) {commands}"


def test_benchmarks_and_the_package_do_not_import_tests():
    for folder in ("benchmarks", "cvs_jax"):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(root, name)) as f:
                        tree = ast.parse(f.read())
                    for node in ast.walk(tree):
                        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                        if isinstance(node, ast.ImportFrom) and not node.level:
                            names = [node.module or ""]
                        assert not any(n.split(".")[0] == "tests" for n in names), os.path.join(root, name)


def test_the_run_directory_layout_is_spelled_out_only_in_rundir_paths():
    """``"checkpoints"``, ``"results.json"`` and friends are named in ``cvs_jax/rundir/paths.py`` alone."""
    names = {"checkpoints", "sessions", "progress", "additions", "results.json", "metrics.jsonl", "protocol.json"}
    names |= {"population.json", ".lock", "config.json"}
    own_layout = {os.path.join("cvs_jax", "export.py"): {"config.json"}}  # the export folder's own files
    for module, (path, _) in _modules().items():
        rel = os.path.relpath(path, REPO)
        if rel == os.path.join("cvs_jax", "rundir", "paths.py"):
            continue
        tree = _parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "join":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in names - own_layout.get(rel, set()):
                        raise AssertionError(f"{rel}:{arg.lineno} spells {arg.value!r}; use cvs_jax.rundir.paths")


# ------------------------------------------------------------------ packages and layers


def package_of(module: str) -> str:
    """``cvs_jax.engine.phases`` -> ``cvs_jax.engine``; a top-level module (``cvs_jax.errors``) is its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        out.setdefault(package_of(module), set()).update(package_of(d) for d in deps)
    return {p: deps - {p} for p, deps in out.items()}


def longest_import_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of the module import DAG, as its modules (top importer first): its length is the
    package's number of import layers (a module that imports no cvs_jax module is layer 1)."""
    depth: dict[str, int] = {}

    def layer(m: str) -> int:
        if m not in depth:
            depth[m] = 1 + max((layer(d) for d in graph[m]), default=0)
        return depth[m]

    chain = [max(sorted(graph), key=layer)]
    while graph[chain[-1]]:
        chain.append(max(sorted(graph[chain[-1]]), key=layer))
    return chain


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


# The import layers of cvs_jax (``longest_import_chain``): 20 before the house was put in order, 16, 12, now 10,
# the target (big_vision has 5, scenic 8).  Readers lay a run's stored config over method-free defaults
# (config.stored below config.base), and the phases read the Protocol dataclass apart from what loads it
# (engine.protocol_builder).  The chains at 10: compare/main/update -> runner -> config.recorded -> config.base ->
# methods.registry -> methods.baselines -> methods.base -> methods.seams -> data.splits -> errors, and compare ->
# runner -> population -> phases -> batches -> protocol -> data.sources -> builders.image_folder ->
# folder_inventory -> errors.
MAX_LAYERS = 10
STORAGE = "cvs_jax.rundir"  # the run directory: locks, checkpoints, logs, the stored gallery
ABOVE_STORAGE = ("cvs_jax.methods", "cvs_jax.models", "cvs_jax.config", "cvs_jax.engine")


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_the_package_graph_sees_a_cycle_through_two_modules():
    graph = {"cvs_jax.models.heads": {"cvs_jax.methods.losses"}, "cvs_jax.methods.losses": set()}
    graph["cvs_jax.methods.base"] = {"cvs_jax.models.networks"}
    graph["cvs_jax.models.networks"] = set()
    assert find_cycle(package_graph(graph)) == ["cvs_jax.methods", "cvs_jax.models", "cvs_jax.methods"]


def test_import_layers(capsys):
    chain = longest_import_chain(import_graph())
    with capsys.disabled():
        print(f"\nimport layers of cvs_jax (longest import chain): {len(chain)}: " + " -> ".join(chain))
    assert len(chain) <= MAX_LAYERS, f"{len(chain)} import layers (at most {MAX_LAYERS}): " + " -> ".join(chain)


def test_the_layer_count_is_the_longest_chain():
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": {"d"}, "d": set(), "e": {"d"}}
    assert longest_import_chain(graph) == ["a", "b", "c", "d"]


def test_the_storage_layer_imports_no_method_model_config_or_engine():
    """``rundir`` stores runs: nothing it imports, directly or through other modules, knows a method, a
    model, the configs or the engine (so reading a run directory never pulls in the training stack)."""
    graph = import_graph()
    for module in sorted(m for m in graph if m.startswith(STORAGE + ".")):
        above = sorted(d for d in reachable(graph, module) if d.startswith(ABOVE_STORAGE))
        assert not above, f"{module} imports {above} (the storage layer sits below them)"


def test_init_files_hold_no_logic():
    """A package's ``__init__.py`` holds a docstring and at most re-exports (imports and ``__all__``)."""
    for module, (path, is_package) in _modules().items():
        if not is_package:
            continue
        tree = _parse(path)
        for node in tree.body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is tree.body[0]:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
                continue
            raise AssertionError(f"{os.path.relpath(path, REPO)}:{node.lineno} holds logic; move it into a module")


def test_the_package_never_imports_the_repository_configs():
    """The configs live in ``cvs_jax.config``; ``configs/*.py`` are the repository's thin files over it."""
    for module, (path, _) in _modules().items():
        tree = _parse(path)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "configs" for n in names), f"{module} imports configs"


# ---------------------------------------------------------------- sizes

MAX_FUNCTION_LINES = 100
# functions still over the limit, each with the issue that splits it (remove the entry when it lands)
LONG_FUNCTIONS_ALLOWED: set[str] = set()  # none: a function over the limit is split, not listed


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of each function (method, nested function) longer than ``limit``
    lines, decorators excluded: a long function is several ideas that cannot be read or tested apart."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef) and child.end_lineno - child.lineno + 1 > limit:
                    found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")

    visit(ast.parse(source), "")
    return found


def test_the_length_check_sees_a_long_method():
    body = "\n".join(f"        x{i} = {i}" for i in range(4))
    assert long_functions(f"class A:\n    def f(self):\n{body}\n", limit=4) == [("A.f", 5)]
    assert long_functions(f"def g():\n{body}\n", limit=5) == []


def test_no_function_in_the_package_is_over_100_lines():
    found = []
    for module, (path, _) in _modules().items():
        with open(path) as f:
            rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
            found += [
                f"{rel}:{n} ({k} lines)"
                for n, k in long_functions(f.read())
                if f"{rel}:{n}" not in LONG_FUNCTIONS_ALLOWED
            ]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them): {found}"


def test_the_session_phases_module_holds_the_phases_only():
    """``engine/phases.py`` holds the session phases; the training loop is ``engine/train_loop.py``."""
    with open(os.path.join(PACKAGE, "engine", "phases.py")) as f:
        assert len(f.read().splitlines()) <= 400


# ---------------------------------------------------------------- private names stay in their package


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reach_ins(module: str, source: str, modules) -> list[str]:
    """Where ``module`` uses another package's underscore names: ``from pkg import _name`` or
    ``from pkg._mod import x``, and ``mod._name`` on a module imported from another package."""
    found, bound = [], {}
    own = package_of(module)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("cvs_jax."):
                    bound[a.asname or a.name] = a.name
                    if package_of(a.name) != own and any(map(_is_private, a.name.split("."))):
                        found.append(f"{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cvs_jax") and not node.level:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in modules:
                    bound[a.asname or a.name] = full
                if package_of(full) != own and any(map(_is_private, full.split("."))):
                    found.append(f"{node.lineno}: from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _is_private(node.attr):
            target = bound.get(node.value.id)
            if target is not None and package_of(target) != own:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_private_check_sees_each_kind_of_reach_in():
    modules = {"cvs_jax.data.splits": None, "cvs_jax.data.builders._common": None}
    src = (
        "from cvs_jax.data import splits\nfrom cvs_jax.data.builders._common import x\n"
        "from cvs_jax.data.splits import _exact\nsplits._exact(1)\nsplits.exact(1)\n"
    )
    assert private_reach_ins("cvs_jax.engine.protocol_builder", src, modules) == [
        "2: from cvs_jax.data.builders._common import x",
        "3: from cvs_jax.data.splits import _exact",
        "4: splits._exact",
    ]
    assert private_reach_ins("cvs_jax.data.sources", src, modules) == []  # inside its own package


def test_no_module_uses_another_packages_private_names():
    modules = _modules()
    found = []
    for module, (path, _) in modules.items():
        with open(path) as f:
            found += [f"{module}:{hit}" for hit in private_reach_ins(module, f.read(), modules)]
    assert not found, "underscore names used across packages (make them public where they live): " + str(found)


def test_the_exact_search_kernel_is_retrievals_and_the_index_imports_it():
    """One exact top-K kernel (``retrieval/topk.py``): ``index/exact.py`` serves it and no index module
    ranks rows on its own, so ``search`` and serve's exact index cannot drift apart."""
    graph = import_graph()
    assert "cvs_jax.retrieval.topk" in graph["cvs_jax.index.exact"]
    for module, (path, _) in _modules().items():
        with open(path) as f:
            source = f.read()
        if module.startswith("cvs_jax.index"):
            assert not any(k in source for k in ("lax.top_k", "argpartition", "argsort(")), module
