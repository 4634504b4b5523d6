"""Does bfloat16 autocast cost MRR? Same data, seed and steps in float32 and with --bf16; test MRR and s/step.

    python bench/bf16.py                          # CoDEx-S, dim 100, 2000 steps each
    python bench/bf16.py --dataset fb15k-237 --dim 150 --steps 1500
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import load_dataset
from earl_service.train.loop import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--dataset", default="codex-s")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    ds = load_dataset(args.datasets / args.dataset)
    rows, results = [], []
    for seed in args.seeds:
        for bf16 in (False, True):
            with tempfile.TemporaryDirectory() as out:
                m = train(ds, ModelConfig(dim=args.dim, seed=seed),
                          TrainConfig(steps=args.steps, eval_every=args.eval_every, compute="bf16" if bf16 else "fp32", seed=seed, threads=2,
                                      progress=False), out)
            r = {"seed": seed, "bf16": bf16, "test": m["test"], "median_step_seconds": m["median_step_seconds"],
                 "best_step": m["best_step"]}
            results.append(r)
            rows.append([seed, "bf16 autocast" if bf16 else "float32", m["test"]["mrr"], m["test"]["hits_at_10"],
                         m["median_step_seconds"], m["best_step"]])
    md = "\n".join([f"# float32 vs bfloat16 autocast ({args.dataset}, dim {args.dim}, {args.steps} steps)", "",
                    md_table(["seed", "precision", "test MRR", "test Hits@10", "median s/step", "best step"], rows)])
    write_results(f"bf16_{args.dataset}", {"results": results, "dataset": args.dataset, "dim": args.dim,
                                           "steps": args.steps}, md)
    print(md)


if __name__ == "__main__":
    main()
