"""Memory at scale: peak RSS and seconds of each stage of the RotatE path, each in its own process, by graph size.

The graphs are earl_service/data/synthetic.py's (typed, power-law degrees, 10 train triples per entity, 200
relations), drawn once into data/synthetic-<N> (the draw is measured when this run makes it). Then, for each size:
- train: `earl train DATA --model rotate --dim D --steps S` on one thread (no validation, no final evaluation;
  from 500,000 entities the steps share corruptions and update rows, as compress trains RotatE there);
- export: `earl export RUN --precision pq:M --no-graph` (faiss codebooks fit on rows drawn by degree);
- serve: the API (`uvicorn api.main:app`, one thread) registers the bundle by POST /models and answers its first
  GET /predict (which loads the bundle and builds the search index); its peak RSS is the API process's VmHWM;
- compress (with --compress-minutes): `earl compress DATA --max-bytes BYTES --time-limit M --models rotate
  --known-answers none --no-labels --threads 1`, BYTES = --bytes-per-entity x N.
A stage's peak RSS covers its whole process, loading the data included: the largest of the kernel's count at
exit, VmRSS sampled every 50 ms and the child's own figure (harness.processes.child_peak: the kernel's count alone, what `time -v`
prints, holds only the peak since earl last restarted it). Nothing runs beside a stage but this script,
which samples and waits.

    python bench/memory_scale.py --sizes 100000,1000000,5000000 --compress-minutes 10
    python bench/memory_scale.py --quick     # 20,000 entities, 30 steps, a 1-minute compress: a smoke run
    # writes bench/results/memory_scale.{json,md} (--name to keep another)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, api_server, md_table, write_results
from harness.processes import child_peak, status_kib

EARL = [sys.executable, "-m", "earl_service.cli.main"]
measured = partial(child_peak, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})  # one torch thread


def graph(n: int, data: Path, folder: Path) -> tuple[Path, dict | None]:
    """data/synthetic-<n>, drawn (and measured) if it is not there yet."""
    path = data / (f"synthetic-{n // 1_000_000}m" if n % 1_000_000 == 0 else f"synthetic-{n // 1000}k")
    if (path / "train.tsv").exists():
        return path, None
    return path, measured([*EARL[:2], "earl_service.data.synthetic", "--entities", str(n), "--out", str(path)],
                          folder / "draw.log")


def train(data: Path, run: Path, args: argparse.Namespace, folder: Path) -> dict:
    stage = measured([*EARL, "train", str(data), "--out", str(run), "--model", "rotate", "--dim", str(args.dim),
                      "--steps", str(args.steps), "--eval-every", "0", "--no-final-eval", "--threads", "1",
                      "--checkpoint-every", "0", "--no-progress"], folder / "train.log",
                     own_peak_mib=lambda: json.loads((run / "metrics.json").read_text())["peak_rss_mb"])
    median = json.loads((run / "metrics.json").read_text()).get("median_step_seconds")
    return {**stage, "median_step_s": round(median, 4) if median else None}


def export(run: Path, bundle: Path, codes: int, folder: Path) -> dict:
    stage = measured([*EARL, "export", str(run), "--out", str(bundle), "--precision", f"pq:{codes}", "--no-graph"],
                     folder / "export.log")
    return {**stage, "bytes": bundle.stat().st_size}


def serve(bundle: Path, data: Path, entities: int, folder: Path) -> dict:
    """Register `bundle` with a fresh API and ask its first question; the API's peak and current RSS."""
    with (data / "test.tsv").open() as f:
        head, relation, _ = f.readline().rstrip("\n").split("\t")
    # The server's defaults refuse bundles over 2,000,000 names (EARL_MAX_BUNDLE_ENTITIES): raised to this graph's.
    env = {"EARL_MAX_UPLOAD_MB": str(max(100, 2 * bundle.stat().st_size // 2**20)), "OMP_NUM_THREADS": "1",
           "EARL_MAX_BUNDLE_ENTITIES": str(max(2_000_000, entities))}
    with api_server(Path(tempfile.mkdtemp(dir=folder)), env=env, timeout=300, log=folder / "api.log") as (base, proc):
        with httpx.Client(base_url=base, timeout=1800) as http, bundle.open("rb") as f:
            t0 = time.perf_counter()
            model = http.post("/models", files={"bundle": (bundle.name, f)})
            model.raise_for_status()
            answer = http.get("/predict", params={"model": model.json()["id"], "head": head, "relation": relation})
            answer.raise_for_status()
            seconds = time.perf_counter() - t0
        return {"seconds": round(seconds, 1), "peak_rss_mib": round(status_kib(proc.pid, "VmHWM") / 1024, 1),
                "rss_mib": round(status_kib(proc.pid, "VmRSS") / 1024, 1)}


def compress(data: Path, out: Path, n: int, args: argparse.Namespace, folder: Path) -> dict:
    budget = args.bytes_per_entity * n
    stage = measured([*EARL, "compress", str(data), "--out", str(out), "--max-bytes", str(budget), "--time-limit",
                      str(args.compress_minutes), "--models", "rotate", "--known-answers", "none", "--no-labels",
                      "--threads", "1"], folder / "compress.log",
                     own_peak_mib=lambda: json.loads((out / "report.json").read_text())["peak_rss_mb"])
    report = json.loads((out / "report.json").read_text())
    pick, test = report.get("pick") or {}, report.get("test") or {}
    return {**stage, "budget": budget, "pick": f"{pick.get('candidate')} {pick.get('precision')}",
            "test_mrr": test.get("mrr"), "test_triples": test.get("test_subset"), "peak_rss_mb_by_phase":
            report.get("peak_rss_mb_by_phase")}


def one_size(n: int, args: argparse.Namespace, work: Path) -> dict:
    folder = work / str(n)
    shutil.rmtree(folder, ignore_errors=True)  # a compress folder left there would resume, not search
    folder.mkdir(parents=True)
    data, draw = graph(n, args.data, folder)
    with (data / "train.tsv").open("rb") as f:
        triples = sum(1 for _ in f)
    row: dict = {"entities": n, "train_triples": triples, "draw": draw}
    bundle = folder / "bundle.safetensors"
    stages = {"train": lambda: train(data, folder / "run", args, folder),
              "export": lambda: export(folder / "run", bundle, args.codes, folder),
              "serve": lambda: serve(bundle, data, n, folder)}
    if args.compress_minutes:
        stages["compress"] = lambda: compress(data, folder / "compress", n, args, folder)
    for name, stage in stages.items():
        try:
            row[name] = stage()
        except Exception as exc:  # an out-of-memory kill, a failed command: kept in the table, the rest skipped
            row["failed"] = f"{name}: {exc}"
            break
        finally:
            print(f"{n:,}: {name} {row.get(name) or row.get('failed')}", flush=True)
    return row


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    def cell(stage: dict | None) -> str:
        return "-" if not stage else f"{stage['peak_rss_mib']:,.0f} MiB, {stage['seconds']:,.0f} s"

    def bundle_bytes(row: dict) -> str:
        return f"{row['export']['bytes']:,} B" if row.get("export") else "-"

    table = md_table(
        ["entities", "train triples", "draw", f"train ({args.steps} steps)", "s/step", f"export pq:{args.codes}",
         "bundle", "serve (register + first answer)", "compress"],
        [[f"{r['entities']:,}", f"{r['train_triples']:,}", cell(r["draw"]), cell(r.get("train")),
          (r.get("train") or {}).get("median_step_s"), cell(r.get("export")), bundle_bytes(r), cell(r.get("serve")),
          cell(r.get("compress"))] for r in rows])
    failed = [f"- {r['entities']:,}: {r['failed']}" for r in rows if r.get("failed")]
    low = [f"{r['entities']:,} {name} {stage['peaks_mib']['exit_count']:,.0f} MiB"
           for r in rows for name in ("train", "compress") if (stage := r.get(name))
           and stage["peaks_mib"]["exit_count"] < 0.95 * stage["peak_rss_mib"]]
    picks = [f"- {r['entities']:,}: {r['compress']['budget']:,} B, pick {r['compress']['pick']}, test MRR "
             f"{r['compress']['test_mrr'] or 0:.4f} on {r['compress']['test_triples'] or 'all the'} test triples" for r in rows if r.get("compress")]
    return (f"# Memory at scale: the RotatE path by graph size\n\nPeak RSS (each stage's own process, loading the "
            f"data included) and wall seconds; RotatE d{args.dim}, one thread. A draw shows only where this run "
            "made the graph.\n\n" + table + "\n\n"
            + ("The kernel's peak count at exit (what `time -v` prints) understates where earl restarted it between "
               "phases: " + "; ".join(low) + ".\n\n" if low else "")
            + ("Compress picks (the search's own test subset):\n" + "\n".join(picks) + "\n\n" if picks else "")
            + ("Failed (the size's later stages not run):\n" + "\n".join(failed) + "\n" if failed else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000,5000000", help="comma-separated entity counts")
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--codes", type=int, default=5, help="pq codes a row of the export")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--compress-minutes", type=float, default=0.0, help="0: no compress stage")
    parser.add_argument("--bytes-per-entity", type=int, default=8, help="the compress budget per entity")
    parser.add_argument("--data", type=Path, default=REPO / "data")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "runs" / "memory_scale")
    parser.add_argument("--name", default="memory_scale")
    parser.add_argument("--quick", action="store_true", help="20,000 entities, 30 steps, a 1-minute compress")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.steps, args.compress_minutes, args.name = "20000", 30, 1.0, args.name + "_quick"
    rows: list[dict] = []
    for n in args.sizes.split(","):  # the results are written after each size: a later one may run for hours
        rows.append(one_size(int(n), args, args.work))
        md = markdown(rows, args)
        write_results(args.name, {"rows": rows, "settings": {k: str(v) for k, v in vars(args).items()}}, md)
    print(md)


if __name__ == "__main__":
    main()
