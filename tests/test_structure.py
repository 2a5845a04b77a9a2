"""The shape of the compiler package: no import cycles, small modules and functions.

Every `import` and `from ... import` in compiler/cuvil, at the top of a module or
inside a function, relative or absolute, is an edge from its module to the module it
names (`from pkg import name` names `pkg.name` where that is a module, else `pkg`);
imports under `if TYPE_CHECKING:` count too. A set of modules that reach each other along these edges is an import cycle; the test
names each one with a loop of imports, file:line, that closes it.

No module may be over MAX_MODULE_LINES lines and no function (method, nested
function) over MAX_FUNCTION_LINES lines, counted from its `def` line to its last line.

The known offenders are listed by name below with a one-line reason each. An entry
that no longer matches an offender fails the test too: delete it when the offender is
fixed, so the lists only shrink.
"""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "compiler" / "cuvil"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# The modules of each known cycle (paths under compiler/cuvil) -> why it is allowed.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {
}

# "path" (a module) or "path:qualname" (a function, e.g. "a.py:Class.method",
# "a.py:outer.inner") -> why it may be over the limit.
EXCEPTIONS: dict[str, str] = {
}


# -- reading the package ----------------------------------------------------------------------
def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name ('cuvil.ir.core'; a package is its __init__.py) -> file."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of dotted `name` that is a module of the package."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of the package, line) for every import statement in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name, known) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    continue  # above the package: not ours
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [_resolve(f"{source}.{alias.name}", known) if f"{source}.{alias.name}" in known
                       else _resolve(source, known) for alias in node.names]
        else:
            continue
        edges += [(t, node.lineno) for t in targets if t is not None and t != module]
    return edges


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of its first import}."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        graph[name] = {}
        for target, line in sorted(imports(name, path, known), key=lambda e: e[1]):
            graph[name].setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    members.append(m)
                    if m == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return sorted(found)


