"""The package's layers, checked: every import in earl_service/ runs down the layer list, and no modules
import each other in a circle (imports inside functions count: a lazy import that dodges a circle is one).

    python scripts/layers.py                          # prints each layer with what it imports; exit 1 on a violation
    python scripts/layers.py --draw docs/layers.png   # the same check, and the layers drawn (matplotlib)
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "earl_service"
# Bottom to top: a unit (a top-level module or folder of earl_service) may import only units before it.
LAYERS = ["version", "errors", "atomic", "safe_json", "provenance", "memory", "core", "config", "data", "model", "bundle",
          "imports", "train", "serve", "device", "service", "compress", "worker", "cli"]
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


def draw(path: Path, by_unit: dict[str, set[str]], summary: str) -> None:
    """The units as boxes stacked bottom to top in LAYERS order; an arc per unit-level import, on the right when it
    runs down (coloured by the importing unit), on the left and dashed when it runs up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    units = [u for u in LAYERS if _is_module(f"{PACKAGE}.{u}")]
    y = {u: 1.0 * i for i, u in enumerate(units)}
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(units) + 1.2))
    colours = plt.get_cmap("tab20")
    for i, unit in enumerate(units):
        folder = (ROOT / PACKAGE / unit).is_dir()
        ax.add_patch(FancyBboxPatch((-0.9, y[unit] - 0.32), 1.8, 0.64, boxstyle="round,pad=0.02",
                                    fc="#e8eef7" if folder else "#f4f4f4", ec=colours(i % 20), lw=1.6))
        ax.text(0, y[unit], unit + ("/" if folder else ".py"), ha="center", va="center", fontsize=10,
                family="monospace", weight="bold" if folder else "normal")
    arcs = [(s, t) for s in units for t in sorted(by_unit.get(s, ())) if t in y and t != s]
    outs = {u: sorted((t for s, t in arcs if s == u), key=y.get) for u in units}
    ins = {u: sorted((s for s, t in arcs if t == u), key=y.get) for u in units}
    for source, target in arcs:  # each arc leaves and enters its box at its own height, so arrows do not pile up
        up = y[target] > y[source]
        side = -0.9 if up else 0.9
        start = (side, y[source] - 0.28 + 0.56 * (outs[source].index(target) + 1) / (len(outs[source]) + 1))
        end = (side, y[target] - 0.28 + 0.56 * (ins[target].index(source) + 1) / (len(ins[target]) + 1))
        colour = "black" if up else colours(units.index(source) % 20)
        ax.add_patch(FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={0.3 if up else -0.3}", arrowstyle="-|>",
                                     mutation_scale=7, lw=2.0 if up else 0.9, color=colour, alpha=0.8,
                                     linestyle="--" if up else "-"))
    ax.set_xlim(-1.1 - 0.16 * len(units) * any(y[t] > y[s] for s, t in arcs), 1.1 + 0.16 * len(units))
    ax.set_ylim(-0.7, len(units) - 0.3)
    ax.axis("off")
    ax.set_title("earl_service's layers, bottom to top: a unit imports only units below it\n(an arrow per unit that "
                 f"imports another, coloured by the importer; black dashed: one that runs up)\n{summary}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draw", type=Path, metavar="PATH", help="also draw the layers and their imports as a PNG")
    args = parser.parse_args(argv)
    edges = graph()
    by_unit = unit_edges(edges)
    for unit in reversed(LAYERS):
        print(f"{unit:>10} -> {', '.join(sorted(by_unit.get(unit, ()), key=lambda u: LAYERS.index(u) if u in LAYERS else -1)) or '-'}")
    problems = upward_imports(edges) + [" <-> ".join(c) + " import each other" for c in circles(edges)]
    for line in problems:
        print("VIOLATION", line)
    summary = f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(problems)} violations"
    print(summary)
    if args.draw:
        draw(args.draw, by_unit, summary)
        print(f"drew {args.draw}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
