"""Where the benchmarks find the datasets: `../shared/datasets` beside the repository, $EARL_DATASETS, or --datasets."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from harness.machine import REPO


def default_datasets() -> Path:
    return Path(os.environ.get("EARL_DATASETS", REPO.parent / "shared" / "datasets"))


def add_datasets_argument(parser: argparse.ArgumentParser) -> None:
    """The `--datasets FOLDER` option every dataset-reading bench takes."""
    parser.add_argument("--datasets", type=Path, default=default_datasets(),
                        help="folder holding the datasets (default: $EARL_DATASETS or ../shared/datasets)")


def dataset_folder(name: str, datasets: Path | None = None) -> Path:
    """A graph built here (data/NAME: make wordnet-full, the synthetic generator) or else a shared one."""
    built = REPO / "data" / name
    return built if built.is_dir() else (datasets or default_datasets()) / name
