"""EARL on a CUDA GPU at the paper's settings: fp32 and bf16 autocast, step time and test MRR at early stopping.

First each precision's step is timed alone (`earl train --device cuda`, `--time-steps` steps, no validation);
then both train side by side on the same GPU (each its own process, `--minutes` of wall clock, validation every
`--eval-every` steps, early stopping after `--patience` validations without a better MRR), and each is tested
(seen protocol) from its best checkpoint. Side by side they share the GPU, so their own s/step is not a clean
figure: the first table's is.

    python bench/cuda_run.py                               # FB15k-237, EARL dim 150, 5 minutes each
    python bench/cuda_run.py --dataset wn18rr --dim 200 --minutes 8
    python bench/cuda_run.py --computes fp32 --time-steps 0 --minutes 8 --eval-every 100 --patience 20 \
        --tag paper-es                                     # fp32 alone to the paper's early stopping

With `--time-steps 0` the timing runs are skipped; a precision trained alone then has a clean s/step of its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, add_datasets_argument, md_table, pyplot, save_png, write_results
from speed import run_train

COMPUTES = ("fp32", "bf16")


def train_command(data: Path, out: Path, dim: int, compute: str, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "earl_service.cli.main", "train", str(data), "--out", str(out), "--dim", str(dim),
            "--device", args.device, "--compute", compute, "--time-limit", str(args.minutes), "--eval-every",
            str(args.eval_every), "--patience", str(args.patience), "--checkpoint-every", "0", "--no-progress",
            "--recipe", "paper"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--dataset", default="fb15k-237")
    parser.add_argument("--dim", type=int, default=150)
    parser.add_argument("--minutes", type=float, default=5.0, help="wall clock of each training run")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--patience", type=int, default=6)
    parser.add_argument("--time-steps", type=int, default=60, help="steps of the timing runs")
    parser.add_argument("--computes", nargs="+", choices=COMPUTES, default=list(COMPUTES))
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script out")
    parser.add_argument("--tag", default="")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_cuda")
    return parser


def _side_by_side(data: Path, args: argparse.Namespace) -> dict[str, dict]:
    """One training run per compute, all at once on the one device; their metrics and validation curves."""
    procs = {}
    for c in args.computes:
        out = args.runs / f"{args.dataset}-{c}"
        out.mkdir(parents=True, exist_ok=True)
        log = (out / "train.log").open("w")
        procs[c] = (out, subprocess.Popen(train_command(data, out, args.dim, c, args), stdout=log, stderr=log))
    runs = {}
    for c, (out, proc) in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"{c} run failed: see {out / 'train.log'}")
        metrics, history = (json.loads((out / f).read_text()) for f in ("metrics.json", "history.json"))
        runs[c] = {"steps": metrics["steps"], "stopped": metrics["stopped"], "best_step": metrics["best_step"],
                   "train_seconds": metrics["train_seconds"], "median_step_seconds": metrics["median_step_seconds"],
                   "test": metrics["test"], "valid": metrics.get("valid"),
                   "curve": {"steps": history["eval_steps"], "seconds": history["eval_seconds"],
                             "mrr": history["eval_mrr"]}}
        print(f"{c}: {metrics['steps']} steps, stopped by {metrics['stopped']}, best step {metrics['best_step']}, "
              f"test MRR {metrics['test']['mrr']:.4f}", flush=True)
    return runs


def _plot(runs: dict[str, dict], args: argparse.Namespace, name: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, r in runs.items():
        ax.plot(r["curve"]["steps"], r["curve"]["mrr"], marker=".", label=f"{c} (test {r['test']['mrr']:.4f})")
    ax.set(xlabel="step", ylabel="valid MRR",
           title=f"{args.dataset}, EARL dim {args.dim}, {args.device.upper()}, paper settings")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_png(name, fig)


def _markdown(alone: dict[str, dict], runs: dict[str, dict], args: argparse.Namespace, png: str) -> list[str]:
    md = [f"# EARL on {args.device.upper()}, paper settings: {args.dataset}, dim {args.dim}", "",
          f"![valid MRR]({png})", ""]
    if alone:
        first = next(iter(alone))
        base = alone[first]["median_step_seconds"]
        md += [f"Step time alone (`earl train --device {args.device}`, median of {args.time_steps} steps, no "
               "validation):", "",
               md_table(["compute", "ms/step", f"speed-up vs {first}"],
                        [[c, r["median_step_seconds"] * 1000, base / r["median_step_seconds"]]
                         for c, r in alone.items()]), ""]
    together = "side by side on the one GPU" if len(runs) > 1 else "alone on the GPU"
    md += [(f"Training {together}, {args.minutes:g} min wall clock at most, validation every {args.eval_every} "
            f"steps on the whole valid split, early stopping after {args.patience} without improvement; test from "
            "the best checkpoint (seen protocol):"), "",
           md_table(["compute", "steps", "stopped by", "best step", "train s", "median ms/step", "best valid MRR",
                     "test MRR", "test Hits@10"],
                    [[c, r["steps"], r["stopped"], r["best_step"], r["train_seconds"],
                      (r["median_step_seconds"] or float("nan")) * 1000, max(r["curve"]["mrr"], default=float("nan")),
                      r["test"]["mrr"], r["test"]["hits_at_10"]] for c, r in runs.items()])]
    return md


def main() -> None:
    args = _parser().parse_args()
    data = args.datasets / args.dataset
    timed = args.computes if args.time_steps else []
    alone = {c: run_train(data, args.dim, args.time_steps, ["--device", args.device, "--compute", c]) for c in timed}
    for c, r in alone.items():
        print(f"{c}: {r['median_step_seconds'] * 1000:.2f} ms/step alone", flush=True)
    runs = _side_by_side(data, args)
    name = f"cuda_run_{args.dataset}" + (f"_{args.tag}" if args.tag else "")
    png = _plot(runs, args, name)
    _, mdp = write_results(name, {"dataset": args.dataset, "dim": args.dim, "minutes": args.minutes,
                                  "eval_every": args.eval_every, "patience": args.patience, "alone": alone,
                                  "runs": runs}, "\n".join(_markdown(alone, runs, args, png)))
    print(mdp.read_text())


if __name__ == "__main__":
    main()
