"""The device reader's table cache from the command line: --cache-dir, $EARL_CACHE_DIR and --no-cache change
nothing printed, and an answer from the cache imports none of the rebuild's modules."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main


@pytest.fixture(scope="module")
def names(codex_bundle):
    bundle = load_bundle(codex_bundle)
    return [(bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t])
            for h, r, t in bundle.triples[7::997][:4]]


def run(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def test_the_cache_changes_nothing_printed(codex_bundle, names, tmp_path, capsys, monkeypatch):
    """--cache-dir writes its entry there, $EARL_CACHE_DIR is the default, --no-cache writes none; every answer
    and score is printed the same, first call or later."""
    head, relation, tail = names[1]
    monkeypatch.setenv("EARL_CACHE_DIR", str(tmp_path / "env"))
    argv = ["predict", codex_bundle, "--head", head, "--relation", relation, "--json"]
    reference = run(capsys, *argv, "--no-cache")
    assert not (tmp_path / "env").exists()
    assert run(capsys, *argv, "--cache-dir", tmp_path / "given") == reference
    assert run(capsys, *argv, "--cache-dir", tmp_path / "given") == reference  # from the entry
    assert len(list((tmp_path / "given" / "v1").iterdir())) == 1
    assert run(capsys, *argv) == run(capsys, *argv) == reference
    assert len(list((tmp_path / "env" / "v1").iterdir())) == 1
    score = ["score", codex_bundle, head, relation, tail, "--json"]
    assert run(capsys, *score) == run(capsys, *score, "--no-cache")


def test_an_answer_from_the_cache_loads_no_rebuild_modules(codex_bundle, names, tmp_path, capsys):
    """A hit maps the tables in: neither the bundle decoder nor the rebuild is imported (nor torch, faiss, scipy),
    which is what makes a later call cost milliseconds."""
    head, relation, _ = names[2]
    argv = ["predict", str(codex_bundle), "--head", head, "--relation", relation, "--cache-dir", str(tmp_path)]
    heavy = ("torch", "faiss", "scipy", "earl_service.bundle.decode", "earl_service.device.reader",
             "earl_service.config", "earl_service.bundle.precision")
    code = ("import sys\n"
            "from earl_service.cli.main import main\n"
            f"assert main({argv!r}) == 0\n"
            f"print('loaded:', sorted(m for m in {heavy!r} if sys.modules.get(m)))")

    def loaded() -> str:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()[-1]

    assert "'earl_service.bundle.decode'" in loaded()  # the first call rebuilds
    assert loaded() == "loaded: []"
