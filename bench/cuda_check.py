"""The one prepared device check (`make cuda-check`): every CUDA path's test, the step speed and a short compress
on one GPU, in about 8 minutes, written to bench/results/cuda_check.{json,md} with the GPU, torch and driver.

1. `pytest tests/earl_service/test_cuda.py` (each CUDA path against the CPU result), counts and failures kept;
2. step time of EARL at the paper's FB15k-237 settings and of RotatE dim 500, batch 1024 x 256 negatives
   (`earl train --steps N --eval-every 0`), with positive triples per second and the GPU's utilisation sampled
   by nvidia-smi every 0.2 s while each runs;
3. `earl compress DATA --max-bytes 2MB --time-limit MINUTES --device cuda` with the default precisions (pq
   included), its pick, test MRR and where the minutes went; then the same with `--parallel 4` (candidates at
   once on the card: its utilisation beside the first's).

    python bench/cuda_check.py                          # on the GPU machine, ~8 minutes
    python bench/cuda_check.py --device cpu --quick     # here: the script itself on CoDEx-S (runs/cuda_check.md)

A lent GPU machine has no package index and no ../shared: `make cuda-wheels` (here) fills .cuda-wheels/ with
what its Python lacks, and `--datasets` points at a copy carried beside the checkout (docs/scaling.md#gpus).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, RESULTS, add_datasets_argument, md_table, write_results

EARL_PAPER = ["--dim", "150", "--recipe", "paper"]  # the paper's FB15k-237 settings: batch 1024 x 256
ROTATE_500 = ["--model", "rotate", "--dim", "500", "--batch-size", "1024", "--negatives", "256", "--recipe", "paper"]
STEP_RUNS = [("EARL, paper settings", EARL_PAPER), ("RotatE dim 500, 1024 x 256", ROTATE_500)]
GRAPHED = ["--cuda-graphs"]  # the step replayed from a CUDA graph (train/graphed.py); refused on a CPU


class Utilisation:
    """nvidia-smi's GPU utilisation, sampled every `every` seconds while the block runs (empty without a GPU)."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.samples, self._stop = every, [], threading.Event()
        self.times: list[float] = []
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            out = _nvidia_smi("utilization.gpu")
            if out and out[0].isdigit():
                self.samples.append(float(out[0]))
                self.times.append(time.time())
            self._stop.wait(self.every)

    def __enter__(self) -> Utilisation:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self, steps: tuple[float, float] | None = None) -> dict:
        """Over the whole process, and while the steps ran (`steps`: the run's first and last step in Unix seconds,
        metrics.json's steps_wall_clock): loading the graph, starting CUDA, a graph's capture before the clock and
        the run's final save leave the card idle for seconds that a short timed run would otherwise average in."""
        s = self.samples
        if not s:
            return {"samples": 0}
        summary = {"mean": sum(s) / len(s), "max": max(s), "samples": len(s)}
        if steps is not None:
            during = [value for value, at in zip(s, self.times, strict=True) if steps[0] <= at <= steps[1]]
            if during:
                summary.update(steps_mean=sum(during) / len(during), steps_samples=len(during),
                               steps_seconds=round(steps[1] - steps[0], 1))
        return summary


def _nvidia_smi(query: str) -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def device_facts(device: str) -> dict:
    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["driver"] = (_nvidia_smi("driver_version") or ["unknown"])[0]
    return facts


CUDA_TESTS = ["tests/earl_service/test_cuda.py", "tests/earl_service/model/test_gpu_kernels.py"]


