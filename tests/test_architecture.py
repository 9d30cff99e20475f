"""The project's import graph, read from the source (every import, at module level or inside a
function): no circles, the library below what uses it, no test code and no private names across
modules."""

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


def test_no_import_circles():
    known = modules()
    graph = {name: {m for m, _ in deps if m in known and m != name} for name, deps in project_edges().items()}
    # A package's __init__ importing its own modules is how packages work; a circle through it is not.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


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
