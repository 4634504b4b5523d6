"""Reading a synthetic triple file in each input format: seconds and peak RSS, one child process per format.

A random graph (entities = triples / 10, 200 relations, names like e123456 / r17, RDF: http://example.org/ IRIs)
is written as TSV, gzipped CSV with a header, N-Triples, Parquet (row groups of 1M) and Turtle; each file is then
read by `earl_service.data.dataset.read_table` in a fresh process, whose VmHWM is its peak resident memory (the
baseline column: the same process after its imports, before reading).

    python bench/read_formats.py                                   # 10M triples; N-Triples 2M, Turtle 200k
    python bench/read_formats.py --csv-triples 2000000 --rdf-triples 1000000 --turtle-triples 100000  # results/
    python bench/read_formats.py --triples 1000000 --rdf-triples 200000 --turtle-triples 50000
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, write_results

FORMATS = ("tsv", "csv.gz", "nt", "parquet", "ttl")
EX = "http://example.org/"
_CHUNK = 1_000_000


def random_ids(n: int, seed: int = 0):
    """Chunks of (heads, relations, tails) int arrays, _CHUNK rows at a time."""
    rng = np.random.default_rng(seed)
    entities = max(10, n // 10)
    for start in range(0, n, _CHUNK):
        size = min(_CHUNK, n - start)
        yield rng.integers(0, entities, size), rng.integers(0, 200, size), rng.integers(0, entities, size)


def write_text(path: Path, n: int, line: str, *, header: str = "", opener=open) -> None:
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(header)
        for h, r, t in random_ids(n):
            f.write("".join(line.format(h=a, r=b, t=c) for a, b, c in zip(h.tolist(), r.tolist(), t.tolist(),
                                                                           strict=True)))


def write_parquet(path: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("head", pa.string()), ("relation", pa.string()), ("tail", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for h, r, t in random_ids(n):
            columns = [pa.array(np.char.add(prefix, ids.astype(str))) for prefix, ids in (("e", h), ("r", r), ("e", t))]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))


def write_file(fmt: str, folder: Path, n: int) -> Path:
    path = folder / f"train.{fmt}"
    if fmt == "tsv":
        write_text(path, n, "e{h}\tr{r}\te{t}\n")
    elif fmt == "csv.gz":
        write_text(path, n, "e{h},r{r},e{t}\n", header="head,relation,tail\n", opener=gzip.open)
    elif fmt == "nt":
        write_text(path, n, f"<{EX}e{{h}}> <{EX}r{{r}}> <{EX}e{{t}}> .\n")
    elif fmt == "ttl":
        write_text(path, n, "ex:e{h} ex:r{r} ex:e{t} .\n", header=f"@prefix ex: <{EX}> .\n")
    else:
        write_parquet(path, n)
    return path


def peak_rss_mib() -> float:
    """This process's peak resident memory, MiB: VmHWM, which starts afresh at exec. (ru_maxrss would do, but Linux
    carries it over from the parent at fork and through exec, and the parent has just written the file.)"""
    status = Path("/proc/self/status").read_text()
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
    if line is None:  # not Linux: ru_maxrss (KiB on Linux, bytes on macOS)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)
    return int(line.split()[1]) / 1024


def child(path: str) -> None:
    """Read one file and print what it cost (this process's own peak)."""
    from earl_service.data.triples import read_table

    baseline = peak_rss_mib()
    start, cpu = time.perf_counter(), time.process_time()
    table = read_table(path, max_bytes=2**40)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_mib": peak_rss_mib(),
                      "baseline_rss_mib": baseline,
                      "triples_read": len(table) + table.duplicates, "entities": len(table.entities),
                      "read_as": table.report.format}))


def measure(fmt: str, n: int, folder: Path) -> dict:
    t0 = time.perf_counter()
    path = write_file(fmt, folder, n)
    written = time.perf_counter() - t0
    out = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True, check=True)
    row = {"format": fmt, "triples": n, "file_mib": path.stat().st_size / 2**20, "write_seconds": written,
           **json.loads(out.stdout.strip().splitlines()[-1])}
    row["triples_per_cpu_second"] = n / row["cpu_seconds"]
    path.unlink()
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triples", type=int, default=10_000_000, help="triples in the TSV, CSV and Parquet files")
    parser.add_argument("--csv-triples", type=int, default=None, help="triples in the gzipped CSV (default: --triples)")
    parser.add_argument("--rdf-triples", type=int, default=2_000_000, help="triples in the N-Triples file")
    parser.add_argument("--turtle-triples", type=int, default=200_000,
                        help="triples in the Turtle file (rdflib parses it whole, in memory)")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, from {', '.join(FORMATS)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        child(a.child)
        return
    sizes = {"csv.gz": a.csv_triples or a.triples, "nt": a.rdf_triples, "ttl": a.turtle_triples}
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(fmt, sizes.get(fmt, a.triples), Path(tmp)) for fmt in a.formats.split(",")]
    table = md_table(["format", "read as", "triples", "file MiB", "CPU s", "wall s", "triples / CPU s",
                      "peak RSS MiB", "baseline MiB", "entities"],
                     [[r["format"], r["read_as"], f"{r['triples']:,}", r["file_mib"], r["cpu_seconds"], r["seconds"],
                       f"{r['triples_per_cpu_second']:,.0f}", r["peak_rss_mib"], r["baseline_rss_mib"],
                       f"{r['entities']:,}"] for r in rows])
    markdown = f"""# Reading each input format

`earl_service.data.dataset.read_table` on a synthetic graph (entities = triples / 10, 200 relations), one fresh process per
format; peak RSS is that process's VmHWM (ru_maxrss carries the parent's peak over on Linux), baseline the same
process after its imports. CPU seconds are the reader's own work, wall seconds the elapsed time (they part when
other work shares the machine: see the cores and load average below). Turtle is parsed by rdflib as a whole graph
in memory (docs/data.md), so its peak grows with the graph, not a batch, and its file is the smaller one; a Turtle
graph is a set, so a triple the generator drew twice is read once.

{table}
"""
    write_results("read_formats", {"rows": rows, "args": vars(a)}, markdown)


if __name__ == "__main__":
    main()
