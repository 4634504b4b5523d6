"""Shared fixtures: small random multigraphs and the path to the shared datasets."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("EARL_DATASETS", REPO.parent / "shared" / "datasets"))
BUNDLED_KG = REPO / "earl_service" / "demo_data" / "codex-s"

# Two cores: one torch thread each for the suite's two processes (make test: pytest -n 2), two for one process.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

# `earl predict` and `earl score` keep rebuilt tables in a cache ($EARL_CACHE_DIR, else ~/.cache/earl): the tests use
# one of their own, removed at the end, so that they neither answer from a developer's entries nor leave any behind.
TEST_CACHE = Path(tempfile.mkdtemp(prefix="earl-test-cache-"))
os.environ["EARL_CACHE_DIR"] = str(TEST_CACHE)


def pytest_unconfigure(config):
    shutil.rmtree(TEST_CACHE, ignore_errors=True)


def pytest_sessionstart(session):
    """Build (or load) the C++ CPU kernels once, before any test. On a new machine the build takes ~45 s or
    more; left to the first worker or API process a test starts, it would count against that test's deadlines."""
    from earl_service.model import kernels as kernels

    kernels.extension_available()


def codex_s_path() -> Path:
    """CoDEx-S: the shared copy when present, else the copy bundled with the package for the demo."""
    for path in (DATASETS / "codex-s", BUNDLED_KG):
        if (path / "train.txt").exists():
            return path
    pytest.skip("CoDEx-S not found")


def random_triples(num_entities: int, num_relations: int, num_edges: int, seed: int = 0) -> np.ndarray:
    """A random multigraph with self-loops and repeated (h, t) pairs, leaving the last entity isolated."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, num_entities - 1, num_edges)
    t = rng.integers(0, num_entities - 1, num_edges)
    r = rng.integers(0, num_relations, num_edges)
    triples = np.stack([h, r, t], 1)
    triples[0] = [2, 0, 2]  # a self-loop
    triples[1] = triples[2] = [3, 1, 4]  # a repeated edge
    triples[3] = [3, 0, 4]  # a second relation between the same pair
    return triples.astype(np.int64)


def star_triples(leaves: int = 60) -> np.ndarray:
    """80 entities, 3 relations: a hub with `leaves` alike leaves on relation 0, plus a random core among 0-19
    (repeated input rows, for graph.CompactInputs)."""
    core = random_triples(20, 3, 80, seed=5)
    star = np.array([[0, 0, leaf] for leaf in range(20, 20 + leaves)])
    return np.concatenate([core, star])


def tiny_dataset():
    """40 entities, 3 relations: 250 train, 20 valid and the rest test triples of a random multigraph."""
    from earl_service.data.dataset import Dataset
    from earl_service.data.vocab import Vocab

    triples = random_triples(40, 3, 300, seed=3)
    triples = np.unique(triples, axis=0)
    rng = np.random.default_rng(0)
    rng.shuffle(triples)
    return Dataset(
        entities=Vocab([f"e{i}" for i in range(40)]),
        relations=Vocab([f"r{i}" for i in range(3)], kind="relation"),
        num_train_entities=40,
        train=triples[:250],
        valid=triples[250:270],
        test=triples[270:],
    )


@pytest.fixture
def small_graph_triples() -> np.ndarray:
    return random_triples(30, 4, 120)


def write_arrays(folder: Path, *, entities: int = 300, relations: int = 4, width: int = 16,
                 relation_width: int | None = None, phases: bool = False,
                 seed: int = 0, reciprocal: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A folder `earl import --format arrays` reads: random tables (relation rows uniform phases when `phases`),
    names e0.. and r0.., one a line; `reciprocal`: twice the relation rows, named r0.., r0_reciprocal.., and a
    meta.json that says so (what `earl export` writes). Returns the tables as written."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    entity_rows = rng.normal(size=(entities, width)).astype(np.float32)
    columns = relation_width or (width // 2 if phases else width)
    rows = 2 * relations if reciprocal else relations
    relation_rows = (rng.uniform(-np.pi, np.pi, (rows, columns)) if phases
                     else rng.normal(size=(rows, columns))).astype(np.float32)
    np.save(folder / "entity_embeddings.npy", entity_rows)
    np.save(folder / "relation_embeddings.npy", relation_rows)
    (folder / "entities.tsv").write_text("".join(f"e{i}\n" for i in range(entities)))
    names = [f"r{i}" for i in range(relations)]
    (folder / "relations.tsv").write_text("".join(f"{n}\n" for n in names + [n + "_reciprocal" for n in names
                                                                             if reciprocal]))
    if reciprocal:
        (folder / "meta.json").write_text('{"reciprocal": true}')
    return entity_rows, relation_rows


# ---------------------------------------------------------------- service fixtures (predict, worker, API)

# One torch thread: with the 2 cores shared (other tests, other processes), 2 OpenMP threads spin-wait and made
# this run 6-13x slower (16-33 s instead of 2.6 s).
TINY_TRAIN = {"steps": 30, "batch_size": 256, "negatives": 16, "eval_every": 0, "progress": False, "threads": 1}


@pytest.fixture(scope="session")
def codex_bundle(tmp_path_factory) -> Path:
    """A CoDEx-S EARL bundle after 30 steps at dim 16 (a few seconds): real vocabularies, graph and embeddings."""
    from earl_service.bundle.model_io import export_bundle
    from earl_service.config import ModelConfig, TrainConfig
    from earl_service.data.dataset import load_dataset
    from earl_service.train.loop import train

    root = tmp_path_factory.mktemp("codex_bundle")
    train(load_dataset(codex_s_path()), ModelConfig(dim=16), TrainConfig(**TINY_TRAIN), root / "run", final_eval=False)
    return export_bundle(root / "run", root / "codex-s.safetensors")


@pytest.fixture(scope="module")
def reference(codex_bundle):
    """An exact (brute-force) LinkPredictor over codex_bundle: what every other answer path must equal."""
    from earl_service.bundle.model_io import load_bundle
    from earl_service.serve.predictor import LinkPredictor

    return LinkPredictor.from_bundle(load_bundle(codex_bundle), index="exact")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def api_and_worker(home: Path, env: dict[str, str]) -> Iterator[str]:
    """A real uvicorn API and one worker on 127.0.0.1 sharing `home` (env: their EARL_* settings); yields the base
    URL once /readyz answers, stops both (SIGTERM, then kill) and prints the end of their log."""
    from earl_client import Client

    port, log = free_port(), (home / "service.log").open("w")
    env = {**os.environ, "EARL_HOME": str(home), **env}
    procs = [subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port",
                               str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT),
             subprocess.Popen([sys.executable, "-m", "earl_service.cli.main", "worker", "--poll", "0.2", "--threads", "1"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)]
    base = f"http://127.0.0.1:{port}"
    try:
        with Client(base) as client:
            client.wait_ready(60, alive=lambda: all(p.poll() is None for p in procs))
        yield base
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        print((home / "service.log").read_text()[-3000:])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A throwaway redis-server on a free 127.0.0.1 port (skips when redis-server is not installed)."""
    import shutil
    import subprocess
    import time

    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed (apt-get install redis-server)")
    port, folder = free_port(), tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):  # up to ~5 s
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield f"redis://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "jobs.sqlite3")
    import redis

    url = request.getfixturevalue("redis_url")
    db = 1 + len(request.node.name) % 14  # a fresh, flushed database per test
    redis.Redis.from_url(f"{url}/{db}").flushdb()
    return f"{url}/{db}"