def run_tests(log: Path) -> dict:
    """The CUDA tests in a child pytest: counts, the failing test ids, and pytest's whole report in `log`."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", *CUDA_TESTS, "-o", "addopts=", "-q", "-rfEs", "--tb=short",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, check=False)
    log.write_text(proc.stdout + proc.stderr)
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    failed = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"exit_code": proc.returncode, "summary": tail[0], "failed": failed, "log": log.name,
            "seconds": round(time.perf_counter() - started, 1)}


def time_steps(data: Path, label: str, extra: list[str], steps: int, device: str) -> dict:
    """`earl train` for `steps` steps without validation: median s/step, positive triples/s, GPU utilisation."""
    with tempfile.TemporaryDirectory() as out, Utilisation() as gpu:
        cmd = [sys.executable, "-m", "earl_service.cli.main", "train", str(data), "--out", out, "--steps", str(steps),
               "--eval-every", "0", "--no-final-eval", "--no-progress", "--checkpoint-every", "0", "--device", device,
               *extra]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    step = metrics["median_step_seconds"]
    batch = metrics["config"]["train"]["batch_size"]  # as the recipe and options resolved it
    # On a GPU a step's own clock times its launches; the mean over the run (its losses read at the end) times the card.
    mean = metrics["train_seconds"] / steps
    return {"label": label, "steps": steps, "median_step_ms": step * 1000, "mean_step_ms": mean * 1000,
            "triples_per_second": batch / mean,
            "train_seconds": metrics["train_seconds"], "process_seconds": round(wall, 1),
            "device": metrics["device"], "gpu_utilisation": gpu.summary(metrics.get("steps_wall_clock"))}


def short_compress(data: Path, minutes: float, max_bytes: str, device: str, parallel: int = 1) -> dict:
    """`earl compress` with the default precisions (`parallel` candidates at once): the pick, its test metrics and
    where the time went."""
    with tempfile.TemporaryDirectory() as out, Utilisation() as gpu:
        cmd = [sys.executable, "-m", "earl_service.cli.main", "compress", str(data), "--out", out,
               "--max-bytes", max_bytes, "--time-limit", str(minutes), "--device", device, "--parallel", str(parallel)]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        report_path = Path(out) / "report.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
    pick = report.get("pick", {})
    trained = {r["candidate"]: r.get("train_seconds") or 0.0 for r in report.get("exports", [])}
    return {"training_seconds": round(sum(trained.values()), 1), "spent_seconds": report.get("spent_seconds"),
            "exit_code": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:] if proc.returncode else [],
            "wall_seconds": round(wall, 1), "limit_seconds": minutes * 60, "max_bytes": max_bytes, "parallel": parallel,
            "lane_seconds": report.get("lane_seconds", 0.0),
            "pick": {k: pick.get(k) for k in ("candidate", "model", "dim", "precision", "bytes")},
            "test": report.get("test"), "gpu_utilisation": gpu.summary()}


def _during_steps(util: dict) -> str:
    return f"{util['steps_mean']:.1f} ({util['steps_seconds']} s)" if "steps_mean" in util else "-"


def markdown(result: dict) -> str:
    facts, tests, comp = result["facts"], result["tests"], result["compress"]
    md = [f"# cuda-check: {facts.get('gpu', facts['device'])}", "",
          f"torch {facts['torch']} (CUDA {facts['cuda']}), driver {facts.get('driver', '-')}; data {result['data']}.",
          "", f"**CUDA tests** ({', '.join(CUDA_TESTS)}): {tests['summary']} (exit {tests['exit_code']}, {tests['seconds']} s)."]
    md += [f"- FAILED {name}" for name in tests["failed"]]
    md += ["", md_table(["run", "steps", "ms/step (mean)", "ms/step (median)", "positive triples/s", "GPU util mean %",
                         "GPU util mean % during the steps", "GPU util max %"],
                        [[r["label"], r["steps"], r["mean_step_ms"], r["median_step_ms"], r["triples_per_second"],
                          r["gpu_utilisation"].get("mean"), _during_steps(r["gpu_utilisation"]),
                          r["gpu_utilisation"].get("max")] for r in result["steps"]])]
    if comp is None:
        return "\n".join(md + ["", "**compress**: not run (--no-compress)."])
    for run in (comp, result.get("compress_parallel")):
        if run is not None:
            md += compress_lines(run)
    return "\n".join(md)


def compress_lines(comp: dict) -> list[str]:
    """A compress run's line: the pick, its test MRR, the seconds training and the GPU's utilisation."""
    test_mrr = (comp.get("test") or {}).get("mrr")
    spent = comp["spent_seconds"]
    lanes = f" --parallel {comp['parallel']}" if comp.get("parallel", 1) > 1 else ""
    md = ["", f"**compress** (`--max-bytes {comp['max_bytes']} --time-limit {comp['limit_seconds'] / 60:g}{lanes}`): exit "
               f"{comp['exit_code']}, {comp['wall_seconds']} s wall for a {comp['limit_seconds']:.0f} s limit; pick "
               f"{comp['pick'].get('candidate')} {comp['pick'].get('precision')} ({comp['pick'].get('bytes')} B), "
               f"test MRR {'-' if test_mrr is None else f'{test_mrr:.4f}'}; {comp['training_seconds']} s of it training "
               f"candidates (sum over candidates) of {'-' if spent is None else f'{spent:.1f}'} s the search spent; "
               f"GPU util {comp['gpu_utilisation']}."]
    return md + [f"  {line}" for line in comp["error"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--dataset", default="fb15k-237", help="the speed runs' and the compress's graph")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=2000, help="steps of each timed run")
    parser.add_argument("--compress-minutes", type=float, default=3.0)
    parser.add_argument("--max-bytes", default="2MB")
    parser.add_argument("--quick", action="store_true", help="CoDEx-S, 20 steps, a 1-minute compress (a smoke test)")
    parser.add_argument("--no-compress", action="store_true", help="tests and step speed only")
    parser.add_argument("--compress-parallel", type=int, default=4,
                        help="then the same compress with --parallel N (candidates at once on the card; 1: not run)")
    args = parser.parse_args()
    data = args.datasets / args.dataset
    if args.quick:
        data, args.steps, args.compress_minutes, args.max_bytes = REPO / "earl_service/demo_data/codex-s", 20, 1, "1MB"
    result: dict = {"facts": device_facts(args.device), "data": str(data)}
    # Only a full run on a GPU is a result; a smoke run (--quick or a CPU) stays in runs/, out of bench/results.
    smoke = args.quick or not args.device.startswith("cuda")
    folder = REPO / "runs" if smoke else RESULTS
    result["tests"] = (run_tests(folder / "cuda_check_tests.log") if args.device.startswith("cuda") else
                       {"exit_code": None, "summary": "not run (no CUDA device asked for)", "failed": [], "seconds": 0})
    runs = STEP_RUNS + ([(f"{label}, CUDA graph", extra + GRAPHED) for label, extra in STEP_RUNS]
                        if args.device.startswith("cuda") else [])
    result["steps"] = [time_steps(data, label, extra, args.steps, args.device) for label, extra in runs]
    result["compress"] = None if args.no_compress else short_compress(data, args.compress_minutes, args.max_bytes,
                                                                       args.device)
    if not args.no_compress and args.compress_parallel > 1:
        result["compress_parallel"] = short_compress(data, args.compress_minutes, args.max_bytes, args.device,
                                                     args.compress_parallel)
    _, md_path = write_results("cuda_check", result, markdown(result), folder=folder if smoke else None)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