def loop(graph: dict[str, dict[str, int]], members: list[str]) -> list[str]:
    """A shortest import loop through the first member, within the cycle: [a, b, ..., a]."""
    start, inside = members[0], set(members)
    before = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while before[path[-1]] is not None:
                    path.append(before[path[-1]])
                return path[::-1] + [start]
            if nxt in inside and nxt not in before:
                before[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no loop through {start}")


def sizes(root: Path = PACKAGE) -> dict[str, int]:
    """Lines of every module ("path") and function ("path:qualname") under root."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        found[rel] = len(text.splitlines())

        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        key = f"{rel}:{name}"
                        found[key] = max(found.get(key, 0), child.end_lineno - child.lineno + 1)
                    visit(child, name + ".")
                else:
                    visit(child, prefix)

        visit(ast.parse(text, str(path)), "")
    return found


def cycle_problems(graph: dict[str, dict[str, int]], paths: dict[str, str], known: dict) -> list[str]:
    """Each cycle that `known` does not list, with a loop of imports; each stale entry."""
    found = {tuple(sorted(paths[m] for m in members)): members for members in cycles(graph)}
    problems = []
    for key, members in sorted(found.items()):
        if key not in known:
            steps = loop(graph, members)
            where = " -> ".join(f"{paths[a]}:{graph[a][b]}" for a, b in zip(steps, steps[1:]))
            problems.append(f"import cycle among {', '.join(key)}: {where} -> {paths[steps[0]]}")
    problems += [f"stale KNOWN_CYCLES entry {key}: these modules no longer form one import cycle "
                 "(delete it, or list the smaller cycle that is left)" for key in known if key not in found]
    return problems


def size_problems(found: dict[str, int], exceptions: dict) -> list[str]:
    """Each module or function over its limit that `exceptions` does not list; each stale entry."""
    def limit(key):
        return MAX_FUNCTION_LINES if ":" in key else MAX_MODULE_LINES

    over = {k: n for k, n in found.items() if n > limit(k)}
    problems = [f"{k} is {n} lines, over the limit of {limit(k)}" for k, n in sorted(over.items())
                if k not in exceptions]
    problems += [f"stale EXCEPTIONS entry {k!r}: " + (f"now {found[k]} lines, within the limit" if k in found
                                                     else "no such module or function") + " (delete it)"
                 for k in sorted(exceptions) if k not in over]
    return problems


# -- the package ------------------------------------------------------------------------------
def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100, "the walk found too little: wrong root?"
    paths = {m: p.relative_to(PACKAGE).as_posix() for m, p in modules().items()}
    problems = cycle_problems(graph, paths, KNOWN_CYCLES)
    assert not problems, "\n".join(problems)


def test_module_and_function_sizes():
    found = sizes()
    assert len(found) > 500, "the walk found too little: wrong root?"
    problems = size_problems(found, EXCEPTIONS)
    assert not problems, "\n".join(problems)


def test_every_entry_has_a_reason():
    for key, reason in {**KNOWN_CYCLES, **EXCEPTIONS}.items():
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason, key
    for key in KNOWN_CYCLES:
        assert list(key) == sorted(key) and len(key) > 1, f"{key}: list a cycle's modules sorted"


# -- the checks themselves, on a small package --------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_walk_sees_every_kind_of_import(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "from .api import run\n",
        "api.py": "import os\nimport pkg.sub.b as b\n\ndef run():\n    from .sub import a\n",
        "sub/__init__.py": "",
        "sub/a.py": "from .. import api\n",                # a -> api -> (function level) a
        "sub/b.py": "from ..sub.c import f\n",
        "sub/c.py": "def f():\n    import pkg.sub.b\n",   # b -> c -> (function level) b
        "leaf.py": "from pkg.sub import c\nfrom .sub.c import f, g\nfrom . import sub\nimport numpy, pkg\n",
    })
    graph = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.api": 1},
        "pkg.api": {"pkg.sub.b": 2, "pkg.sub.a": 5},
        "pkg.sub": {},
        "pkg.sub.a": {"pkg.api": 1},
        "pkg.sub.b": {"pkg.sub.c": 1},
        "pkg.sub.c": {"pkg.sub.b": 2},
        "pkg.leaf": {"pkg.sub.c": 1, "pkg.sub": 3, "pkg": 4},
    }
    assert cycles(graph) == [["pkg.api", "pkg.sub.a"], ["pkg.sub.b", "pkg.sub.c"]]
    assert loop(graph, ["pkg.sub.b", "pkg.sub.c"]) == ["pkg.sub.b", "pkg.sub.c", "pkg.sub.b"]
    graph["pkg.sub.c"]["pkg.api"] = 1  # c -> api joins the two into one
    assert cycles(graph) == [["pkg.api", "pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]
    assert loop(graph, cycles(graph)[0]) == ["pkg.api", "pkg.sub.a", "pkg.api"]


def test_sizes_count_modules_methods_and_nested_functions(tmp_path):
    pkg = _package(tmp_path, {"m.py": (
        "class K:\n"
        "    @property\n"
        "    def p(self):\n"
        "        def inner():\n"
        "            return 1\n"
        "        return inner()\n"
        "\n"
        "async def top(x,\n"
        "              y):\n"
        "    return x\n")})
    assert sizes(pkg) == {"m.py": 10, "m.py:K.p": 4, "m.py:K.p.inner": 2, "m.py:top": 3}


def test_unlisted_offenders_and_stale_entries_fail():
    graph = {"p.a": {"p.b": 3}, "p.b": {"p.a": 7}, "p.c": {"p.a": 1}}
    paths = {"p.a": "a.py", "p.b": "b.py", "p.c": "c.py"}
    assert cycle_problems(graph, paths, {("a.py", "b.py"): "r"}) == []
    assert cycle_problems(graph, paths, {}) == ["import cycle among a.py, b.py: a.py:3 -> b.py:7 -> a.py"]
    assert cycle_problems(graph, paths, {("a.py", "b.py"): "r", ("a.py", "c.py"): "r"}) == [
        "stale KNOWN_CYCLES entry ('a.py', 'c.py'): these modules no longer form one import cycle "
        "(delete it, or list the smaller cycle that is left)"]
    found = {"big.py": MAX_MODULE_LINES + 1, "big.py:f": MAX_FUNCTION_LINES, "small.py": 10,
             "small.py:g": MAX_FUNCTION_LINES + 1}
    assert size_problems(found, {"big.py": "r", "small.py:g": "r"}) == []
    assert size_problems(found, {"big.py": "r"}) == [
        f"small.py:g is {MAX_FUNCTION_LINES + 1} lines, over the limit of {MAX_FUNCTION_LINES}"]
    assert size_problems(found, {"big.py": "r", "small.py:g": "r", "big.py:f": "r", "gone.py": "r"}) == [
        f"stale EXCEPTIONS entry 'big.py:f': now {MAX_FUNCTION_LINES} lines, within the limit (delete it)",
        "stale EXCEPTIONS entry 'gone.py': no such module or function (delete it)"]
