"""`earl predict` as a whole process, first call against later ones: the device reader's table cache (device/cache.py).

    python bench/device_predict.py [--bundle FILE] [--data fb15k-237] [--repeats 7] [--queries 1000]
    # writes bench/results/device_predict.{json,md}

Without --bundle it first trains a tiny EARL bundle (`earl train DATA --model earl --steps 50`, ~1 min): what a
load costs depends on the graph and the dim, not on how well the weights were trained. Each figure is the wall
clock of one `python -m earl_service.cli.main predict ...` process (interpreter start, imports, load, answer,
print) and its own peak RSS (ru_maxrss, through a small launcher), the median of several: without the cache (every call rebuilds), the
first call into an empty cache (rebuild, then write the entry), and later calls (the entry mapped back); then
--queries with N queries drawn from the bundle's own graph, both directions. "numpy only" rows block scipy, as on
a device without the `edge` extra. `python -c "import numpy"` is the floor any call pays. Modules run from their
.pyc, as in an installed package (PYTHONDONTWRITEBYTECODE is dropped for the child processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, LoadWatch, add_datasets_argument, md_table, write_results

from earl_service.device import reader
from earl_service.device.cache import CacheConfig, TableCache, bundle_key

NUMPY_ONLY = ("import sys; sys.modules['scipy'] = None\n"
              "from earl_service.cli.main import main\n"
              "sys.exit(main(sys.argv[1:]))")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(REPO)}  # this checkout, whatever the venv has installed


# A child's peak RSS from wait4 counts its parent's at the fork (this bench holds a model and numpy): a small
# launcher forks the measured process instead, and writes its wall time and its own peak RSS (KiB) to argv[1].
LAUNCHER = ("import os, sys, time\nt0 = time.perf_counter()\npid = os.fork()\n"
            "if pid == 0:\n    os.execv(sys.argv[2], sys.argv[2:])\n"
            "_, status, usage = os.wait4(pid, 0)\n"
            "open(sys.argv[1], 'w').write(f'{time.perf_counter() - t0} {usage.ru_maxrss}')\n"
            "sys.exit(os.waitstatus_to_exitcode(status))")


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one process; raises with its stderr if it fails."""
    with tempfile.NamedTemporaryFile() as figures:
        done = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, figures.name, *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr[-2000:]}")
        wall, rss_kib = Path(figures.name).read_text().split()
    return float(wall), int(rss_kib) / 1024, done.stdout


def measure(label: str, argv: list[str], repeats: int, *, before=None) -> dict:
    """Median and spread of `repeats` runs of argv (`before()` runs ahead of each, untimed)."""
    walls, rss, outputs = [], [], []
    for _ in range(repeats):
        if before is not None:
            before()
        wall, peak, out = run_once(argv, child_env())
        walls.append(wall)
        rss.append(peak)
        outputs.append(out)
    print(f"{label}: median {statistics.median(walls):.3f} s over {repeats}", flush=True)
    return {"label": label, "runs": repeats, "median_s": round(statistics.median(walls), 4),
            "min_s": round(min(walls), 4), "max_s": round(max(walls), 4),
            "peak_rss_mib": round(statistics.median(rss), 1), "output": outputs[-1]}


def train_bundle(data: Path, out: Path) -> Path:
    """A tiny EARL bundle of `data` (50 steps, default dim), trained in a child process."""
    argv = [sys.executable, "-m", "earl_service.cli.main", "train", str(data), "--model", "earl", "--steps", "50",
            "--out", str(out), "--no-final-eval", "--eval-every", "0", "--no-progress", "--threads", "1"]
    subprocess.run(argv, cwd=REPO, env=child_env(), check=True, stdout=subprocess.DEVNULL)
    return out / "bundle.safetensors"


def write_queries(model, path: Path, count: int) -> tuple[str, str]:
    """`count` queries from the graph's own triples (tails of even ones, heads of odd ones); the first's head and
    relation, for the single-query rows."""
    rng = np.random.default_rng(0)
    picks = model.triples[rng.choice(len(model.triples), size=count, replace=False)]
    names, relations = model.entities.names, model.relations.names
    lines = [f"{names[h]}\t{relations[r]}" if i % 2 == 0 else f"?\t{relations[r]}\t{names[t]}"
             for i, (h, r, t) in enumerate(picks)]
    path.write_text("\n".join(lines) + "\n")
    h, r, _ = picks[0]
    return names[h], relations[r]


