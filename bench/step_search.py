"""Training settings compared at a fixed number of steps, on whatever device is fastest (a GPU when lent).

The CPU claim of the paper tables is "best MRR in 2 hours of 2-core CPU". For a setting that does not change
what a step computes (learning rate, margin, adversarial temperature), a CPU step costs the same whatever its
value, so "best in 2 CPU hours" is "best in the number of steps 2 CPU hours buy" (~5,000 at the paper's
settings on FB15k-237, bench/results/paper_convergence_*). The same code trains step for step the same on
CUDA (tests/earl_service/test_cuda.py), so such a search can run on a GPU in minutes instead of ~2 hours per
setting here; the chosen setting is then confirmed on the CPU with `bench/paper.py`.

    python bench/step_search.py --data fb15k-237 --steps 5000 --device cuda --parallel 4
    python bench/step_search.py --quick           # CoDEx-S, 600 steps, CPU: a check of the whole path

Each setting trains in its own `earl train` process (several at once with --parallel, sharing the device),
validates every --eval-every steps on the same fixed valid subset, and the best checkpoint is tested
(filtered, realistic ranks, seen protocol). Writes bench/results/step_search_<dataset>[_<tag>].{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, pyplot, run_settings, save_png, train_process, write_results

DIMS = {"fb15k-237": 150, "wn18rr": 200, "codex-s": 100}
# One factor at a time around the paper's settings (lr 1e-3, margin 10, temperature 1); none changes a step's cost.
GRID = [
    ("paper settings", []),
    ("lr 5e-4", ["--lr", "5e-4"]),
    ("lr 2e-3", ["--lr", "2e-3"]),
    ("lr 3e-3", ["--lr", "3e-3"]),
    ("lr 5e-3", ["--lr", "5e-3"]),
    ("lr 1e-2", ["--lr", "1e-2"]),
    ("temperature 0.5", ["--temperature", "0.5"]),
    ("temperature 2", ["--temperature", "2"]),
    ("margin 6", ["--margin", "6"]),
]
# Issue 36: budget-aware schedules (warm-up, decay to 0 at the step budget) and a separate encoder rate.
_COSINE = ["--lr-schedule", "cosine", "--warmup", "0.02"]
SCHEDULES = [
    ("paper settings", []),
    ("cosine", _COSINE),
    ("cosine lr 3e-3", [*_COSINE, "--lr", "3e-3"]),
    ("cosine lr 1e-2", [*_COSINE, "--lr", "1e-2"]),
    ("linear lr 3e-3", ["--lr-schedule", "linear", "--warmup", "0.02", "--lr", "3e-3"]),
    ("cosine lr 1e-2 encoder 1e-3", [*_COSINE, "--lr", "1e-2", "--encoder-lr", "1e-3"]),
    ("cosine lr 3e-3 encoder 1e-3", [*_COSINE, "--lr", "3e-3", "--encoder-lr", "1e-3"]),
]
GRIDS = {"settings": GRID, "schedules": SCHEDULES}


def launch(label: str, extra: list[str], args: argparse.Namespace, out: Path):
    return train_process([str(args.datasets / args.data), "--dim", str(DIMS[args.data]), "--steps", str(args.steps),
                          "--batch-size", "1024", "--negatives", "256", "--eval-every", str(args.eval_every),
                          "--eval-max-triples", str(args.eval_max_triples), "--patience", "1000000",
                          "--checkpoint-every", "0", "--device", args.device, "--threads", str(args.threads),
                          "--seed", str(args.seed), "--no-progress", "--recipe", "paper", *extra], out)


def record(label: str, extra: list[str], out: Path, returncode: int, seconds: float) -> dict:
    rec = {"setting": label, "flags": extra, "returncode": returncode, "wall_seconds": seconds}
    if returncode != 0:
        return {**rec, "error": (out / "train.log").read_text()[-2000:]}
    m = json.loads((out / "metrics.json").read_text())
    h = json.loads((out / "history.json").read_text())
    return {**rec, "steps": m["steps"], "best_step": m["best_step"], "device": m["device"],
            "median_step_seconds": m["median_step_seconds"], "parameters": m["trainable_parameters"],
            "valid": m.get("valid"), "test": m.get("test"),
            "curve": {"eval_steps": h["eval_steps"], "eval_mrr": h["eval_mrr"]}}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=sorted(DIMS), default="fb15k-237")
    add_datasets_argument(parser)
    parser.add_argument("--steps", type=int, default=5000, help="steps per setting (the CPU budget's step count)")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-max-triples", type=int, default=3000)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--parallel", type=int, default=1, help="settings trained at once on the device")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per training process")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="settings",
                        help="settings: one factor at a time; schedules: budget-aware learning-rate schedules")
    parser.add_argument("--only", nargs="+", help="labels of the grid to run (default: all)")
    parser.add_argument("--cpu-step-seconds", type=float,
                        help="CPU s/step at these settings, to state each budget in CPU hours")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="")
    parser.add_argument("--work", type=Path, default=Path("runs/step_search"))
    parser.add_argument("--quick", action="store_true", help="CoDEx-S, 600 steps, validation every 100")
    parser.add_argument("--include", type=Path, nargs="+", default=[],
                        help="results JSON of earlier runs of this script (same data, steps and validation) whose "
                             "settings join this table instead of training again (a GPU lease is shorter than a grid)")
    return parser


def _included(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[dict]:
    """The finished settings of the `--include` files, refused unless they ran this data, steps and validation."""
    earlier = []
    for path in args.include:
        prev = json.loads(path.read_text())
        same = {k: prev.get(k) for k in ("dataset", "steps", "eval_every", "eval_max_triples", "seed")}
        want = {"dataset": args.data, "steps": args.steps, "eval_every": args.eval_every,
                "eval_max_triples": args.eval_max_triples, "seed": args.seed}
        if same != want:
            parser.error(f"{path}: ran {same}, this run is {want}")
        earlier += [{**r, "from": path.name, "commit": prev.get("commit")} for r in prev["runs"] if "error" not in r]
    return earlier


def _plot(name: str, args: argparse.Namespace, ok: list[dict]) -> str:
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for r in ok:
        ax.plot(r["curve"]["eval_steps"], r["curve"]["eval_mrr"], marker=".", ms=3, label=r["setting"])
    ax.set(xlabel="training step", ylabel=f"valid MRR ({args.eval_max_triples} triples, filtered)",
           title=f"{args.data}: settings at a fixed step budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    png = save_png(name, fig)

    return png


def _markdown(args: argparse.Namespace, png: str, done: list[dict], earlier: list[dict], best: dict | None) -> str:
    ok = [r for r in done if "error" not in r]
    rows = []
    for r in done:
        if "error" in r:
            rows.append([r["setting"], " ".join(r["flags"]), *[None] * 5, f"error rc {r['returncode']}"])
            continue
        curve = r["curve"]["eval_mrr"]
        rows.append([r["setting"], " ".join(r["flags"]) or "-", max(curve) if curve else None,
                     r["valid"]["mrr"], r["test"]["mrr"], r["test"]["hits_at_10"], r["best_step"],
                     f"{r['median_step_seconds'] * 1000:.0f} ms"])
    devices = sorted({r["device"] for r in ok})
    budget = f"{args.steps} steps"
    if args.cpu_step_seconds:
        hours = args.steps * args.cpu_step_seconds / 3600
        budget += f" (= {hours:.2f} h of 2-core CPU at {args.cpu_step_seconds} s/step)"
    md = [f"# Training settings at a fixed step budget: {args.data}", "",
          f"![valid MRR against step]({png})", "",
          f"EARL dim {DIMS[args.data]}, batch 1024, 256 negatives per side, {budget}; validation every "
          f"{args.eval_every} steps on {args.eval_max_triples} valid triples; best checkpoint tested (filtered, "
          f"realistic ranks, seen protocol). Device: {', '.join(devices) or 'n/a'}, {args.parallel} setting(s) "
          "at once.", "",
          md_table(["setting", "flags", "best valid MRR (subset)", "valid MRR (all)", "test MRR", "test Hits@10",
                    "best step", "median step"], rows), "",
          f"Best by validation MRR: **{best['setting'] if best else 'none'}**.", "",
          *(["Settings trained by an earlier invocation and included here: "
             + "; ".join(f"{r['setting']} ({r['from']}, commit {str(r['commit'])[:10]})" for r in earlier), ""]
            if earlier else []),
          "None of these settings changes what a step computes, so on the CPU each costs the same per step: the "
          "ordering at this step count is the ordering within the CPU time those steps take. Step times above "
          "are the device's, with the settings sharing it, not CPU figures."]
    return "\n".join(md)


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    if args.quick:
        args.data, args.steps, args.eval_every, args.eval_max_triples = "codex-s", 600, 100, 500
    earlier = _included(args, parser)
    have = {r["setting"] for r in earlier}
    grid = [g for g in GRIDS[args.grid] if (not args.only or g[0] in args.only) and g[0] not in have]
    name = f"step_search_{args.data}" + ("_schedules" if args.grid == "schedules" else "") + (
        f"_{args.tag}" if args.tag else "")
    work = args.work / name

    t0 = time.perf_counter()

    def start(label: str, extra: list[str]):
        out = work / label.replace(" ", "_")
        return out, launch(label, extra, args, out)

    done = run_settings(grid, start, record, parallel=args.parallel, done=earlier, partial=work / "partial.json")
    order = {label: i for i, (label, _) in enumerate(GRIDS[args.grid])}
    done.sort(key=lambda r: order[r["setting"]])
    ok = [r for r in done if "error" not in r]
    best = max(ok, key=lambda r: max(r["curve"]["eval_mrr"] or [-1])) if ok else None
    md = _markdown(args, _plot(name, args, ok), done, earlier, best)
    data = {"dataset": args.data, "steps": args.steps, "eval_every": args.eval_every,
            "eval_max_triples": args.eval_max_triples, "device": args.device, "parallel": args.parallel,
            "cpu_step_seconds": args.cpu_step_seconds, "seed": args.seed, "wall_seconds": time.perf_counter() - t0,
            "best_setting": best["setting"] if best else None, "runs": done}
    _, md_path = write_results(name, data, md)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