@pytest.fixture
def store(store_url):
    """The store at `store_url`: the service's contract tests (tests/earl_service/service/) run on both."""
    from earl_service.service.store import open_store

    s = open_store(store_url)
    yield s
    s.close()


def api_operations(**settings) -> list[tuple[str, str]]:
    """Every (METHOD, path template) of the API, from its OpenAPI schema, so new routes are covered by default."""
    from api.main import create_app
    from api.settings import Settings

    app = create_app(Settings(**{"home": Path("/nonexistent"), **settings}))
    return sorted((method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops)


# ---------------------------------------------------------------- imported models against their library's formula

def assert_source_scores(bundle_path: Path, score, test: np.ndarray, known: np.ndarray, *, rtol: float = 1e-5,
                         head_score=None) -> None:
    """A bundle imported from another library answers as that library's formula, written out in the test:
    `score(heads, relation, tails)` -> (B,) scores (numpy broadcasting over index arrays); `head_score` the same
    for head queries where they differ (a reciprocal-relations model's). For each test triple our
    tail and head distances are minus those scores (within rtol of the query's largest), and the filtered realistic
    ranks of scorers.filtered_ranks equal those of the formula's scores, known answers (`known`) left out."""
    from earl_service.core import rotate, scorers
    from earl_service.core.known import KnownAnswers
    from earl_service.device import load

    edge = load(bundle_path)
    n = len(edge.entities)
    every = np.arange(n)
    answers = KnownAnswers(known, len(edge.relations))
    for side in ("tail", "head"):
        want_ranks = []
        for h, r, t in test:
            anchor, target = (h, t) if side == "tail" else (t, h)
            ref = (score(np.full(n, h), np.full(n, r), every) if side == "tail" else
                   (head_score or score)(every, np.full(n, r), np.full(n, t)))
            ours = -edge.distances(edge.query_vector(side, anchor, r))
            np.testing.assert_allclose(ours, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
            want_ranks.append(rotate.realistic_rank(-ref, int(target), excluded=answers.answers(side, anchor, r)))
        got = scorers.filtered_ranks(edge.scorer, edge.entity_embeddings, edge.relation_embeddings, test, answers,
                                     side=side)
        np.testing.assert_array_equal(got, want_ranks)
