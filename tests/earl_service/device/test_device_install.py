"""The edge install, as docs/answers.md gives it: a wheel built from this checkout, installed with pip into a fresh
venv, brings numpy and safetensors and no torch, and its `earl predict` answers as the server's predictor does.

Needs a package index for pip (numpy, safetensors, setuptools for the build): skipped, saying so, only when pip
cannot reach one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_arrays

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.serve.predictor import LinkPredictor

SOURCES = ("pyproject.toml", "README.md", "earl_service", "api", "earl_client")  # what the build reads
PIP_TIMEOUT = 600  # a cold pip cache downloads numpy; a warm one takes seconds
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv imports its own earl_service only


def run(*argv: str | Path, timeout: float = PIP_TIMEOUT, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


@pytest.fixture(scope="module")
def edge_venv(tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel of this checkout and what its base install pulls in."""
    root = tmp_path_factory.mktemp("edge_install")
    venv = root / "venv"
    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, f"python -m venv failed: {made.stderr}"
    python = venv / "bin" / "python"
    reach = run(python, "-m", "pip", "index", "versions", "safetensors", timeout=120)
    if reach.returncode != 0:
        pytest.skip(f"pip cannot reach a package index: {(reach.stderr or reach.stdout).strip()[-300:]}")
    source = root / "source"  # a copy: pip builds in the tree it is given, which would leave build/ behind
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    built = run(python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", root / "dist", source)
    assert built.returncode == 0, f"building the wheel failed:\n{built.stdout[-2000:]}\n{built.stderr[-2000:]}"
    wheel = next((root / "dist").glob("earl_service-*.whl"))
    installed = run(python, "-m", "pip", "install", wheel)
    assert installed.returncode == 0, f"pip install {wheel.name} failed:\n{installed.stderr[-2000:]}"
    return venv


def test_the_edge_install_has_no_torch(edge_venv):
    listed = run(edge_venv / "bin" / "python", "-m", "pip", "list", "--format", "json", timeout=120)
    packages = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"earl-service", "numpy", "safetensors"} <= packages
    assert not packages & {"torch", "faiss-cpu", "tqdm", "matplotlib", "ninja", "fastapi"}, packages
    probe = run(edge_venv / "bin" / "python", "-c", "import torch", timeout=60)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr


def test_edge_predictions_equal_the_servers(edge_venv, codex_bundle, tmp_path):
    """The venv's `earl predict` (numpy rebuild, exact scores) against LinkPredictor.from_bundle as the server
    builds it (torch rebuild, FAISS shortlist, exact re-rank), both directions."""
    bundle = load_bundle(codex_bundle)
    server = LinkPredictor.from_bundle(bundle)
    earl = edge_venv / "bin" / "earl"
    for h, r, t in bundle.triples[::4001][:4]:
        head, relation, tail = bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t]
        for flag, anchor, want in (("--head", head, server.predict_tails(head, relation, 10)),
                                   ("--tail", tail, server.predict_heads(tail, relation, 10))):
            # cwd: away from the checkout, so the venv's own earl_service is the one imported
            result = run(earl, "predict", codex_bundle, flag, anchor, "--relation", relation, "--json", timeout=120,
                         cwd=tmp_path)
            assert result.returncode == 0, result.stderr
            got = json.loads(result.stdout)["predictions"]
            assert [p["entity"] for p in got] == [e for e, _ in want]
            assert [p["score"] for p in got] == pytest.approx([s for _, s in want], abs=1e-4)


def test_training_without_torch_names_the_extra(edge_venv, tmp_path):
    result = run(edge_venv / "bin" / "earl", "train", tmp_path, "--out", tmp_path / "r", timeout=120, cwd=tmp_path)
    assert result.returncode == 2
    assert "needs torch" in result.stderr and "pip install 'earl-service[train]'" in result.stderr


def test_edge_answers_an_imported_bundle(edge_venv, tmp_path):
    """A ComplEx model imported from plain arrays (`earl import`, pq-coded) answers in the venv, without torch, as the
    torch-side reader does."""
    write_arrays(tmp_path / "src", entities=600, relations=2, width=16)
    path = tmp_path / "complex.safetensors"
    assert main(["import", str(tmp_path / "src"), "--scorer", "complex", "--precision", "pq", "--out", str(path)]) == 0
    want = LinkPredictor.from_bundle(load_bundle(path)).predict_heads("e3", "r1", 10)
    result = run(edge_venv / "bin" / "earl", "predict", path, "--tail", "e3", "--relation", "r1", "--json",
                 timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)["predictions"]
    assert [(p["entity"], p["score"]) for p in got] == [(e, pytest.approx(s, abs=1e-5)) for e, s in want]
