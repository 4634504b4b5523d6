"""A model trained at a budget (`earl compress DATA --out RUN`) scored as bench/imported.py scores the sizes of an
imported model: filtered MRR on the same seeded 5,000 test triples and 1,000 valid triples of FB15k-237, its ids
mapped from the PyKEEN model's names (compress/retrained.score, as `earl compress --from --retrain-minutes`).

    python bench/imported_retrained.py /work/imp/complex-200-45 RUN --tag 45min_retrain

For a search run on its own beside the imported model's (another core), then compared with its table
(bench/results/imported_fb15k-237_TAG.json). Writes bench/results/imported_fb15k-237_TAG_retrained.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, default_datasets, md_table, write_results  # noqa: E402
from imported import pykeen_mrr  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the PyKEEN model's folder (bench/imported_train.py)")
    p.add_argument("run", type=Path, help="an `earl compress` job folder (its bundle.safetensors and report.json)")
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--test-triples", type=int, default=5000)
    p.add_argument("--tag", required=True, help="the bench/imported.py table this row goes beside")
    a = p.parse_args()
    from earl_service.bundle.model_io import load_bundle
    from earl_service.compress.retrained import score
    from earl_service.imports.compress import ImportedSearch, eval_sample, read_graph

    torch.set_num_threads(1)
    data = a.data or default_datasets() / "fb15k-237"
    source = load_bundle(REPO / "runs" / f"imported_{a.tag}" / "original.safetensors")
    pk_mrr, test, known, _ = pykeen_mrr(a.folder, data, a.test_triples)
    trained = load_bundle(a.run / "bundle.safetensors")
    test_mrr, test_scored = score(trained, source, test, known)
    splits = read_graph(data, source).splits  # the valid triples bench/imported.py scored each size on
    valid = eval_sample(splits["valid"], ImportedSearch(max_bytes=1, eval_triples=1000))
    valid_mrr, valid_scored = score(trained, source, valid, np.concatenate(list(splits.values())))
    report = json.loads((a.run / "report.json").read_text())
    pick = report["pick"]
    row = {"run": str(a.run), "candidate": pick["candidate"], "precision": pick["precision"],
           "bytes": (a.run / "bundle.safetensors").stat().st_size, "max_bytes": report["max_bytes"],
           "search_minutes": round(report["spent_seconds"] / 60, 2), "train_seconds": pick["train_seconds"],
           "source_bytes": source.num_bytes, "source_test_mrr": pk_mrr, "test_mrr": test_mrr,
           "test_triples": test_scored, "valid_mrr": valid_mrr, "valid_triples": valid_scored,
           "own_test": report["test"]}
    print(json.dumps(row, indent=2))
    md = (f"# A model trained at 1/{source.num_bytes / row['bytes']:.1f} of the imported model's bytes\n\n"
          f"`earl compress` run {a.run.name}: {pick['candidate']} {pick['precision']}, {row['bytes']:,} B (budget "
          f"{row['max_bytes']:,}), {row['search_minutes']} minutes, scored on the imported model's test and valid "
          "triples mapped by name.\n\n"
          + md_table(["model", "bytes", "test MRR", "valid MRR"],
                     [["imported (PyKEEN's evaluator)", source.num_bytes, round(pk_mrr, 4), "-"],
                      [f"{pick['candidate']} {pick['precision']}", row["bytes"], round(test_mrr or 0, 4),
                       round(valid_mrr or 0, 4)]]) + "\n")
    write_results(f"imported_fb15k-237_{a.tag}_retrained", row, md)


if __name__ == "__main__":
    main()
