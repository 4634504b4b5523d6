"""The rate of pq codebook fine-tuning (train/finetune.py): post-hoc codebooks of one trained RotatE entity table
against the same codebooks fine-tuned 300 steps at the recipe's rate times each --scales, and at fine_tune's own
rate (the entity table's rms times finetune.RELATIVE_LR). Adam moves a weight by about its rate a step whatever
the weight's size, and RotatE's entity values are ~0.5 at d22 but ~0.04 at d182-d220.

    python bench/finetune_lr.py codex-s --dim 220 --minutes 3 --codes 110 --limit 0
    python bench/finetune_lr.py fb15k-237 --dim 182 --minutes 8 --codes 91 --limit 3000
    python bench/finetune_lr.py wordnet-full-noinv --dim 22 --codes 11 --limit 2000 --run RUN   # data/ (make wordnet-full)

Runs as bench/pq_layout.py's (--run, else trained into --runs/<dataset>_d<dim>_<M>min), valid MRR on one fixed
random subset of --limit triples (0: all). Writes bench/results/finetune_lr_<dataset>_d<dim>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from harness import dataset_folder, md_table, write_results
from pq_layout import Coder, run_arguments, trained_run

from earl_service.bundle.codebooks import decode_table, encode_table
from earl_service.bundle.precision import ProductQuantized
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT
from earl_service.data.dataset import load_dataset
from earl_service.train import finetune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_arguments(parser)
    parser.add_argument("--codes", type=int, default=11, help="pq:M")
    parser.add_argument("--scales", default="1,0.3,0.1,0.03", help="multiples of the recipe's rate to try")
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps (compress's FINE_TUNE_STEPS)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run_dir = trained_run(args)
    coder = Coder(run_dir, load_dataset(dataset_folder(args.dataset, args.datasets), labels=False), args.limit)
    codes, books = encode_table(coder.table, args.codes, weights=coder.degree)
    recipe = train_configs_from_options({"progress": False}, recipe=DEFAULT)["rotate"]
    params = {k: v.numpy() for k, v in coder.params.items()}
    rows = [coder.valid(coder.table, rate="fp32 (no codes)"), coder.valid(decode_table(codes, books), rate="post-hoc")]
    rates = [(f"{s:g} x the recipe's {recipe.lr:g}", recipe.lr * s) for s in map(float, args.scales.split(","))]
    rates.append(("fine_tune's own (relative)", None))
    for label, lr in rates:
        started = time.perf_counter()
        tuned, budget = finetune.fine_tune(coder.run, params, {"entities": (codes, books)}, recipe,
                                           finetune.FineTune(steps=args.steps, seconds=float("inf"), lr=lr))
        used = finetune.rates({"entities": (codes, books)}, recipe)["entities"] if lr is None else lr
        stored = ProductQuantized.stored_values(params, tuned)["entities"]
        rows.append(coder.valid(stored, started, rate=label, lr=used, first_losses=budget.losses[:3],
                                last_losses=budget.losses[-3:]))
    head = (f"# pq codebook fine-tuning: its rate ({args.dataset}, RotatE d{args.dim}, pq:{args.codes})\n\n"
            f"One trained run ({run_dir.name}), post-hoc faiss codebooks as exports fit them, then {args.steps} "
            f"steps of compress's codebook fine-tuning (codes fixed) at each rate; valid MRR of the decoded weights "
            f"on {rows[0]['triples']:,} triples {'(a fixed random subset)' if args.limit else '(the whole split)'}. "
            f"The entity table's rms: {float((coder.table ** 2).mean() ** 0.5):.4g}; fine_tune's own rate is "
            f"{finetune.RELATIVE_LR:g} x the rms of the codebooks it starts from.\n\n")
    table_md = md_table(["rate", "lr", "valid MRR", "standard error", "Hits@10", "seconds"],
                        [[r["rate"], r.get("lr"), r["mrr"], r["standard_error"], r["hits_at_10"], r["seconds"]]
                         for r in rows])
    _, path = write_results(f"finetune_lr_{args.dataset}_d{args.dim}", {
        "dataset": args.dataset, "dim": args.dim, "codes": args.codes, "run": str(run_dir), "limit": args.limit,
        "rows": rows}, head + table_md)
    print(path.read_text())


if __name__ == "__main__":
    main()
