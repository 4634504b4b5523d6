"""Where a training step's time goes on one GPU: synced step times per number type, and the profiler's top ops.

For EARL at the paper's FB15k-237 settings and RotatE dim 500 (batch 1024 x 256 negatives), in one process:
1. each of fp32, tf32 (TF32 matmuls) and bf16 (autocast) trains `--steps` steps after `--warmup` steps, timed
   between two `torch.cuda.synchronize()` (the median of a per-step time would only time the launches);
2. `--profile-steps` fp32 steps under torch.profiler: the ops by GPU time and by CPU time, and kernel launches
   per step (each launch costs the host microseconds the card may wait for);
3. a few steps under `torch.cuda.set_sync_debug_mode("warn")`: each distinct place a step waits on the card (a
   host sync), with the Python stack that asked for it;
4. with `--graph`, the step as `earl train --cuda-graphs` takes it: captured once in a CUDA graph and replayed
   (earl_service/train/graphed.py);
5. with `--compile`, the same step with the model under `torch.compile` (compile time and s/step).

    python bench/cuda_profile.py                 # on the GPU machine, ~1 minute (make cuda-check runs it)
    python bench/cuda_profile.py --device cpu --dataset codex-s --steps 3 --warmup 1 --profile-steps 2

Writes bench/results/cuda_profile.{json,md} (runs/ for a CPU smoke run) and the profiler's tables as text.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, add_datasets_argument, md_table, write_results

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.train.distributed import Ranks
from earl_service.train.graphed import WARMUP_STEPS, GraphedStep
from earl_service.train.loop import Learner, eager_step, step_on_batch, train_step
from earl_service.train.run import Run
from earl_service.train.schedule import build_optimizer
from earl_service.train.state import TrainState

MODELS = {"EARL d150 (paper)": ModelConfig(model="earl", dim=150), "RotatE d500": ModelConfig(model="rotate", dim=500)}
COMPUTES = ("fp32", "tf32", "bf16")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allow_tf32(allowed: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed


def learner_for(ds, model: ModelConfig, compute: str, device: torch.device) -> tuple[Learner, TrainState]:
    allow_tf32(compute == "tf32")
    cfg = TrainConfig(device=str(device), compute="bf16" if compute == "bf16" else "fp32", eval_every=0)
    torch.manual_seed(cfg.seed)
    run = Run.build(ds, model, device)
    learner = Learner.build(run, build_optimizer(run.model, cfg), cfg, ranks=Ranks(), device=device)
    return learner, TrainState.start(cfg.seed, device)


def timed_steps(learner: Learner, state: TrainState, warmup: int, steps: int) -> dict:
    """Seconds per step over `steps` steps after `warmup`, between two syncs; the last loss read once."""
    for _ in range(warmup):
        train_step(learner, state)
    _sync(learner.device)
    started = time.perf_counter()
    for _ in range(steps):
        loss = train_step(learner, state)
    _sync(learner.device)
    seconds = (time.perf_counter() - started) / steps
    return {"ms_per_step": seconds * 1000, "triples_per_second": learner.cfg.batch_size / seconds,
            "last_loss": float(loss)}


def profile_tables(learner: Learner, state: TrainState, steps: int, out: Path, label: str) -> dict:
    """`steps` steps under torch.profiler: its tables written to `out`, the launches per step returned."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if learner.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            train_step(learner, state)
        _sync(learner.device)
    averages = prof.key_averages()
    gpu_key = "cuda_time_total" if learner.device.type == "cuda" else "cpu_time_total"
    out.write_text(f"# {label}: {steps} steps\n\n## by GPU time\n{averages.table(sort_by=gpu_key, row_limit=40)}\n\n"
                   f"## by CPU self time\n{averages.table(sort_by='self_cpu_time_total', row_limit=40)}\n")
    launches = sum(e.count for e in averages if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    return {"kernel_launches_per_step": launches / steps, "table": out.name}


def sync_points(learner: Learner, state: TrainState, steps: int) -> list[dict]:
    """The host syncs `steps` steps make, each distinct call site once with its count and stack (CUDA only)."""
    if learner.device.type != "cuda":
        return []
    found: dict[str, dict] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        if "prototype feature" in str(message):  # set_sync_debug_mode's own notice, not a sync
            return
        stack = [f for f in traceback.format_stack()[:-1] if "warnings.py" not in f]
        key = "".join(stack[-6:])
        found.setdefault(key, {"message": str(message)[:200], "stack": stack[-12:], "count": 0})["count"] += 1

    state.epoch_pos = len(learner.triples)  # the first step draws a new epoch's order: that path is checked too
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():  # restores warnings.showwarning on the way out
            warnings.simplefilter("always")
            warnings.showwarning = record
            for _ in range(steps):
                train_step(learner, state)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return list(found.values())


def graphed_steps(ds, model: ModelConfig, device: torch.device, warmup: int, steps: int) -> dict:
    """The fp32 step as `--cuda-graphs` runs it (train/graphed.py: warm-up, capture, replays), between two syncs."""
    learner, state = learner_for(ds, model, "fp32", device)
    learner.graphed = GraphedStep(learner, eager_step, step_on_batch)
    try:
        return timed_steps(learner, state, max(warmup, WARMUP_STEPS + 2), steps)
    except Exception as exc:  # a report of what failed is the result here
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def compiled_steps(ds, model: ModelConfig, device: torch.device, warmup: int, steps: int) -> dict:
    """The fp32 step with the model under torch.compile: compile seconds (the warm-up) and s/step."""
    learner, state = learner_for(ds, model, "fp32", device)
    learner.net = torch.compile(learner.net)
    started = time.perf_counter()
    try:
        result = timed_steps(learner, state, warmup, steps)
    except Exception as exc:  # a report of what failed is the result here
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    result["compile_and_run_seconds"] = round(time.perf_counter() - started, 1)
    return result


def markdown(result: dict) -> str:
    md = [f"# Training step on {result['device_name']}", "", f"torch {result['torch']}; data {result['data']}; "
          f"{result['steps']} synced steps after {result['warmup']} warm-up steps.", "",
          md_table(["model", "compute", "ms/step", "positive triples/s", "last loss"],
                   [[r["model"], r["compute"], r.get("ms_per_step"), r.get("triples_per_second"), r.get("last_loss")]
                    for r in result["rows"]])]
    md += ["", md_table(["model", "kernel launches per step", "profiler tables"],
                        [[p["model"], p["kernel_launches_per_step"], p["table"]] for p in result["profiles"]])]
    md += ["", f"Host syncs in 3 steps (set_sync_debug_mode warn): {len(result.get('sync_points', []))} call sites."]
    for point in result.get("sync_points", []):
        md += ["", f"- {point['model']}, {point['count']}x: {point['message']}", "```", *point["stack"][-6:], "```"]
    for c in result.get("graphed", []):
        md += ["", f"CUDA graph replay, {c['model']}: {c}"]
    for c in result.get("compiled", []):
        md += ["", f"torch.compile, {c['model']}: {c}"]
    return "\n".join(md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--dataset", default="fb15k-237")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--graph", action="store_true", help="also time the step replayed from a CUDA graph")
    parser.add_argument("--compile", action="store_true", help="also time the step under torch.compile")
    args = parser.parse_args()
    device = torch.device(args.device)
    data = args.datasets / args.dataset
    ds = load_dataset(data)
    smoke = device.type != "cuda"
    folder = REPO / ("runs" if smoke else "bench/results")
    folder.mkdir(exist_ok=True)
    result: dict = {"device_name": torch.cuda.get_device_name(device) if not smoke else "cpu", "torch": torch.__version__,
                    "data": str(data), "steps": args.steps, "warmup": args.warmup, "rows": [], "profiles": []}
    for label, model in MODELS.items():
        for compute in COMPUTES:
            learner, state = learner_for(ds, model, compute, device)
            result["rows"].append({"model": label, "compute": compute, **timed_steps(learner, state, args.warmup,
                                                                                      args.steps)})
            print(result["rows"][-1], flush=True)
        learner, state = learner_for(ds, model, "fp32", device)
        timed_steps(learner, state, args.warmup, 1)
        table = folder / f"cuda_profile_{model.model}.txt"
        result["profiles"].append({"model": label, **profile_tables(learner, state, args.profile_steps, table, label)})
        result["sync_points"] = result.get("sync_points", []) + [
            {"model": label, **point} for point in sync_points(learner, state, 3)]
    allow_tf32(False)
    written = folder if smoke else None  # write_results' own folder (bench/results) for a GPU run
    _, md_path = write_results("cuda_profile", result, markdown(result), folder=written)
    # Each longer part below writes the results again: one that outlasts the caller's timeout leaves the rest.
    if args.graph and not smoke:
        result["graphed"] = [{"model": label, **graphed_steps(ds, model, device, args.warmup, args.steps)}
                             for label, model in MODELS.items()]
        _, md_path = write_results("cuda_profile", result, markdown(result), folder=written)
    if args.compile:
        result["compiled"] = [{"model": label, **compiled_steps(ds, model, device, args.warmup, args.steps)}
                              for label, model in MODELS.items()]
        _, md_path = write_results("cuda_profile", result, markdown(result), folder=written)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
