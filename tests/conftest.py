"""Shared fixtures: small random multigraphs and the path to the shared datasets."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("EARL_DATASETS", REPO.parent / "shared" / "datasets"))
BUNDLED_KG = REPO / "earl_service" / "demo_data" / "codex-s"

torch.set_num_threads(2)


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


@pytest.fixture
def small_graph_triples() -> np.ndarray:
    return random_triples(30, 4, 120)
