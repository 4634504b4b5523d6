"""Time to load a bundle and rebuild every entity embedding, torch path and numpy edge path (median of N).

    python bench/rebuild.py BUNDLE [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, write_results  # noqa: E402

from earl_service import edge  # noqa: E402
from earl_service.bundle import load_bundle  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    b = load_bundle(args.bundle)
    result = {
        "bundle": args.bundle.name, "bytes": b.num_bytes, "entities": len(b.entities), "dim": b.config.dim,
        "threads": args.threads,
        "torch_load_and_rebuild_s": timed(lambda: load_bundle(args.bundle).entity_embeddings(), args.repeats),
        "edge_numpy_load_and_rebuild_s": timed(lambda: edge.load(args.bundle), args.repeats),
    }
    md = "\n".join([f"# Rebuilding all {result['entities']} entity embeddings from {args.bundle.name}", "",
                    md_table(["path", "median seconds (load + rebuild)"],
                             [["torch (earl_service.load_bundle)", result["torch_load_and_rebuild_s"]],
                              ["numpy only (earl_service.edge.load)", result["edge_numpy_load_and_rebuild_s"]]])])
    write_results("rebuild", result, md)
    print(md)


if __name__ == "__main__":
    main()
