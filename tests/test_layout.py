"""The package's shape: no import cycle among cvs_jax modules, and the layers of packages by role.

Every ``import`` counts, also one inside a function or under ``if TYPE_CHECKING``: a function-level
import that dodges a cycle is still a cycle (the two modules cannot be understood apart).
"""

import ast
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


def import_graph() -> dict[str, set[str]]:
    """Module -> the cvs_jax modules it imports (``from pkg import sub``: the submodule)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, (path, is_package) in modules.items():
        deps = set()
        with open(path) as f:
            tree = ast.parse(f.read())
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
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "join":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in names - own_layout.get(rel, set()):
                        raise AssertionError(f"{rel}:{arg.lineno} spells {arg.value!r}; use cvs_jax.rundir.paths")
