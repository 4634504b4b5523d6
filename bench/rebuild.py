"""Time to load a bundle and rebuild every entity embedding: torch path, and the edge reader with and without
scipy (median of N).

    python bench/rebuild.py BUNDLE [BUNDLE ...] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, median_seconds, write_results

from earl_service.bundle.model_io import load_bundle
from earl_service.device import reader as edge


def edge_seconds(path: Path, repeats: int, scipy: bool) -> float | None:
    if scipy and edge.scipy_sparse() is None:
        return None  # scipy not installed
    return median_seconds(lambda: edge.load(path, use_scipy=scipy), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for path in args.bundles:
        b = load_bundle(path)
        rows.append({
            "bundle": path.name, "bytes": b.num_bytes, "precision": b.precision, "coding": b.coding,
            "entities": len(b.entities), "dim": b.config.dim, "threads": args.threads,
            "torch_load_and_rebuild_s": median_seconds(lambda p=path: load_bundle(p).entity_embeddings(), args.repeats),
            "edge_scipy_load_and_rebuild_s": edge_seconds(path, args.repeats, scipy=True),
            "edge_numpy_load_and_rebuild_s": edge_seconds(path, args.repeats, scipy=False),
        })
    table = [[r["bundle"], r["entities"], r["precision"], r["coding"], r["bytes"], r["torch_load_and_rebuild_s"],
              r["edge_scipy_load_and_rebuild_s"], r["edge_numpy_load_and_rebuild_s"]] for r in rows]
    md = "\n".join(["# Loading a bundle and rebuilding every entity embedding (median seconds)", "",
                    md_table(["bundle", "entities", "precision", "weights coding", "bytes", "torch (load_bundle)",
                              "edge reader, numpy + scipy", "edge reader, numpy only"], table), "",
                    f"{args.threads} threads; each figure includes reading and verifying the file, decoding the graph "
                    "(and coded weights), kNResEnt and the GNN."])
    write_results("rebuild", {"results": rows}, md)
    print(md)


if __name__ == "__main__":
    main()
