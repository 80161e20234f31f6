"""The package's shape: no import cycles, modules of one concern, a shallow import graph.

Imports are read with ``ast`` from every module of ``wids/``, counting imports inside functions
and under ``TYPE_CHECKING`` too: a lazy import is still a dependency, and a cycle means one
concept lives in two places.

Depth is measured where a reader meets it: between the package's parts (a folder such as
``storage/`` counts as one part, a flat module as another), and inside each folder among its
modules. Both must stay within ``MAX_DEPTH``. Chaining the two (a module of ``cli/`` down to a
module of ``storage/``) would count every split of a module into smaller ones as a new level.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "wids"
# Module size is a guideline, not a cap: a class owns its helpers in one module (house style:
# never split one concept over several modules taking ``pool: Any`` to meet a number). Past
# ``SOFT_LINES`` a module usually holds two concerns; one that holds one concept may stay
# bigger if it is named in ``ONE_CONCEPT`` with the reason. ``HARD_LINES`` is the limit for all.
SOFT_LINES = 600
HARD_LINES = 900
MAX_DEPTH = 10

# Left to untangle; each entry must disappear, never be added to.
KNOWN_CYCLES: set[frozenset[str]] = set()
# Modules past SOFT_LINES that hold one concept (module -> why it is one).
ONE_CONCEPT: dict[str, str] = {
    "wids.storage.http1": "one HTTP/1.1 client: the request and answer rules its blocking and"
    " asyncio connections share, their pools, and the transport that hands them wids' reads",
    "wids.cache.shards": "one shard cache: its open/fetch protocol across processes, background"
    " fetches and the budget's shares per reader they follow",
    "wids.dataset.pool": "one typed per-process reader: its open readers, access mode, cache"
    " use (promotion, the warm-up of an iteration's first shards) and the one plan of a batch's"
    " reads, used by direct reads and the lookahead alike",
    "wids.dataset.listdataset": "one public dataset: the reference's constructor, attributes and"
    " methods (each a door to the catalog, the pool or the cache that does the work)",
    "wids.storage.viaobstore": "one transport: obstore's options translated exactly, its stores"
    " per process, its pinned reads and its errors sorted by type into wids'",
}
KNOWN_REEXPORTS: set[str] = set()


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            found.update(subs if subs else [target])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in mods and m != name}


@cache
def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.add(frozenset(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    new = {c for c in cycles if c not in KNOWN_CYCLES}
    assert not new, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN_CYCLES - cycles
    assert not gone, f"remove from KNOWN_CYCLES, they are gone: {gone}"


def test_modules_hold_one_concern() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    huge = {m: n for m, n in sizes.items() if n > HARD_LINES}
    assert not huge, f"modules over {HARD_LINES} lines: split them by concern: {huge}"
    big = {m: n for m, n in sizes.items() if n > SOFT_LINES and m not in ONE_CONCEPT}
    assert not big, (
        f"modules over {SOFT_LINES} lines: {big}; split one that holds two concerns, or name "
        "it in ONE_CONCEPT with the reason it is one"
    )
    gone = {m for m in ONE_CONCEPT if sizes.get(m, 0) <= SOFT_LINES}
    assert not gone, f"remove from ONE_CONCEPT, they are small now: {gone}"


def _part(module: str) -> str:
    """``wids.storage.source`` -> ``wids.storage``; flat modules are parts of their own."""
    return ".".join(module.split(".")[:2])


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    @cache
    def depth(v: str) -> int:
        return 1 + max((depth(w) for w in graph[v]), default=0)

    v = max(graph, key=depth)
    chain = [v]
    while graph[v]:
        v = max(graph[v], key=depth)
        chain.append(v)
    return chain


def test_import_graph_is_shallow() -> None:
    graph = _graph()
    if _cycles(graph):
        return  # depth is only defined without cycles; the cycle test reports them
    parts: dict[str, set[str]] = {}
    for a, targets in graph.items():
        parts.setdefault(_part(a), set()).update(_part(b) for b in targets if _part(b) != _part(a))
    chain = _longest_chain(parts)
    assert len(chain) <= MAX_DEPTH, " -> ".join(chain)
    for folder in {_part(m) for m in graph if m.count(".") >= 2}:
        inside = {
            a: {b for b in targets if b.startswith(folder + ".")}
            for a, targets in graph.items()
            if a.startswith(folder + ".")
        }
        chain = _longest_chain(inside)
        assert len(chain) <= MAX_DEPTH, " -> ".join(chain)


def test_depth_counts_what_it_should() -> None:
    chain = _longest_chain({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}})
    assert chain == ["a", "b", "c"]
    assert _part("wids.storage.source") == "wids.storage" and _part("wids.tar") == "wids.tar"


def test_no_private_module_reexports() -> None:
    """A module's ``__all__`` lists only what it defines (package ``__init__`` files excepted)."""
    bad = {}
    for name, path in _modules().items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        defined: set[str] = set()
        exported: list[str] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        defined.add(t.id)
                        if t.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                            exported = [e.value for e in node.value.elts]  # type: ignore[attr-defined]
        leaked = sorted(set(exported) - defined)
        if leaked:
            bad[name] = leaked
    new = {m: names for m, names in bad.items() if m not in KNOWN_REEXPORTS}
    assert not new, f"modules re-exporting names they do not define: {new}"
    gone = KNOWN_REEXPORTS - set(bad)
    assert not gone, f"remove from KNOWN_REEXPORTS, they are clean now: {gone}"
