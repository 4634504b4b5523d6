"""`earl export`, `earl info` and `earl extend`: a bundle out of a run (or its embeddings as tables), described,
or grown by new triples without retraining."""

from __future__ import annotations

import argparse
import json

from earl_service.bundle import precision as precisions
from earl_service.cli.answers import cmd_export_tables
from earl_service.device.tables import FORMATS as TABLE_FORMATS


def cmd_export(a: argparse.Namespace) -> int:
    if a.format != "safetensors":
        return cmd_export_tables(a)
    from earl_service.bundle.model_io import export_bundle

    path = export_bundle(a.run_dir, a.out, precision=a.precision, coding=a.coding, graph=not a.no_graph)
    print(json.dumps({"path": str(path), "bytes": path.stat().st_size, "precision": a.precision,
                      "graph": not a.no_graph}))
    return 0


def bundle_info(path: str) -> dict:
    from earl_service.bundle.format import shown_metrics
    from earl_service.bundle.model_io import load_bundle

    b = load_bundle(path)
    return {"path": str(path), "bytes": b.num_bytes, "precision": b.precision, "sha256": b.sha256,
            "trainable_parameters": b.trainable_parameters, "entities": len(b.entities),
            "relations": len(b.relations), "triples": len(b.triples), "graph": b.has_graph, "model": b.config.model,
            "dim": b.config.dim, "weights_coding": b.coding,
            "labels": {"entities": len(b.entity_labels), "relations": len(b.relation_labels)},
            "metrics": shown_metrics(b.metrics)}


def cmd_info(a: argparse.Namespace) -> int:
    print(json.dumps(bundle_info(a.bundle), indent=2, default=str))
    return 0


def cmd_extend(a: argparse.Namespace) -> int:
    from earl_service.bundle.model_io import load_bundle

    before = load_bundle(a.bundle)
    after = before.extend(a.triples)
    path = after.save(a.out, precision=a.precision or before.precision, coding=a.coding)
    print(json.dumps({"path": str(path), "entities_added": len(after.entities) - len(before.entities),
                      "triples_added": int(len(after.triples) - len(before.triples)), "bytes": path.stat().st_size}))
    return 0


def add_coding_option(p: argparse.ArgumentParser) -> None:
    from earl_service.bundle.format import CODINGS

    by_coding = {c: [k.family for k in precisions.registered() if k.coding == c] for c in CODINGS}
    default = "; ".join(f"{c} for {', '.join(names)}" for c, names in by_coding.items() if names)
    p.add_argument("--coding", choices=CODINGS, default=None,
                   help=f"weights as plain tensors, or byte planes + xz (lossless, ~15%% smaller); default: {default}")


def precision_argument(text: str) -> str:
    """A precision argument: any registered precision's spelling (bundle/precision.py), as its name."""
    try:
        return precisions.Precision.parse(text).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_bundle_commands(sub) -> None:
    """`earl export`, `earl info` and `earl extend`: a bundle out of a run, described, or grown."""
    p = sub.add_parser("export", help="re-export a trained run's bundle (optionally at lower precision), or its "
                                      "rebuilt embeddings as tables (--format npy|tsv|parquet)")
    p.add_argument("run_dir", help="run directory; with a table --format also a bundle file")
    p.add_argument("--out", required=True, help="bundle file; with a table --format a directory")
    p.add_argument("--format", choices=("safetensors", *TABLE_FORMATS), default="safetensors",
                   help="safetensors: a bundle (default); npy, tsv, parquet: entity embeddings and relation phases "
                        "with their ids, and meta.json (docs/answers.md)")
    p.add_argument("--precision", type=precision_argument, default=precisions.DEFAULT.name,
                   help=f"{precisions.describe()} (default: %(default)s)")
    add_coding_option(p)
    p.add_argument("--no-graph", action="store_true",
                   help="leave the training graph out (RotatE only: its bytes go to nothing else, and answers then "
                        "include facts the graph holds)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", help="print a bundle's size, precision, counts and stored metrics as JSON")
    p.add_argument("bundle")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("extend", help="add triples (new entities allowed) to a bundle without retraining")
    p.add_argument("bundle")
    p.add_argument("--triples", required=True, help="triple file to add")
    p.add_argument("--out", required=True)
    p.add_argument("--precision", type=precision_argument, default=None,
                   help=f"{precisions.describe()} (default: the bundle's own)")
    add_coding_option(p)
    p.set_defaults(func=cmd_extend)
