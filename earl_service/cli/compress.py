"""The `earl compress` command (light imports: the search itself loads torch only when it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from earl_service.compress.config import PARALLEL_HELP
from earl_service.compress.options import add_compress_options, compress_config_from_options
from earl_service.config.options import add_data_options, add_recipe_option, data_config_from_options
from earl_service.errors import ConfigError


class _FromBundle(argparse.Action):
    """--from BUNDLE: a search over an imported model's sizes needs no --time-limit (default 10 minutes)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        for action in parser._actions:  # argparse checks required options after every argument is read
            if action.dest == "time_limit":
                action.required = False


def add_compress_command(sub) -> None:
    p = sub.add_parser("compress", help="find the most accurate bundle under a byte budget (models, dims, precisions)")
    p.add_argument("data", nargs="?", default=None,
                   help="folder with train, valid and optional test files (any format earl train reads); not with "
                        "--from")
    p.add_argument("--from", dest="from_bundle", default=None, metavar="BUNDLE", action=_FromBundle,
                   help="an imported bundle (`earl import`): search its precisions (fp32, fp16, int8, pq:M) under "
                        "--max-bytes instead of training; --graph DATA scores each size on DATA's valid split and "
                        "fine-tunes pq codebooks on its train split (docs/import.md)")
    p.add_argument("--graph", default=None, metavar="DATA", help="with --from: a dataset folder over the bundle's names")
    p.add_argument("--eval-triples", type=int, default=2000, metavar="N",
                   help="with --from and --graph: valid triples each size is scored on, a seeded sample (0: all; "
                        "default 2000). A pass ranks every entity for each, both sides: fewer on big tables")
    p.add_argument("--retrain-minutes", type=float, default=0.0, metavar="M",
                   help="with --from and --graph: also train models at the budget on DATA for M minutes (the search "
                        "`earl compress DATA --models ...` runs) and pick it where it scores above every coded size; "
                        "its answers are over DATA's entities (docs/import.md)")
    p.add_argument("--out", required=True,
                   help="job folder: the pick (bundle.safetensors), report.json/.md, frontier.png, candidates/; "
                        "run again with the same folder to continue a stopped job")
    add_compress_options(p)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help=f"{PARALLEL_HELP} (default: 1)")
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
    if a.from_bundle is not None or a.graph is not None:
        return _compress_imported(a)
    if a.data is None:
        raise ConfigError("earl compress needs a DATA folder to train on, or --from an imported bundle")
    if a.retrain_minutes:
        raise ConfigError("--retrain-minutes goes with --from BUNDLE --graph DATA (a search trains anyway)")
    from earl_service.compress.search import compress, pick_metrics
    from earl_service.compress.state import PICK
    from earl_service.config.options import train_configs_from_options
    from earl_service.data.dataset import load_dataset

    config = replace(compress_config_from_options(vars(a)), parallel=a.parallel)
    train_configs = train_configs_from_options({"progress": False, "device": a.device, "threads": a.threads,
                                                "seed": config.seed}, recipe=a.recipe)
    dataset = load_dataset(a.data, data=data_config_from_options(vars(a)), labels=a.labels)
    report = compress(dataset, a.out, config, train_configs=train_configs, on_progress=_show)
    assert report is not None  # nothing stops the command line's job but a signal, which ends the process
    print(json.dumps({"bundle": str(Path(a.out) / PICK), **pick_metrics(report)}, indent=2))
    return 0


def _compress_imported(a: argparse.Namespace) -> int:
    from earl_service.compress.config import checked_models, parse_size
    from earl_service.compress.retrained import compress_from
    from earl_service.config.options import train_configs_from_options
    from earl_service.imports.compress import ImportedSearch
    from earl_service.imports.sizes import DEFAULT_MINUTES

    if a.from_bundle is None or a.data is not None:
        raise ConfigError("earl compress --from BUNDLE [--graph DATA] takes no DATA argument, and --graph goes with "
                          "--from")
    if a.eval_triples < 0:
        raise ConfigError(f"--eval-triples must be 0 (all) or more, not {a.eval_triples}")
    search = ImportedSearch(max_bytes=parse_size(a.max_bytes),
                            time_limit_minutes=float(getattr(a, "time_limit", None) or DEFAULT_MINUTES), seed=a.seed
                            if getattr(a, "seed", None) is not None else 0, eval_triples=a.eval_triples)
    if not a.retrain_minutes >= 0:
        raise ConfigError(f"--retrain-minutes must be 0 (none) or more, not {a.retrain_minutes}")
    models = checked_models(a.models) if "models" in vars(a) else None  # the retrained search's (imports have one)
    if models and not a.retrain_minutes:
        raise ConfigError("--models with --from names the models --retrain-minutes trains at the budget; an imported "
                          "model's sizes are its own")
    train_configs = train_configs_from_options({"progress": False, "device": a.device, "threads": a.threads,
                                                "seed": search.seed}, recipe=a.recipe)
    report = compress_from(a.from_bundle, a.out, search, graph=a.graph, retrain_minutes=a.retrain_minutes,
                           retrain_models=models, train_configs=train_configs,
                           on_progress=lambda e: _show(e) if "rung" in e else None)
    assert report is not None  # only should_stop ends a search early, and the command line gives none
    print(json.dumps({"bundle": str(Path(a.out) / "bundle.safetensors") if report["pick"] else None,
                      "pick": report["pick"], "original": report["original"],
                      "sizes": [{k: r.get(k) for k in ("precision", "bytes", "fits", "mrr")}
                                for r in report["candidates"]]}, indent=2))
    return 0 if report["pick"] else 1
