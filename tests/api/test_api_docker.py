"""Deployment files: docker-compose.yml and the test override validate, Dockerfiles copy only what the repo has,
one FAISS per image. The images themselves are built and run by `make compose-test` (docker/compose_test.sh)."""

import re
import shutil
import subprocess

import pytest
from conftest import REPO

DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))
COMPOSE_FILES = [["docker-compose.yml", "docker-compose.override.yml"],  # what `docker-compose up` reads
                 ["docker-compose.yml", "docker/compose.test.yml"]]


@pytest.mark.parametrize("files", COMPOSE_FILES, ids=lambda files: "+".join(files))
def test_compose_files_validate(files):
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose not installed (apt-get install docker-compose)")
    args = [a for f in files for a in ("-f", str(REPO / f))]
    run = subprocess.run([exe, *args, "config", "-q"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr


def test_compose_builds_only_existing_dockerfiles():
    text = (REPO / "docker-compose.yml").read_text()
    named = re.findall(r"dockerfile:\s*(\S+)", text)
    assert sorted(set(named)) == ["docker/api.Dockerfile", "docker/worker.Dockerfile"]
    assert all((REPO / n).is_file() for n in named)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_copy_existing_paths(dockerfile):
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and not line.startswith("COPY --from="):  # --from: a file of an earlier stage
            *sources, _ = line.split()[1:]
            for source in sources:
                assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which the repo lacks"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_take_a_base_image(dockerfile):
    """Every stage starts from ARG BASE_IMAGE, so the same file builds offline from a local base image."""
    text = dockerfile.read_text()
    assert re.search(r"^ARG BASE_IMAGE=\S+", text, re.M)
    assert re.findall(r"^FROM (\S+)", text, re.M) and all(
        base == "${BASE_IMAGE}" for base in re.findall(r"^FROM (\S+)", text, re.M))


def test_the_user_stack_publishes_the_api_port_and_the_test_stack_does_not():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose not installed (apt-get install docker-compose)")

    def config(*files: str) -> str:
        args = [a for f in files for a in ("-f", str(REPO / f))]
        return subprocess.run([exe, *args, "config"], cwd=REPO, capture_output=True, text=True, timeout=60,
                              check=True).stdout

    assert "published: 8000" in config("docker-compose.yml", "docker-compose.override.yml")
    test = config("docker-compose.yml", "docker/compose.test.yml")
    assert "published" not in test and test.count("network_mode: host") == 3


def _instructions(name: str) -> str:
    lines = (REPO / "docker" / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _device_branch(text: str, device: str) -> str:
    """The worker's install commands for DEVICE=device: from `device)` to its `;;`."""
    match = re.search(rf"^\s*{device}\)(.*?);;", text, re.M | re.S)
    assert match, f"worker.Dockerfile has no {device}) branch"
    return match.group(1)


def test_one_faiss_per_image():
    api, worker = _instructions("api.Dockerfile"), _instructions("worker.Dockerfile")
    assert ".[serve]" in api and "faiss-gpu" not in api  # the serve extra brings faiss-cpu
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in api
    cuda, cpu = _device_branch(worker, "cuda"), _device_branch(worker, "cpu")
    assert "faiss-gpu" in cuda and "faiss-cpu" not in cuda
    assert "faiss-cpu" in cpu and "faiss-gpu" not in cpu
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in cpu
    assert '".[serve]"' not in worker


def test_worker_image_builds_the_kernel_and_keeps_no_compiler():
    """The kernel compiles in the build stage; the runtime stage copies torch's build folder, not g++."""
    worker = _instructions("worker.Dockerfile")
    build, runtime = worker.split("\nFROM ${BASE_IMAGE}\n")
    assert "install-python.sh build" in build and "extension_available()" in build
    assert "install-python.sh runtime" in runtime and "install-python.sh build" not in runtime
    assert "COPY --from=build /opt/earl-kernels /opt/earl-kernels" in runtime
