"""The package's layers, checked: every import in earl_service/ runs down the layer list, and no modules
import each other in a circle (imports inside functions count: a lazy import that dodges a circle is one).

    python scripts/layers.py            # prints each layer with what it imports; exit 1 on a violation
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "earl_service"
# Bottom to top: a unit (a top-level module or folder of earl_service) may import only units before it.
LAYERS = ["version", "errors", "atomic", "safe_json", "provenance", "core", "config", "data", "model", "bundle",
          "train", "serve", "device", "service", "compress", "worker", "cli"]
FACE = ""  # earl_service/__init__.py: the package's face, above every layer (lazy re-exports only)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> set[str]:
    """The earl_service modules (or packages) `path` imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in (PACKAGE, "api"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] not in (PACKAGE, "api"):
                continue
            for alias in node.names:  # `from pkg import module` imports the module, not just the package
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
    found.discard(name)
    return found


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACE


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p, module_name(p)) for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    rank = {unit: i for i, unit in enumerate(LAYERS)} | {FACE: len(LAYERS)}
    bad = []
    for source, targets in edges.items():
        for target in sorted(targets):
            if target.split(".")[0] == "api":
                bad.append(f"{source} -> {target} (the library never imports api)")
                continue
            su, tu = unit_of(source), unit_of(target)
            if su not in rank or tu not in rank:
                bad.append(f"{source} -> {target}: unit {su if su not in rank else tu!r} is in no layer")
            elif su != tu and rank[tu] >= rank[su]:
                bad.append(f"{source} -> {target} runs up ({su} is below {tu})")
    return bad


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring a package -> its own children."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w.startswith(v + "."):  # a package's __init__ re-exporting its own module is no circle
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def unit_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            if unit_of(source) != unit_of(target) and target.startswith(PACKAGE):
                out[unit_of(source)].add(unit_of(target))
    return out


def main() -> int:
    edges = graph()
    by_unit = unit_edges(edges)
    for unit in reversed(LAYERS):
        print(f"{unit:>10} -> {', '.join(sorted(by_unit.get(unit, ()), key=lambda u: LAYERS.index(u) if u in LAYERS else -1)) or '-'}")
    problems = upward_imports(edges) + [" <-> ".join(c) + " import each other" for c in circles(edges)]
    for line in problems:
        print("VIOLATION", line)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
