"""What a RotatE entity table loses to pq codes, and three ways tried to lose less: which numbers share a code
(contiguous [re | im] subvectors, as `earl export` codes them, against complex coordinates kept together, (re_i,
im_i) side by side: the pairs order a compress search may choose), a learned rotation before coding (faiss OPQ,
decoded back through it), and codebook fine-tuning in each order (what compress does to its pq exports:
train/finetune.py, codes fixed, the default recipe's step) for more steps.

    python bench/pq_layout.py wordnet-full-noinv --dim 22 --minutes 30 --codes 11 --limit 2000   # data/ (make wordnet-full)
    python bench/pq_layout.py fb15k-237 --dim 182 --minutes 8 --codes 91,26 --limit 3000
    python bench/pq_layout.py wordnet-full-noinv --codes 11 --run RUN --fine-tune 300 --no-opq --tag TAG

One trained run each (`--run DIR` takes one trained elsewhere, e.g. a bench/compress.py --method rotate_pq run;
else `earl train DATA --model rotate --dim D --time-limit M --eval-every 0 --no-final-eval --no-labels` into
--runs/<dataset>_d<dim>_<M>min), post-hoc faiss codebooks as exports fit them (25 k-means rounds on rows drawn by
degree, fp16 centroids), valid MRR of the decoded weights on one fixed random subset of --limit triples.
Writes bench/results/pq_layout_<dataset>_d<dim>[_<tag>].{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import torch
from harness import REPO, add_datasets_argument, dataset_folder, md_table, write_results

from earl_service.bundle.codebooks import decode_table, encode_table, order_columns, pairable, row_weights
from earl_service.bundle.precision import ProductQuantized
from earl_service.cli.main import main as earl
from earl_service.config.options import train_configs_from_options
from earl_service.config.recipes import DEFAULT
from earl_service.data.dataset import load_dataset
from earl_service.train.finetune import FineTune, fine_tune
from earl_service.train.run import load_run


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options naming the trained run to code and how to validate it (this benchmark's and finetune_lr's)."""
    parser.add_argument("dataset")
    parser.add_argument("--dim", type=int, default=22)
    parser.add_argument("--minutes", type=float, default=8.0, help="training minutes of the run")
    parser.add_argument("--limit", type=int, default=2000, help="valid triples ranked (a fixed random subset; 0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=REPO / "bench" / "runs" / "pq_layout")
    parser.add_argument("--run", type=Path, default=None, help="a trained RotatE run folder to use instead")
    add_datasets_argument(parser)


def trained_run(args: argparse.Namespace) -> Path:
    """The run to code: --run, else one trained here (once; a rerun reuses it)."""
    run_dir = args.run or args.runs / f"{args.dataset}_d{args.dim}_{args.minutes:g}min"
    if not (run_dir / "best.pt").exists():
        earl(["train", str(dataset_folder(args.dataset, args.datasets)), "--out", str(run_dir), "--model", "rotate",
              "--dim", str(args.dim), "--time-limit", f"{args.minutes:g}", "--eval-every", "0", "--no-final-eval",
              "--threads", str(args.threads), "--steps", "1000000", "--no-labels"])
    return run_dir


class Coder:
    """One trained RotatE run's entity table, coded in each way and validated on one fixed subset."""

    def __init__(self, run_dir: Path, ds, limit: int) -> None:
        self.run, self.limit = load_run(run_dir, ds, device="cpu"), limit
        self.params = {k: v.detach().clone() for k, v in self.run.model.state_dict().items()}
        self.table = self.params["entities"].numpy()
        self.degree = row_weights("rotate", ds.train, ds.num_train_entities)["entities"]

    def valid(self, entities: np.ndarray, started: float | None = None, **row) -> dict:
        seconds = None if started is None else time.perf_counter() - started
        self.run.model.load_state_dict({**self.params, "entities": torch.from_numpy(np.ascontiguousarray(entities))},
                                       strict=False)
        result = self.run.evaluate("valid", limit=self.limit)
        error = float(((entities - self.table) ** 2).sum() / (self.table ** 2).sum())
        out = {**row, "mrr": result["mrr"], "standard_error": result["standard_error"]["mrr"],
               "hits_at_10": result["hits_at_10"], "triples": result["count"] // 2, "relative_error": error,
               "seconds": seconds}
        print(out, flush=True)
        return out

    def codings(self, m: int, fine_tune_steps: list[int], opq: bool = True) -> list[dict]:
        """The table at pq:`m` coded contiguously (as `earl export` codes it), in pairs order (complex pairs
        together: codebooks.ORDERS, which compress may choose), after an OPQ rotation, and in each order with its
        codebooks fine-tuned for each of `fine_tune_steps`."""
        table, width = self.table, self.table.shape[1]
        orders = ["contiguous"] + (["pairs"] if pairable(width, m) else [])
        rows, coded = [], {}
        for order in orders:
            started = time.perf_counter()
            coded[order] = encode_table(table, m, weights=self.degree, order=order)
            label = "contiguous (earl export's)" if order == "contiguous" else "complex pairs together"
            rows.append(self.valid(decode_table(*coded[order], order_columns(width, order)), started, codes=m,
                                   coding=label))
        if opq:
            import faiss

            started, rotator = time.perf_counter(), faiss.OPQMatrix(width, m)
            rotator.niter = 20
            sample = np.random.default_rng(0).choice(len(table), min(len(table), 65536), replace=False)
            rotator.train(np.ascontiguousarray(table[sample]))
            rotation = faiss.vector_to_array(rotator.A).reshape(width, width)
            rotated = decode_table(*encode_table(np.ascontiguousarray(table @ rotation.T), m, weights=self.degree))
            rows.append(self.valid(rotated @ rotation, started, codes=m, coding="OPQ rotation"))
        recipe = train_configs_from_options({"progress": False}, recipe=DEFAULT)["rotate"]
        params = {k: v.numpy() for k, v in self.params.items()}
        for steps in fine_tune_steps:
            for order in orders:
                started, given = time.perf_counter(), {"entities": order}
                tuned, _ = fine_tune(self.run, params, {"entities": coded[order]}, recipe,
                                     FineTune(steps=steps, seconds=float("inf")), given)
                stored = ProductQuantized.stored_values(params, tuned, given)["entities"]
                rows.append(self.valid(stored, started, codes=m, coding=f"{order}, codebooks fine-tuned {steps} steps"))
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_arguments(parser)
    parser.add_argument("--codes", default="11", help="pq:M code counts, comma-separated")
    parser.add_argument("--fine-tune", default="300,1000", help="codebook fine-tuning steps to try (comma-separated)")
    parser.add_argument("--no-opq", action="store_true", help="leave out the OPQ rotation (minutes on wide tables)")
    parser.add_argument("--tag", default="", help="suffix of the results files")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    run_dir = trained_run(args)
    ds = load_dataset(dataset_folder(args.dataset, args.datasets), labels=False)
    coder = Coder(run_dir, ds, args.limit)
    rows = [coder.valid(coder.table, codes=None, coding="fp32 (no codes)")]
    for m in (int(x) for x in args.codes.split(",")):
        rows += coder.codings(m, [int(x) for x in args.fine_tune.split(",") if x], opq=not args.no_opq)
    head = (f"# pq codes of a RotatE entity table: what they lose, and ways tried to lose less ({args.dataset}, "
            f"RotatE d{args.dim})\n\n"
            f"One trained run ({run_dir.name}: {ds.num_train_entities:,} entities), post-hoc faiss codebooks as "
            f"exports fit them (25 k-means rounds on rows drawn by degree, fp16 centroids), valid MRR of the decoded "
            f"weights on {rows[0]['triples']:,} triples "
            f"{'(a fixed random subset)' if args.limit else '(the whole split)'}, both directions; relative error: "
            "squared error over the table's squared norm. Complex pairs together: each code's numbers are whole "
            "complex coordinates (re_i, im_i) rather than a run of re or of im (the pairs order, codebooks.ORDERS, "
            "which compress chooses per export on validation). OPQ: faiss's learned rotation "
            "before coding, decoded back through it. Fine-tuned: compress's codebook fine-tuning (codes fixed) "
            "for that many steps; the seconds include it.\n\n")
    table_md = md_table(["pq:M", "coding", "valid MRR", "standard error", "Hits@10", "relative error", "seconds"],
                        [[r["codes"] or "-", r["coding"], r["mrr"], r["standard_error"], r["hits_at_10"],
                          r["relative_error"], r["seconds"]] for r in rows])
    _, path = write_results(f"pq_layout_{args.dataset}_d{args.dim}" + (f"_{args.tag}" if args.tag else ""), {
        "dataset": args.dataset, "dim": args.dim, "run": str(run_dir), "entities": ds.num_train_entities,
        "limit": args.limit, "rows": rows}, head + table_md)
    print(path.read_text())


if __name__ == "__main__":
    main()
