"""What one EARL training step costs on this CPU against batch size and negatives, and where it goes.

Every step encodes the whole graph (every entity is a candidate negative), then scores the batch. The encoder's
cost does not depend on the batch, so a larger batch buys more positives per second; how much more is what a
settings search for a fixed CPU budget (`paper.py convergence`) needs to know. For each batch size x negatives
in the grid this times `earl train` steps (its own process, 2 threads, median over the timed steps) and, once,
the full-graph encoder alone (forward + backward of every entity's embedding, no scoring). Reported: s/step,
the encoder's share of it, positives per second, and the steps and epochs that a budget of `--minutes` buys
(validation not counted).

    python bench/step_cost.py                    # FB15k-237, EARL dim 150: batch 256..4096 x 64/256 negatives
    python bench/step_cost.py --data wn18rr      # EARL dim 200
    python bench/step_cost.py --quick            # CoDEx-S dim 100, 2 batch sizes, 5 steps: a check of the path
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, pyplot, save_png, write_results
from speed import DATASETS, run_json, run_train

DIMS = {**DATASETS, "codex-s": 100}  # speed.py's paper dims, and the demo's for CoDEx-S

ENCODER = """
import json, statistics, sys, time, torch
torch.set_num_threads(2)
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset
from earl_service.train.run import Run
ds = load_dataset(sys.argv[1])
run = Run.build(ds, ModelConfig(dim=int(sys.argv[2])), torch.device("cpu"))
times = []
for _ in range(int(sys.argv[3]) + 2):  # the first two warm up allocators and thread pools
    t0 = time.perf_counter()
    entities, relations = run.model(run.graph)
    (entities.sum() + relations.sum()).backward()
    times.append(time.perf_counter() - t0)
print(json.dumps({"median_seconds": statistics.median(times[2:]), "entities": run.graph.num_entities,
                  "train_triples": len(ds.train)}))
"""


def time_encoder(data: Path, dim: int, reps: int) -> dict:
    return run_json(ENCODER, str(data), str(dim), str(reps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--data", choices=sorted(DIMS), default="fb15k-237")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    parser.add_argument("--negatives", type=int, nargs="+", default=[64, 256], help="per side")
    parser.add_argument("--steps", type=int, default=20, help="steps timed per setting")
    parser.add_argument("--minutes", type=float, default=120.0, help="the budget that steps and epochs refer to")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.data, args.batch_sizes, args.negatives, args.steps = "codex-s", [256, 1024], [64, 256], 5
    data, dim = args.datasets / args.data, DIMS[args.data]

    encoder = time_encoder(data, dim, args.steps)
    settings = []
    for negatives in args.negatives:
        for batch in args.batch_sizes:
            r = run_train(data, dim, args.steps, ["--batch-size", str(batch), "--negatives", str(negatives)])
            step = r["median_step_seconds"]
            steps = args.minutes * 60 / step
            settings.append({"batch_size": batch, "negatives_per_side": negatives, **r,
                             "encoder_share": encoder["median_seconds"] / step, "positives_per_second": batch / step,
                             "steps_in_budget": steps, "epochs_in_budget": steps * batch / encoder["train_triples"]})
            print(f"batch {batch:5d}  negatives {negatives:4d}/side  {step:.3f} s/step  {batch / step:7.0f} "
                  f"positives/s", flush=True)

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for negatives in args.negatives:
        rows = [s for s in settings if s["negatives_per_side"] == negatives]
        ax1.plot([s["batch_size"] for s in rows], [s["median_step_seconds"] for s in rows], marker="o",
                 label=f"{negatives} negatives per side")
        ax2.plot([s["batch_size"] for s in rows], [s["positives_per_second"] for s in rows], marker="o",
                 label=f"{negatives} negatives per side")
    ax1.axhline(encoder["median_seconds"], ls="--", c="grey", label="encoder alone (fwd + bwd)")
    for ax, ylabel in ((ax1, "median s/step"), (ax2, "positive triples per second")):
        ax.set(xscale="log", xlabel="batch size (positives)", ylabel=ylabel, title=f"{args.data}, EARL dim {dim}")
        ax.set_xticks(args.batch_sizes, [str(b) for b in args.batch_sizes])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    name = f"step_cost_{args.data}" + ("_quick" if args.quick else "")
    png = save_png(name, fig)

    rows = [[s["batch_size"], s["negatives_per_side"], s["median_step_seconds"], s["encoder_share"],
             s["positives_per_second"], round(s["steps_in_budget"]), s["epochs_in_budget"], s["peak_rss_mb"]]
            for s in settings]
    md = [f"# Cost of an EARL training step against batch size and negatives: {args.data}, dim {dim}", "",
          f"![step cost]({png})", "",
          (f"Full-graph encoder alone ({encoder['entities']:,} entities, forward + backward): "
           f"**{encoder['median_seconds']:.3f} s** (median of {args.steps}). Each setting: `earl train`, "
           f"{args.steps} steps timed, 2 threads, no validation."), "",
          md_table(["batch", "negatives per side", "median s/step", "encoder share", "positives/s",
                    f"steps in {args.minutes:g} min", f"epochs in {args.minutes:g} min", "peak RSS MB"], rows), "",
          ("Steps and epochs in the budget leave validation out; what they train to is `paper.py convergence`'s "
           "question (a larger batch takes fewer, costlier steps).")]
    _, mdp = write_results(name, {"dataset": args.data, "dim": dim, "steps_timed": args.steps, "encoder": encoder,
                                  "settings": settings, "budget_minutes": args.minutes}, "\n".join(md))
    print(mdp.read_text())


if __name__ == "__main__":
    main()
