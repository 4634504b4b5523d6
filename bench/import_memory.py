"""Peak RSS of `earl import` on a table larger than this bench wants in memory twice: a synthetic (rows, width)
float32 entity table as .npy (1M x 256 = 1.02 GB by default), DistMult, no graph, written at each precision.

    python bench/import_memory.py                      # 1,000,000 x 256, fp32 and int8
    python bench/import_memory.py --rows 200000        # quicker

Each import runs in its own process; its peak RSS is that child's ru_maxrss (os.wait4). The npy file is
memory-mapped, so its pages count in the RSS as they are read (file-backed, given back under pressure); the
ratio to the table's bytes is the figure: under 2 the table was not held twice. Writes
bench/results/import_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, md_table, write_results  # noqa: E402


def make_table(folder: Path, rows: int, width: int) -> int:
    """The arrays layout: entity_embeddings.npy written in blocks (never whole here), names, a few relations."""
    table = np.lib.format.open_memmap(folder / "entity_embeddings.npy", mode="w+", dtype=np.float32,
                                      shape=(rows, width))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 100_000):
        table[start : start + 100_000] = rng.normal(size=(min(100_000, rows - start), width)).astype(np.float32)
    table.flush()
    del table
    np.save(folder / "relation_embeddings.npy", rng.normal(size=(16, width)).astype(np.float32))
    (folder / "entities.tsv").write_text("".join(f"Q{i}\n" for i in range(rows)))
    (folder / "relations.tsv").write_text("".join(f"P{i}\n" for i in range(16)))
    return rows * width * 4


def measure(folder: Path, out: Path, precision: str) -> dict:
    """One `earl import` in a child process: seconds, peak RSS, file bytes."""
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "earl_service.cli.main", "import", str(folder), "--scorer", "distmult",
           "--no-graph", "--precision", precision, "--coding", "plain", "--out", str(out)]
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {child.returncode}")
    return {"precision": precision, "seconds": round(time.perf_counter() - start, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "bytes": out.stat().st_size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--precisions", default="fp32,int8")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(dir=REPO / "runs") as tmp:
        folder = Path(tmp) / "src"
        folder.mkdir()
        table_bytes = make_table(folder, a.rows, a.width)
        rows = [measure(folder, Path(tmp) / f"{prec}.safetensors", prec) for prec in a.precisions.split(",")]
    for row in rows:
        row["rss_over_table"] = round(row["peak_rss_mib"] * 2**20 / table_bytes, 2)
    data = {"rows": a.rows, "width": a.width, "table_bytes": table_bytes, "imports": rows}
    md = (f"# `earl import` peak RSS: a {a.rows:,} x {a.width} float32 table ({table_bytes / 1e9:.2f} GB .npy)\n\n"
          "DistMult, no graph, plain weights; each import its own process (peak RSS: its ru_maxrss, from "
          "os.wait4). The npy file is memory-mapped: its pages count as they are read.\n\n"
          + md_table(["precision", "seconds", "peak RSS MiB", "RSS / table bytes", "file bytes"],
                     [[r["precision"], r["seconds"], r["peak_rss_mib"], r["rss_over_table"], r["bytes"]]
                      for r in rows]))
    write_results("import_memory", data, md)
    print(md)


if __name__ == "__main__":
    main()