def in_process(bundle: Path, cache_dir: Path, head: str, relation: str, repeats: int) -> dict:
    """Medians (ms) of a hit's steps inside one process: the key (header read and hash), the entry's checks and
    mapping, one answer."""
    cache = TableCache(CacheConfig(cache_dir))
    cache.load(bundle)
    steps: dict[str, list[float]] = {"key_ms": [], "entry_ms": [], "answer_ms": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        key = bundle_key(bundle)
        t1 = time.perf_counter()
        model = cache.get(key) if key is not None else None
        t2 = time.perf_counter()
        assert model is not None
        model.answer(relation, head=head, k=10)
        t3 = time.perf_counter()
        for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            steps[name].append(seconds * 1e3)
    entry = cache.entries()[0]
    return {**{k: round(statistics.median(v), 2) for k, v in steps.items()}, "entry_bytes": entry[2]}


def scenarios(bundle: Path, cache_dir: Path, queries: Path, head: str, relation: str, args) -> list[dict]:
    """Every measured row, in the table's order."""
    python = [sys.executable]
    edge, numpy_only = [*python, "-m", "earl_service.cli.main"], [*python, "-c", NUMPY_ONLY]
    one = ["predict", str(bundle), "--head", head, "--relation", relation, "--cache-dir", str(cache_dir)]
    many = ["predict", str(bundle), "--queries", str(queries), "--json", "--cache-dir", str(cache_dir)]

    def empty() -> None:
        shutil.rmtree(cache_dir, ignore_errors=True)

    misses = max(2, args.repeats // 2)
    rows = [measure("python -c pass", [*python, "-c", "pass"], args.repeats),
            measure("python -c 'import numpy'", [*python, "-c", "import numpy"], args.repeats),
            measure("predict, no cache", [*edge, *one, "--no-cache"], misses),
            measure("predict, first call (empty cache)", [*edge, *one], misses, before=empty),
            measure("predict, later call", [*edge, *one], args.repeats),
            measure("predict, numpy only, no cache", [*numpy_only, *one, "--no-cache"], 2),
            measure("predict, numpy only, first call", [*numpy_only, *one], 2, before=empty),
            measure("predict, numpy only, later call", [*numpy_only, *one], args.repeats),
            measure(f"--queries {args.queries}, first call", [*edge, *many], 2, before=empty),
            measure(f"--queries {args.queries}, later call", [*edge, *many], 3)]
    # Each cached answer is its rebuild's, to the printed digit (scipy's sums and numpy's agree within rounding only).
    for uncached, first, later in ((2, 3, 4), (5, 6, 7)):
        assert rows[uncached]["output"] == rows[first]["output"] == rows[later]["output"], rows[later]["label"]
    assert rows[8]["output"] == rows[9]["output"] and len(rows[9]["output"].splitlines()) == args.queries
    return rows


def markdown(rows: list[dict], breakdown: dict, meta: dict, watch: dict) -> str:
    def ms(seconds: float) -> float | int:
        return round(seconds * 1e3) if seconds >= 0.1 else round(seconds * 1e3, 1)

    table = [[r["label"], r["runs"], ms(r["median_s"]), ms(r["min_s"]), ms(r["max_s"]), r["peak_rss_mib"]]
             for r in rows]
    per_query = (rows[-1]["median_s"] - rows[4]["median_s"]) / (meta["queries"] - 1) * 1e3  # beyond the first
    return "\n".join([
        f"# `earl predict` on {meta['data']}: first call against later ones (the device reader's table cache)", "",
        f"Bundle: {meta['bundle_bytes']:,} bytes, {meta['entities']:,} entities, dim {meta['dim']}; cache entry "
        f"{breakdown['entry_bytes']:,} bytes. Wall clock of the whole process (start, imports, load, answer, print),"
        " ms:", "",
        md_table(["call", "runs", "median ms", "min ms", "max ms", "peak RSS MiB"], table), "",
        f"A later call inside one process (median ms): key (header read + SHA-256) {breakdown['key_ms']}, entry "
        f"checks (size + CRC-32 of every file) and mapping {breakdown['entry_ms']}, one top-10 answer (exact scan of "
        f"every entity) {breakdown['answer_ms']}. `--queries`: {per_query:.2f} ms per query beyond the first (the later "
        "call of --queries against the single later call).", "",
        "Every cached output was checked equal to the rebuild's. Load while measuring: 1-minute load average "
        f"{watch['load_average_1min']['start']} -> {watch['load_average_1min']['end']}, CPU steal "
        f"{watch['cpu_steal_share']}."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=None, help="an EARL bundle (default: train a tiny one)")
    parser.add_argument("--data", default="fb15k-237", help="dataset to train the tiny bundle on")
    parser.add_argument("--repeats", type=int, default=7, help="runs per later-call row (misses run half as often)")
    parser.add_argument("--queries", type=int, default=1000)
    add_datasets_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="device_predict_") as tmp:
        work = Path(tmp)
        bundle = args.bundle or train_bundle(args.datasets / args.data, work / "run")
        model = reader.load(bundle)
        head, relation = write_queries(model, work / "queries.tsv", args.queries)
        meta = {"data": args.data if args.bundle is None else str(args.bundle), "bundle_bytes": bundle.stat().st_size,
                "entities": len(model.entities), "dim": model.dim, "queries": args.queries}
        watch = LoadWatch()
        rows = scenarios(bundle, work / "cache", work / "queries.tsv", head, relation, args)
        breakdown = in_process(bundle, work / "in_process", head, relation, args.repeats)
        load = watch.summary()
    for row in rows:
        row.pop("output")
    write_results("device_predict", {**meta, "rows": rows, "in_process": breakdown, "load": load},
                  markdown(rows, breakdown, meta, load))


if __name__ == "__main__":
    main()
