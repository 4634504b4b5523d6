"""`earl serve` comes from api/serve.py through the 'earl.commands' entry point: the library never imports `api`."""

import ast
import importlib.metadata
import tomllib

import pytest
from conftest import REPO

from earl_service.cli import main as cli

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


@pytest.fixture
def no_token(monkeypatch):
    for name in ("EARL_API_TOKEN", "EARL_ALLOW_OPEN_WRITES", "EARL_PROTECT_READS"):
        monkeypatch.delenv(name, raising=False)


def test_serve_refuses_open_writes_beyond_this_machine(commands, monkeypatch, no_token, tmp_path, capsys):
    """`earl serve --host 0.0.0.0` without a token used to let anyone on the network queue jobs and delete models."""
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self: pytest.fail("uvicorn started"))
    commands(SERVE)
    assert cli.main(["serve", "--host", "0.0.0.0", "--home", str(tmp_path), "--no-worker"]) == 2
    err = capsys.readouterr().err
    assert "set EARL_API_TOKEN, or set EARL_ALLOW_OPEN_WRITES=true" in err


@pytest.mark.parametrize("host,env,allowed", [
    ("0.0.0.0", {}, False), ("::", {}, False), ("192.168.1.5", {}, False), ("api.example.org", {}, False),
    ("127.0.0.1", {}, True), ("127.0.0.2", {}, True), ("::1", {}, True), ("localhost", {}, True),
    ("0.0.0.0", {"EARL_API_TOKEN": "t"}, True), ("0.0.0.0", {"EARL_ALLOW_OPEN_WRITES": "true"}, True)])
def test_which_binds_may_serve_open_writes(monkeypatch, no_token, tmp_path, host, env, allowed):
    from api.serve import check_open_writes
    from api.settings import Settings
    from earl_service.errors import ConfigError

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if allowed:
        check_open_writes(host, Settings(home=tmp_path))
    else:
        with pytest.raises(ConfigError, match="EARL_ALLOW_OPEN_WRITES=true"):
            check_open_writes(host, Settings(home=tmp_path))


def test_compose_serves_the_api_through_earl_serve_with_a_token_or_the_flag():
    """The compose API binds 0.0.0.0; through `earl serve` it refuses to start with an empty token unless the
    operator says EARL_ALLOW_OPEN_WRITES=true."""
    yaml = pytest.importorskip("yaml")
    api = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["api"]
    command = api["command"]
    assert command[:2] == ["earl", "serve"] and command[command.index("--host") + 1] == "0.0.0.0"
    assert api["environment"]["EARL_API_TOKEN"] == "${EARL_API_TOKEN:-}"
    assert api["environment"]["EARL_ALLOW_OPEN_WRITES"] == "${EARL_ALLOW_OPEN_WRITES:-false}"
