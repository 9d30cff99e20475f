"""The project's import graph, read from the source (every import, at module level or inside a
function): no circles between modules nor between packages, the library below what uses it (no
package of pipeline/ imports stages/, tools/ or tests/), and no private names across modules."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages", "tools", "bench")
# Who may import whom: the library at the bottom, the stage scripts and tools on it, the
# benchmarks on all of them. Tests may import anything; nothing imports tests.
MAY_IMPORT = {
    "pipeline": {"pipeline"},
    "stages": {"pipeline", "stages"},
    "tools": {"pipeline", "tools"},
    "bench": {"pipeline", "tools", "bench"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for each import statement of the file, relative
    ones resolved; `from a import b` where a.b is a module counts as importing a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub, []) if sub in known else (base, [a.name]))
    return out


def project_edges() -> dict[str, list[tuple[str, list[str]]]]:
    known = modules()
    edges = {}
    for name, path in known.items():
        edges[name] = [
            (m, names) for m, names in imports(name, path, known) if m.split(".")[0] in PACKAGES + ("tests",)
        ]
    return edges


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's), each sorted: every
    node of one reaches every other, so each is at least one circle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    known = modules()
    graph = {name: {m for m, _ in deps if m in known and m != name} for name, deps in project_edges().items()}
    # A package's __init__ importing its own modules is how packages work; a circle through it is not.
    assert not circles(graph), f"import circles: {circles(graph)}"


def package_of(module: str) -> str:
    """pipeline.<package> for a module of the library (pipeline.x for a module file x.py directly
    in pipeline/), else the top-level name (stages, tools, bench, tests)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" else parts[0]


def package_edges(edges: dict[str, list[tuple[str, list[str]]]]) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> the module imports that make the edge."""
    out: dict[tuple[str, str], list[str]] = {}
    for name, deps in edges.items():
        for m, _ in deps:
            a, b = package_of(name), package_of(m)
            if a != b and "pipeline" not in (a, b):  # the bare `pipeline` package holds nothing
                out.setdefault((a, b), []).append(f"{name} imports {m}")
    return out


def package_loops(edges: dict[str, list[tuple[str, list[str]]]]) -> list[str]:
    """Each loop between packages, as a circle of packages with the imports that close it."""
    by_edge = package_edges(edges)
    graph: dict[str, set[str]] = {}
    for a, b in by_edge:
        graph.setdefault(a, set()).add(b)
    loops = []
    for component in circles(graph):
        # The shortest way back from the component's first package to itself (breadth first).
        start, came_from, todo = component[0], {}, [component[0]]
        while start not in came_from:
            v = todo.pop(0)
            for w in sorted(graph[v] & set(component)):
                if w not in came_from:
                    came_from[w] = v
                    todo.append(w)
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came_from[path[-1]])
        path.reverse()
        steps = [f"{a} -> {b} ({by_edge[(a, b)][0]})" for a, b in zip(path, path[1:])]
        loops.append(f"{' -> '.join(path)} (all of {component} reach each other): " + "; ".join(steps))
    return loops


def test_no_loop_between_packages():
    """A package of pipeline/ (and stages, tools, bench) may use another, or be used by it, not
    both, even through others: each can then be read, tested and changed with only what is
    below it (docs/architecture.md, "Packages and what each is for")."""
    loops = package_loops(project_edges())
    assert not loops, "loops between packages:\n" + "\n".join(loops)


def test_the_package_check_names_a_loop():
    edges = {
        "pipeline.a.x": [("pipeline.b.y", ["f"]), ("pipeline.core.z", [])],
        "pipeline.b.y": [("pipeline.c", [])],
        "pipeline.c": [("pipeline.a.w", ["g"])],
        "pipeline.core.z": [("pipeline", [])],
    }
    (loop,) = package_loops(edges)
    assert loop.startswith("pipeline.a -> pipeline.b -> pipeline.c -> pipeline.a ")
    assert "pipeline.c -> pipeline.a (pipeline.c imports pipeline.a.w)" in loop
    assert package_loops({"pipeline.a.x": [("pipeline.b.y", [])], "pipeline.b.y": [("pipeline.core", [])]}) == []


def test_each_layer_imports_only_what_is_below_it_and_no_test_code():
    wrong = []
    for name, deps in project_edges().items():
        allowed = MAY_IMPORT[name.split(".")[0]]
        wrong += [f"{name} imports {m}" for m, _ in deps if m.split(".")[0] not in allowed]
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    wrong = []
    for name, deps in project_edges().items():
        for m, names in deps:
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and m != name:
                wrong.append(f"{name} imports {', '.join(private)} from {m}")
    assert not wrong, "\n".join(wrong)


MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add", "discard"}


def module_state_changes(path: Path) -> list[str]:
    """Where a function of this module changes module-level state: a `global` statement, or a
    module-level list, dict or set changed in place (a method that mutates it, an item assigned or
    deleted). Constant tables that nothing changes are fine."""
    tree = ast.parse(path.read_text())
    containers = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            literal = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
            made = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            mutable = isinstance(value, literal) or (made and value.func.id in {"list", "dict", "set"})
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            containers |= {t.id for t in targets if mutable and isinstance(t, ast.Name)}
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        local = {a.arg for a in func.args.args + func.args.kwonlyargs}
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                found.append(f"{path}:{node.lineno}: global {', '.join(node.names)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id in containers - local and node.func.attr in MUTATORS:
                    found.append(f"{path}:{node.lineno}: {owner.id}.{node.func.attr}(...)")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    name = t.value.id if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) else None
                    if name in containers - local:
                        found.append(f"{path}:{node.lineno}: {name}[...] changed")
    return found


def test_the_library_keeps_no_module_level_state_that_changes():
    """State belongs to an object its owner holds (a stage's TrackingSession, a Trainer), not to a
    module: tests run several stages in one process, and nothing should need resetting."""
    found = [c for path in sorted((ROOT / "pipeline").rglob("*.py")) for c in module_state_changes(path)]
    assert found == []


def test_the_state_check_sees_a_global_and_a_changed_table(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "SEEN = []\nCOUNT = 0\n\ndef f(x):\n    global COUNT\n    SEEN.append(x)\n\n"
        "def g(k):\n    CACHE = {}\n    CACHE[k] = 1\n"
    )
    assert [c.split(": ", 1)[1] for c in module_state_changes(bad)] == ["global COUNT", "SEEN.append(...)"]
