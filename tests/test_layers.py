"""The import graph of eva_export: no circles, and no import from a lower layer up.

Layers, lowest first (a module may import its own package and anything in a lower layer):
the base toolkit (errors, paths, files, JSON bounds, the manifest, the unit executor, jobs),
then the dataset and store records, the formats and sources, config (which reads the
format registry), the quality rules, capture and export, upload and the console, and on top
the CLI and the ROS nodes. Function-level (lazy) imports count too: they are still edges."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "eva_export"
BASE = {"", "errors", "faults", "jsonbound", "confine", "fsutil", "manifest", "pool", "pool_meter", "pool_worker", "jobstore", "jobs"}
LAYERS = [BASE, {"formats", "sftp_settings"}, {"config"}, {"quality"},
          {"capture", "export"}, {"upload", "console"}, {"cli", "nodes"}]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
                # ``from . import x`` of a submodule is an edge to x, not to the package
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [mod, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer(g: str) -> int:
    return next(i for i, members in enumerate(LAYERS) if g in members)


def test_every_package_has_a_layer():
    groups = {group(m) for m in import_graph()}
    assert groups <= set().union(*LAYERS), groups - set().union(*LAYERS)


def test_no_import_from_a_lower_layer_up():
    bad = []
    for a, targets in import_graph().items():
        for b in targets:
            ga, gb = group(a), group(b)
            same = ga == gb or (ga in BASE and gb in BASE)
            if not same and layer(gb) >= layer(ga):
                bad.append(f"{a} -> {b}")
    assert bad == [], bad


def test_no_circles_between_modules():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == [], circles


#: Inside formats/: the shared pieces lowest, then the native layout every exporter reads its
#: staged subsets from, then the other formats; the registries (formats/*.py) sit on top.
FORMAT_LAYERS = [{"common"}, {"lerobot_v21"},
                 {"lerobot_v20", "lerobot_v3", "hdf5", "mcap_eva", "mcap_viewer", "eva_store", "rosbag2"}]


def format_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "formats" else None


def test_format_packages_import_only_what_lies_below() -> None:
    """A format package imports common/ and the native layout, never another format's package."""
    rank = {p: i for i, members in enumerate(FORMAT_LAYERS) for p in members}
    packages = {format_package(m) for m in import_graph()} - {None}
    assert packages <= set(rank), packages - set(rank)
    bad = []
    for a, targets in import_graph().items():
        pa = format_package(a)
        for b in targets:
            pb = format_package(b)
            if pa is None or pa == pb:
                continue
            if pb is None and b.startswith("eva_export.formats"):
                bad.append(f"{a} -> {b} (a registry, above every format)")
            elif pb is not None and rank[pb] >= rank[pa]:
                bad.append(f"{a} -> {b}")
    assert bad == [], bad
