"""Peak RSS of `earl import` on a table larger than this bench wants in memory twice: a synthetic (rows, width)
float32 entity table as .npy (1M x 256 = 1.02 GB by default), DistMult, no graph, written at each precision.

    python bench/import_memory.py                      # 1,000,000 x 256, fp32 and int8
    python bench/import_memory.py --rows 200000        # quicker

Each import runs in its own process; its peak RSS is that child's whole peak (harness.processes.child_peak). The npy file is
memory-mapped, so its pages count in the RSS as they are read (file-backed, given back under pressure); the
ratio to the table's bytes is the figure: under 2 the table was not held twice. Then each import is loaded as the
server loads it (its predictor and index) and asked one query: peak RSS, and the RSS the process keeps (--no-serve
skips it). Writes bench/results/import_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, md_table, write_results  # noqa: E402
from harness.processes import child_peak  # noqa: E402


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


def child(cmd: list[str], log: Path) -> tuple[float, float]:
    """Run `cmd` in a child process from the repository, its output in `log`: (seconds, its peak RSS in MiB)."""
    measured = child_peak(cmd, log)
    return measured["seconds"], measured["peak_rss_mib"]


def measure(folder: Path, out: Path, precision: str) -> dict:
    """One `earl import` in a child process: seconds, peak RSS, file bytes."""
    seconds, rss = child([sys.executable, "-m", "earl_service.cli.main", "import", str(folder), "--scorer",
                          "distmult", "--no-graph", "--precision", precision, "--coding", "plain", "--out", str(out)],
                         out.parent / f"{out.name}.log")
    return {"step": f"import --precision {precision}", "precision": precision, "seconds": seconds,
            "peak_rss_mib": rss, "bytes": out.stat().st_size}


SERVE = """
import gc, json, sys, time
from earl_service.bundle.model_io import load_bundle
from earl_service.memory import current_rss_mb, peak_rss_mb
from earl_service.serve.predictor import LinkPredictor
served = LinkPredictor.from_bundle(load_bundle(sys.argv[1], keep_codes=True))
gc.collect()
served.predict_tails("Q0", "P0", k=10)
print(json.dumps({"peak_rss_mib": round(peak_rss_mb(), 1), "kept_rss_mib": round(current_rss_mb(), 1),
                  "resident_bytes": served.resident_bytes, "index": served.index_kind}))
"""


def measure_serve(bundle: Path, precision: str) -> dict:
    """The server's load of the import (load_bundle(keep_codes=True), its predictor and index) and one query, in a
    child process: its peak RSS, and the RSS it keeps after (what a served model costs)."""
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", SERVE, str(bundle)], cwd=REPO, capture_output=True, text=True,
                         check=False)
    if run.returncode:
        raise SystemExit(f"serving {bundle} exited {run.returncode}: {run.stderr[-2000:]}")
    kept = json.loads(run.stdout.strip().splitlines()[-1])
    return {"step": f"serve the {precision} import ({kept.pop('index')} index), one query", "precision": precision,
            "seconds": round(time.perf_counter() - start, 1), "bytes": bundle.stat().st_size, **kept}


def make_graph(folder: Path, rows: int, triples: int) -> None:
    """A random graph over the table's names (train / valid / test): its MRR means nothing, its memory is real."""
    rng = np.random.default_rng(1)
    folder.mkdir()
    for split, count in (("train", triples), ("valid", 1000), ("test", 1000)):
        h, t, r = rng.integers(rows, size=count), rng.integers(rows, size=count), rng.integers(16, size=count)
        (folder / f"{split}.txt").write_text("".join(f"Q{a}\tP{b}\tQ{c}\n" for a, b, c in zip(h, r, t, strict=True)))


def measure_compress(bundle: Path, out: Path, max_bytes: str, minutes: float, graph: Path | None,
                     eval_triples: int) -> dict:
    """`earl compress --from` the fp32 import in a child process: without a graph (the largest size that fits),
    or with one (each size scored on `eval_triples` valid triples, pq codebooks fine-tuned)."""
    extra = ["--graph", str(graph), "--eval-triples", str(eval_triples)] if graph else []
    seconds, rss = child([sys.executable, "-m", "earl_service.cli.main", "compress", "--from", str(bundle),
                          "--max-bytes", max_bytes, "--time-limit", f"{minutes:g}", "--out", str(out), *extra],
                          out.parent / f"{out.name}.log")
    pick = out / "bundle.safetensors"
    step = f"compress --from (fp32) --max-bytes {max_bytes}" + (f", a graph, {eval_triples} valid triples"
                                                                  if graph else "")
    return {"step": step, "precision": "", "seconds": seconds, "peak_rss_mib": rss, "bytes": pick.stat().st_size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--no-serve", dest="serve", action="store_false",
                   help="skip loading each import as the server does (peak RSS and the RSS it keeps)")
    p.add_argument("--compress", default="", help="then `earl compress --from` the fp32 import to this budget")
    p.add_argument("--minutes", type=float, default=10, help="the compress search's time limit")
    p.add_argument("--graph-triples", type=int, default=0,
                   help="and compress again with a random graph of this many train triples (sizes scored, pq tuned)")
    p.add_argument("--eval-triples", type=int, default=100, help="valid triples a size is scored on, with a graph")
    a = p.parse_args()
    precisions = a.precisions.split(",") + (["fp32"] if a.compress and "fp32" not in a.precisions.split(",") else [])
    with tempfile.TemporaryDirectory(dir=REPO / "runs") as tmp:
        folder = Path(tmp) / "src"
        folder.mkdir()
        table_bytes = make_table(folder, a.rows, a.width)
        rows = [measure(folder, Path(tmp) / f"{prec}.safetensors", prec) for prec in precisions]
        rows += [measure_serve(Path(tmp) / f"{prec}.safetensors", prec) for prec in precisions if a.serve]
        if a.compress:
            rows.append(measure_compress(Path(tmp) / "fp32.safetensors", Path(tmp) / "small", a.compress, a.minutes,
                                         None, 0))
        if a.compress and a.graph_triples:
            make_graph(Path(tmp) / "graph", a.rows, a.graph_triples)
            rows.append(measure_compress(Path(tmp) / "fp32.safetensors", Path(tmp) / "small-graph", a.compress,
                                         a.minutes, Path(tmp) / "graph", a.eval_triples))
    for row in rows:
        row["rss_over_table"] = round(row["peak_rss_mib"] * 2**20 / table_bytes, 2)
    data = {"rows": a.rows, "width": a.width, "table_bytes": table_bytes, "imports": rows}
    md = (f"# `earl import` peak RSS: a {a.rows:,} x {a.width} float32 table ({table_bytes / 1e9:.2f} GB .npy)\n\n"
          "DistMult, no graph, plain weights; each step its own process (peak RSS: its whole peak, "
          "harness.processes.child_peak). The npy file is memory-mapped: its pages count as they are read. `compress --from` reads "
          "the fp32 import (no graph: it keeps the largest size that fits; with a random graph: each size scored on its "
          "valid triples, pq codebooks fine-tuned). A served import: the server's load (`load_bundle(keep_codes=True)`, "
          "its predictor and FAISS index) and one query; kept RSS: what the process holds after it.\n\n"
          + md_table(["step", "seconds", "peak RSS MiB", "RSS / table bytes", "kept RSS MiB", "file bytes"],
                     [[r["step"], r["seconds"], r["peak_rss_mib"], r["rss_over_table"], r.get("kept_rss_mib", ""),
                       r["bytes"]] for r in rows]))
    write_results("import_memory", data, md)
    print(md)


if __name__ == "__main__":
    main()
