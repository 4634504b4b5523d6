"""The `earl compress` command (light imports: the search itself loads torch only when it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from earl_service.bundle import precision as precisions
from earl_service.compress.config import SEARCHED
from earl_service.config import MODELS
from earl_service.config.options import add_data_options, add_recipe_option, data_config_from_options


def add_compress_command(sub) -> None:
    p = sub.add_parser("compress", help="find the most accurate bundle under a byte budget (models, dims, precisions)")
    p.add_argument("data", help="folder with train, valid and optional test files (any format earl train reads)")
    p.add_argument("--out", required=True,
                   help="job folder: the pick (bundle.safetensors), report.json/.md, frontier.png, candidates/; "
                        "run again with the same folder to continue a stopped job")
    p.add_argument("--max-bytes", required=True, metavar="SIZE",
                   help="most bytes the bundle file may take: 2MB (= 2,000,000: kB/MB/GB are powers of 10), "
                        "1.5MiB (= 1.5 * 2**20: KiB/MiB/GiB are powers of 2), 500000 or 2e6")
    p.add_argument("--time-limit", type=float, required=True, metavar="MINUTES",
                   help="minutes for the search (training, validation, exports; the final test evaluation comes after)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--precisions", default=",".join(SEARCHED),
                   help=f"comma-separated, from {precisions.describe()}; pq alone: each code size that fits "
                        "(default: %(default)s)")
    p.add_argument("--metric", default="mrr", help="validation metric that picks: mrr or hits@10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--no-labels", dest="labels", action="store_false",
                   help="leave the label files beside the triples out of every bundle (their bytes too)")
    add_recipe_option(p)
    add_data_options(p)
    p.set_defaults(func=cmd_compress)


def _show(progress: dict[str, Any]) -> None:
    """Stage changes on stderr (not every training step)."""
    if progress["stage"] != "train" or "seconds" in progress:
        what = " ".join(str(progress[k]) for k in ("candidate", "precision") if progress.get(k))
        print(f"rung {progress['rung'] + 1} of {progress['rungs']}: {progress['stage']} {what} "
              f"({progress['time_left']:.0f} s left)", file=sys.stderr)


def cmd_compress(a: argparse.Namespace) -> int:
    from earl_service.compress.config import CompressConfig
    from earl_service.compress.search import PICK, compress, pick_metrics
    from earl_service.config.options import train_configs_from_options
    from earl_service.data.dataset import load_dataset

    config = CompressConfig.from_text(a.max_bytes, a.time_limit, models=a.models, precisions=a.precisions,
                                      metric=a.metric, seed=a.seed)
    train_configs = train_configs_from_options({"progress": False, "device": a.device, "threads": a.threads,
                                                "seed": a.seed}, recipe=a.recipe)
    dataset = load_dataset(a.data, data=data_config_from_options(vars(a)), labels=a.labels)
    report = compress(dataset, a.out, config, train_configs=train_configs, on_progress=_show)
    assert report is not None  # nothing stops the command line's job but a signal, which ends the process
    print(json.dumps({"bundle": str(Path(a.out) / PICK), **pick_metrics(report)}, indent=2))
    return 0
