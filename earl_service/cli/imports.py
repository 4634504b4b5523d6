"""`earl import`: a model trained elsewhere (PyKEEN, DGL-KE, PBG, GraphVite, LibKGE, plain arrays) as a bundle."""

from __future__ import annotations

import argparse
import json

from earl_service.bundle import precision as precisions
from earl_service.cli.bundle import add_coding_option, precision_argument


def add_import_command(sub) -> None:
    from earl_service.imports import FORMATS, KINDS

    p = sub.add_parser("import", help="a model trained elsewhere (PyKEEN, DGL-KE, PyTorch-BigGraph, GraphVite, LibKGE, "
                                      "plain arrays) as a bundle "
                                      "(docs/import.md)")
    p.add_argument("source", help="a PyKEEN, DGL-KE or PBG checkpoint folder, a GraphVite .pkl, a LibKGE .pt (or its "
                                  "folder), or a folder of arrays and name files")
    p.add_argument("--out", required=True, help="the bundle file to write")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="default: told by SOURCE (trained_model.pkl: pykeen; config.json and *_entity.npy: dglke; "
                        "model.vN.h5: pbg; a .pkl file: graphvite; a .pt file or checkpoint_best.pt: libkge; "
                        "else arrays)")
    p.add_argument("--scorer", choices=KINDS, default=None,
                   help="the arrays' score function (complex tables as [re | im] halves; rotate: the sum of complex "
                        "moduli, rotate-l2: PyKEEN's L2 norm); a GraphVite pickle saved without its model's name "
                        "takes transe-l1, distmult, complex or rotate")
    graph = p.add_mutually_exclusive_group()
    graph.add_argument("--graph", default=None, metavar="DATA",
                       help="a triple file, or a dataset folder's train file, whose triples are the known answers "
                            "predictions leave out (default: PyKEEN's training triples; arrays: none)")
    graph.add_argument("--no-graph", action="store_true", help="no known answers, not even the source's own")
    p.add_argument("--precision", type=precision_argument, default=precisions.DEFAULT.name,
                   help=f"{precisions.describe()} (default: %(default)s)")
    add_coding_option(p)
    p.set_defaults(func=cmd_import)


def cmd_import(a: argparse.Namespace) -> int:
    from earl_service.imports import read_model, to_bundle

    imported = read_model(a.source, fmt=a.format, scorer=a.scorer)
    bundle = to_bundle(imported, graph=a.graph, known=not a.no_graph)
    path = bundle.save(a.out, precision=a.precision, coding=a.coding)
    print(json.dumps({"path": str(path), "bytes": path.stat().st_size, "model": bundle.config.model,
                      "dim": bundle.config.dim, "entities": len(bundle.entities), "relations": len(bundle.relations),
                      "triples": len(bundle.triples), "precision": a.precision, "imported": imported.source}))
    return 0
