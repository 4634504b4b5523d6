"""`earl serve` comes from api/serve.py through the 'earl.commands' entry point: the library never imports `api`."""

import ast
import importlib.metadata
import tomllib

import pytest
from conftest import REPO

from earl_service import cli

SERVE = importlib.metadata.EntryPoint(name="serve", value="api.serve:add_command", group=cli.COMMANDS_GROUP)


def test_the_library_never_imports_the_api():
    importers = []
    for path in sorted((REPO / "earl_service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            importers += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "api"]
    assert importers == []


def test_pyproject_declares_serve_as_an_earl_command():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][cli.COMMANDS_GROUP] == {"serve": SERVE.value}


@pytest.fixture
def commands(monkeypatch):
    """Pretend the installed metadata holds these entry points (an editable install only sees new ones after
    `pip install -e .`)."""
    def use(*entries):
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda group: [e for e in entries if e.group == group])
    return use


def test_earl_serve_comes_from_its_entry_point(commands):
    from api.serve import serve

    broken = importlib.metadata.EntryPoint(name="gone", value="no_such_package.cli:add", group=cli.COMMANDS_GROUP)
    commands(SERVE, broken)  # a command whose package is missing is left out, the others stay
    parser = cli.build_parser()
    args = parser.parse_args(["serve", "--home", "/tmp/h", "--port", "9000", "--no-worker"])
    assert (args.func, args.home, args.port, args.no_worker, args.store) == (serve, "/tmp/h", 9000, True, "sqlite")
    assert parser.epilog is None
    with pytest.raises(SystemExit):
        parser.parse_args(["gone"])


def test_without_the_entry_point_the_help_says_how_to_get_serve(commands):
    commands()
    parser = cli.build_parser()
    assert "pip install -e '.[serve]'" in parser.epilog
    args = parser.parse_args(["worker", "--home", "/tmp/h"])  # the library's own commands are all there
    assert args.func is cli.cmd_worker
