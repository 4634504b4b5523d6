"""Where one EARL training step's time goes on this CPU: phases and operators, fp32 against bf16 autocast.

The step `earl train` takes (earl_service.train.loop.train_step) cut into its phases, each timed with the clock around
it (CPU work is synchronous): negative sampling, the full-graph encoder's forward, the loss (gathers, RotatE
distances, self-adversarial weights), backward, and the optimizer. Then torch's profiler over the same steps lists
the operators by self time. Paper settings (batch 1024, 256 negatives per side), 2 threads (`--threads`), median
of the timed steps after 3 warm-up steps. What a faster step has to cut is what this table shows.

    python bench/step_profile.py                  # FB15k-237, EARL dim 150
    python bench/step_profile.py --data wn18rr    # EARL dim 200
    python bench/step_profile.py --tag amx        # results file suffixed _amx (a second machine's run)
    python bench/step_profile.py --compile        # also both precisions with the encoder under torch.compile

`--compile` wraps the encoder (the module whose forward rebuilds every entity) in `torch.compile` (inductor, the
default mode); the C++ sparse kernels are opaque to it, so it can fuse only the dense and elementwise work around
them. Its warm-up steps include the compilation, reported apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results
from speed import DATASETS

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.train.distributed import Ranks
from earl_service.train.loop import Learner
from earl_service.train.loss import loss_fn
from earl_service.train.run import Run
from earl_service.train.schedule import build_optimizer
from earl_service.train.state import TrainState

DIMS = {**DATASETS, "codex-s": 100}  # speed.py's paper dims, and the demo's for CoDEx-S
PHASES = ("sample", "encoder forward", "loss", "backward", "optimizer")
WARMUP = 3


def phase_step(learner: Learner, state: TrainState) -> dict[str, float]:
    """One step of train_step's full-graph path, with the seconds of each phase."""
    cfg, run = learner.cfg, learner.run
    times, t = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name], t = now - t, now

    batch = learner.triples[state.next_rows(len(learner.triples), cfg.batch_size)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=learner.autocast):
        neg = learner.sampler.sample(batch[:, 0], batch[:, 1], batch[:, 2], cfg.negatives, state.rng)
        lap("sample")
        entities, relations = learner.net(run.graph)
        lap("encoder forward")
        loss = loss_fn(run.scorer, entities.float(), relations.float(), batch, neg.heads, neg.tails,
                       cfg.adversarial_temperature, ignore=neg.known)
        lap("loss")
    learner.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    lap("backward")
    learner.optimizer.step()
    state.step += 1
    lap("optimizer")
    return times


def profile(data: Path, dim: int, compute: str, steps: int, threads: int, compiled: bool = False) -> dict:
    torch.manual_seed(0)
    ds = load_dataset(data)
    cfg = TrainConfig(compute=compute, threads=threads, device="cpu")
    run = Run.build(ds, ModelConfig(dim=dim), torch.device("cpu"))
    learner = Learner.build(run, build_optimizer(run.model, cfg), cfg, ranks=Ranks.current(torch.device("cpu")),
                            device=torch.device("cpu"))
    if compiled:
        learner.net = torch.compile(learner.net)
    state = TrainState.start(cfg.seed)
    run.model.train()
    laps = [phase_step(learner, state) for _ in range(WARMUP + steps)]
    warmup_seconds = sum(sum(lap.values()) for lap in laps[:WARMUP])
    laps = laps[WARMUP:]
    phases = {p: statistics.median(lap[p] for lap in laps) for p in PHASES}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            phase_step(learner, state)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops) or 1.0
    top = [{"op": e.key, "calls_per_step": e.count / steps, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "share": e.self_cpu_time_total / total} for e in ops[:15]]
    label = compute + (" compiled" if compiled else "")
    return {"compute": label, "autocast": learner.autocast, "compiled": compiled,
            "median_step_seconds": sum(phases.values()), "warmup_seconds": warmup_seconds, "phases": phases,
            "top_ops": top}


def markdown(results: list[dict], data: str, dim: int, threads: int) -> str:
    phase_rows = [[p, *(f"{r['phases'][p]:.4f}" for r in results)] for p in PHASES]
    phase_rows.append(["step (sum)", *(f"{r['median_step_seconds']:.4f}" for r in results)])
    phase_rows.append([f"{WARMUP} warm-up steps (compilation included)",
                       *(f"{r['warmup_seconds']:.1f}" for r in results)])
    text = (f"# Where an EARL step's time goes: {data}, dim {dim}, paper settings, {threads} threads\n\n"
            "Median seconds per phase (clock around each phase of train_step's full-graph path):\n\n"
            + md_table(["phase", *(r["compute"] for r in results)], phase_rows) + "\n")
    for r in results:
        text += (f"\nOperators by self time, {r['compute']} (torch profiler; per step):\n\n"
                 + md_table(["op", "calls", "self ms", "share"],
                            [[o["op"], f"{o['calls_per_step']:g}", f"{o['self_ms_per_step']:.1f}",
                              f"{o['share']:.1%}"] for o in r["top_ops"]]) + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--data", choices=sorted(DIMS), default="fb15k-237")
    parser.add_argument("--steps", type=int, default=5, help="steps timed and profiled per setting")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="suffix of the results file (a second machine's run)")
    parser.add_argument("--compile", action="store_true", help="also time the encoder under torch.compile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dim = DIMS[args.data]
    results = []
    settings = [(compiled, compute) for compiled in (False, True)[:1 + args.compile] for compute in ("fp32", "bf16")]
    for compiled, compute in settings:
        results.append(profile(args.datasets / args.data, dim, compute, args.steps, args.threads, compiled))
        print(results[-1]["compute"], {k: round(v, 4) for k, v in results[-1]["phases"].items()}, flush=True)
    name = f"step_profile_{args.data}" + (f"_{args.tag}" if args.tag else "")
    write_results(name, {"data": args.data, "dim": dim, "threads": args.threads, "steps": args.steps, "results": results},
                  markdown(results, args.data, dim, args.threads))


if __name__ == "__main__":
    main()
