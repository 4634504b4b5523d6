"""Deployment files: docker-compose.yml validates, Dockerfiles copy only what the repo has, one FAISS each."""

import re
import shutil
import subprocess

import pytest
from conftest import REPO

DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))


def test_compose_file_validates():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose not installed (apt-get install docker-compose)")
    run = subprocess.run([exe, "-f", str(REPO / "docker-compose.yml"), "config", "-q"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr


def test_compose_builds_only_existing_dockerfiles():
    text = (REPO / "docker-compose.yml").read_text()
    named = re.findall(r"dockerfile:\s*(\S+)", text)
    assert sorted(named) == ["docker/api.Dockerfile", "docker/worker.Dockerfile"]
    assert all((REPO / n).is_file() for n in named)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_copy_existing_paths(dockerfile):
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which the repo lacks"


def _instructions(name: str) -> str:
    lines = (REPO / "docker" / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def test_one_faiss_per_image():
    api, worker = _instructions("api.Dockerfile"), _instructions("worker.Dockerfile")
    assert ".[serve]" in api and "faiss-gpu" not in api  # the serve extra brings faiss-cpu
    assert "faiss-gpu" in worker and "faiss-cpu" not in worker and '".[serve]"' not in worker
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in api
