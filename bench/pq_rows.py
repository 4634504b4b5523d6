"""Which rows pq codebooks are fit on: faiss's uniform draw against rows drawn in proportion to their entity's degree
(codebooks.row_weights, what exports use) or its square root, post-hoc codebooks of one trained RotatE run each,
valid MRR of the decoded weights on the same triples.

    python bench/pq_rows.py fb15k-237 --dim 50 --minutes 8 --codes 25,10                    # ~11 min, one core
    python bench/pq_rows.py wordnet-full-noinv --dim 16 --minutes 10 --codes 8,4            # data/ (make wordnet-full)
    python bench/pq_rows.py synthetic-1m --dim 20 --minutes 12 --codes 5 --limit 2000       # data/synthetic-1m

The run is trained with the default recipe (`earl train DATA --model rotate --dim D --time-limit M --eval-every 0
--no-final-eval --threads T --checkpoint-every 0 --no-labels`) into --runs/<dataset>_d<dim>_<M>min and reused by a
rerun (`--run DIR` takes one trained elsewhere). Writes bench/results/pq_rows_<dataset>_d<dim>.{json,md}.
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

from earl_service.bundle.codebooks import decode_table, encode_table, row_weights
from earl_service.cli.main import main as earl
from earl_service.data.dataset import load_dataset
from earl_service.train.run import load_run

DRAWS = {"uniform (faiss's draw)": None, "by degree (exports)": lambda d: d, "by sqrt(degree)": np.sqrt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=8.0, help="training minutes of the run")
    parser.add_argument("--codes", default="25,10", help="pq:M code counts, comma-separated")
    parser.add_argument("--limit", type=int, default=0, help="valid triples ranked (0: all; a fixed random subset)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=Path, default=REPO / "bench" / "runs" / "pq_rows")
    parser.add_argument("--run", type=Path, default=None, help="a trained RotatE run folder to use instead")
    add_datasets_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = dataset_folder(args.dataset, args.datasets)
    run_dir = args.run or args.runs / f"{args.dataset}_d{args.dim}_{args.minutes:g}min"
    if not (run_dir / "best.pt").exists():
        earl(["train", str(data), "--out", str(run_dir), "--model", "rotate", "--dim", str(args.dim), "--time-limit",
              f"{args.minutes:g}", "--eval-every", "0", "--no-final-eval", "--threads", str(args.threads),
              "--checkpoint-every", "0", "--no-labels"])
    ds = load_dataset(data, labels=False)
    run = load_run(run_dir, ds, device="cpu")
    params = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    table = params["entities"].numpy()
    degree = row_weights("rotate", ds.train, ds.num_train_entities)["entities"].astype(np.float64)

    def valid(entities: torch.Tensor) -> dict:
        run.model.load_state_dict({**params, "entities": entities}, strict=False)
        result = run.evaluate("valid", limit=args.limit)
        return {"mrr": result["mrr"], "standard_error": result["standard_error"]["mrr"],
                "hits_at_10": result["hits_at_10"], "triples": result["count"] // 2}

    rows = [{"codes": None, "draw": "fp32 (no codes)", **valid(params["entities"])}]
    for m in (int(x) for x in args.codes.split(",")):
        for draw, weigh in DRAWS.items():
            started = time.perf_counter()
            codes, books = encode_table(table, m, weights=None if weigh is None else weigh(degree))
            decoded = decode_table(codes, books)
            error = ((decoded - table) ** 2).sum(1)
            rows.append({"codes": m, "draw": draw, **valid(torch.from_numpy(decoded)),
                         "squared_error": float(error.mean()),
                         "squared_error_by_degree": float((error * degree).sum() / degree.sum()),
                         "seconds": time.perf_counter() - started})
            print(rows[-1], flush=True)
    head = (f"# pq codebooks: which rows k-means fits on ({args.dataset}, RotatE d{args.dim})\n\n"
            f"One trained run ({run_dir.name}: {ds.num_train_entities:,} entities), post-hoc faiss codebooks "
            f"(25 k-means rounds, fp16 centroids, every row coded), valid MRR on {rows[0]['triples']:,} triples "
            f"{'(a fixed random subset)' if args.limit else '(the whole split)'}, both directions. Squared error: "
            "a row's, averaged over rows, and weighted by degree (what the queries meet).\n\n")
    table_md = md_table(["pq:M", "rows k-means fits on", "valid MRR", "standard error", "Hits@10",
                         "squared error", "by degree"],
                        [[r["codes"] or "-", r["draw"], r["mrr"], r["standard_error"], r["hits_at_10"],
                          r.get("squared_error"), r.get("squared_error_by_degree")] for r in rows])
    _, path = write_results(f"pq_rows_{args.dataset}_d{args.dim}", {
        "dataset": args.dataset, "dim": args.dim, "run": str(run_dir), "entities": ds.num_train_entities,
        "limit": args.limit, "rows": rows}, head + table_md)
    print(path.read_text())


if __name__ == "__main__":
    main()
