"""The package's layers (scripts/layers.py): imports run down the layer list, no module circles, no `api`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def layers():
    spec = importlib.util.spec_from_file_location("layers", REPO / "scripts" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["layers"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("layers", None)


def test_every_import_runs_down_the_layers(layers):
    assert layers.upward_imports(layers.graph()) == []


def test_no_modules_import_each_other_in_a_circle(layers):
    assert layers.circles(layers.graph()) == []


def test_every_folder_and_top_level_module_is_in_a_layer(layers):
    units = {layers.unit_of(name) for name in layers.graph()} - {layers.FACE}
    assert units <= set(layers.LAYERS), units - set(layers.LAYERS)


def test_the_check_sees_an_upward_import_and_a_lazy_circle(layers):
    """The checker itself: a lower layer importing a higher one, even inside a function, is flagged; so is a
    circle of two modules that import each other."""
    edges = {"earl_service.data.x": {"earl_service.train.y"}, "earl_service.train.y": {"earl_service.data.x"}}
    assert layers.upward_imports(edges) == ["earl_service.data.x -> earl_service.train.y runs up (data is below train)"]
    assert layers.circles(edges) == [["earl_service.data.x", "earl_service.train.y"]]
    assert layers.upward_imports({"earl_service.cli.main": {"api.main"}}) == [
        "earl_service.cli.main -> api.main (the library never imports api)"]


def test_a_lazy_import_inside_a_function_counts(layers, tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from earl_service.cli import main\n    return main\n")
    assert layers.imports_of(source, "earl_service.data.m") == {"earl_service.cli.main"}


def _sizes(folders: tuple[str, ...]) -> tuple[list[str], list[str]]:
    import ast

    long_modules, long_functions = [], []
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if text.count("\n") > 400:
                long_modules.append(f"{path.relative_to(REPO)}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                    length = node.end_lineno - node.lineno + 1
                    if length > 60:
                        long_functions.append(f"{path.relative_to(REPO)}:{node.name}: {length} lines")
    return long_modules, long_functions


def test_no_module_over_400_lines_and_no_function_over_60():
    """Issue 51's sizes, kept: a module that grows past them is split by concept, a function into named steps."""
    long_modules, long_functions = _sizes(("earl_service", "api", "earl_client", "scripts", "bench"))
    assert long_modules == []
    assert long_functions == []
