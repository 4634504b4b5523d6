"""How well compress's planning estimates a whole validation pass from two timed subsets (candidates.pass_seconds)
against the pass itself, and what each costs, for an untrained EARL and RotatE at given dims; and the estimate
calibrated as the search does after a rung's validation on EARLY_VALID_TRIPLES (state.Candidate.calibrate).

    python bench/validation_estimate.py                        # FB15k-237: EARL d136, RotatE d292 (~2 minutes)
    python bench/validation_estimate.py --dataset wn18rr --models earl:100,rotate:200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results

from earl_service.compress.costs import TIMING_BATCHES, pass_seconds
from earl_service.compress.rungs import EARLY_VALID_TRIPLES
from earl_service.compress.state import Candidate
from earl_service.config import ModelConfig
from earl_service.data import load_dataset
from earl_service.train.evaluate import ranking_batch
from earl_service.train.run import Run


def measure(run: Run, batch_size: int) -> dict:
    """The estimate and its cost, the estimate calibrated on a rung's subset, then the whole pass (the faster of
    two, after the estimate warmed it up)."""
    triples = len(run.ranked_triples("valid"))
    started = time.perf_counter()
    estimate, fixed = pass_seconds(lambda n: run.evaluate("valid", batch_size=batch_size, limit=n), triples,
                                   ranking_batch(batch_size, run.dataset.num_train_entities))
    cost = time.perf_counter() - started
    candidate = Candidate(name="timed", model=run.model_config.model, dim=run.model_config.dim, bytes={},
                          config=run.model_config, validation_seconds=estimate, validation_fixed=fixed)
    started = time.perf_counter()
    run.evaluate("valid", batch_size=batch_size, limit=EARLY_VALID_TRIPLES)
    candidate.calibrate({}, time.perf_counter() - started, min(EARLY_VALID_TRIPLES / triples, 1.0))
    calibrated = candidate.validation({})
    whole = []
    for _ in range(2):
        started = time.perf_counter()
        run.evaluate("valid", batch_size=batch_size)
        whole.append(time.perf_counter() - started)
    return {"estimate_s": estimate, "fixed_s": fixed, "estimating_s": cost, "whole_pass_s": min(whole),
            "error": estimate / min(whole) - 1, "calibrated_s": calibrated, "calibrated_error": calibrated / min(whole) - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--dataset", default="fb15k-237")
    parser.add_argument("--models", default="earl:136,rotate:292", help="model:dim, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = load_dataset(args.datasets / args.dataset)
    rows = {}
    for item in args.models.split(","):
        model, dim = item.split(":")
        run = Run.build(dataset, ModelConfig(model=model, dim=int(dim)), torch.device("cpu"))
        rows[item] = measure(run, args.batch_size)
        print(item, rows[item], flush=True)
    md = [f"# Validation pass: estimated from subsets of {TIMING_BATCHES} ranking batches vs measured, {args.dataset}", "",
          f"Untrained models, {args.threads} threads, batch {args.batch_size}, whole valid split (seen protocol).",
          f"Calibrated: the estimate scaled to one validation on {EARLY_VALID_TRIPLES} triples, as a rung's.",
          "", md_table(["model:dim", "estimate s", "of it fixed s", "whole pass s", "error", "estimating took s",
                        "calibrated s", "calibrated error"],
                       [[k, r["estimate_s"], r["fixed_s"], r["whole_pass_s"], f"{100 * r['error']:+.1f}%",
                         r["estimating_s"], r["calibrated_s"], f"{100 * r['calibrated_error']:+.1f}%"]
                        for k, r in rows.items()])]
    _, path = write_results(f"validation_estimate_{args.dataset}", {"dataset": args.dataset, "rows": rows},
                            "\n".join(md))
    print(path.read_text())


if __name__ == "__main__":
    main()
