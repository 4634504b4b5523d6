"""A PyKEEN-trained FB15k-237 model imported and compressed: its filtered test MRR by PyKEEN's own evaluator and by
ours on the same triples (they must agree), then `earl compress --from` at fractions of its bytes with the MRR
of each size.

    python bench/imported_train.py --out runs/imported/complex-200 --minutes 10   # a PyKEEN ComplEx (10 min)
    python bench/imported.py runs/imported/complex-200                             # import, evaluate, compress
    python bench/imported.py runs/imported/complex-200-45 --fractions 32 --retrain-minutes 30 --tag 45min_retrain

The model is imported without its graph (`--no-graph`), so every byte of a budget goes to the tables and the
vocabularies; each search scores its sizes on 1,000 valid triples and fine-tunes pq codebooks on the train split
(4 minutes a budget); each pick is then scored on the test triples the original was: a seeded sample of 5,000
(`--test-triples`; the shared 2-core machine makes each full pass over 20,438 take many minutes). Filtered MRR: realistic
ranks, tails and heads, every known triple (train, valid, test) left out, as PyKEEN's RankBasedEvaluator with
train and valid as additional filter triples. Writes bench/results/imported_fb15k-237.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, default_datasets, md_table, write_results  # noqa: E402

FRACTIONS = (8, 32, 64)


def pykeen_mrr(folder: Path, data: Path, limit: int) -> tuple[float, np.ndarray, np.ndarray, float]:
    """(PyKEEN's filtered realistic MRR on `limit` test triples (a seeded sample; 0: all), those triples, every
    known triple, seconds)."""
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.triples import TriplesFactory

    model = torch.load(folder / "trained_model.pkl", map_location="cpu", weights_only=False).eval()
    train = TriplesFactory.from_path_binary(folder / "training_triples")
    splits = {s: TriplesFactory.from_path(data / f"{s}.txt", entity_to_id=train.entity_to_id,
                                          relation_to_id=train.relation_to_id).mapped_triples
              for s in ("valid", "test")}
    test = splits["test"]
    if limit and len(test) > limit:
        test = test[np.sort(np.random.default_rng(0).choice(len(test), limit, replace=False))]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = RankBasedEvaluator(filtered=True).evaluate(
            model, test, additional_filter_triples=[train.mapped_triples, splits["valid"], splits["test"]],
            batch_size=256, use_tqdm=False)
    known = torch.cat([train.mapped_triples, splits["valid"], splits["test"]]).numpy()
    mrr = float(result.get_metric("both.realistic.inverse_harmonic_mean_rank"))
    return mrr, test.numpy(), known, time.perf_counter() - start


def ours(bundle_path: Path, test: np.ndarray, known: np.ndarray) -> tuple[float, float]:
    from earl_service.bundle.model_io import load_bundle
    from earl_service.core.known import KnownAnswers
    from earl_service.imports.compress import filtered_mrr

    bundle = load_bundle(bundle_path)
    start = time.perf_counter()
    mrr = filtered_mrr(bundle, test, KnownAnswers(known, len(bundle.relations)))
    return mrr, time.perf_counter() - start


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="PyKEEN save_to_directory folder (bench/imported_train.py)")
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--minutes", type=float, default=4.0, help="each budget's search")
    p.add_argument("--test-triples", type=int, default=5000, help="seeded sample of the test split (0: all)")
    p.add_argument("--tag", default="", help="a results file of its own (imported_fb15k-237_TAG): another model")
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="budgets as 1/F of the original")
    p.add_argument("--retrain-minutes", type=float, default=0.0,
                   help="each budget also trains a model at the budget on the graph this long (compress --from's "
                        "--retrain-minutes); a retrained pick is tested on the same test triples, mapped by name")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    return p.parse_args()


def budget(a: argparse.Namespace, bundle_path: Path, data: Path, out: Path, fraction: int, test: np.ndarray,
           known: np.ndarray) -> dict:
    """compress --from at 1/`fraction` of the original's bytes, and its pick's test MRR on `test`."""
    from earl_service.bundle.model_io import load_bundle
    from earl_service.compress.retrained import RETRAINED, compress_from, score
    from earl_service.config.options import train_configs_from_options
    from earl_service.config.recipes import DEFAULT
    from earl_service.imports.compress import ImportedSearch

    search = ImportedSearch(max_bytes=bundle_path.stat().st_size // fraction, time_limit_minutes=a.minutes,
                            eval_triples=1000)
    report = compress_from(bundle_path, out, search, graph=data, retrain_minutes=a.retrain_minutes,
                           train_configs=train_configs_from_options({"progress": False, "threads": a.threads},
                                                                          recipe=DEFAULT))
    assert report is not None
    pick = next((r for r in report["candidates"] if r["precision"] == report["pick"]), None)
    row = {"fraction": fraction, "max_bytes": search.max_bytes, "pick": report["pick"],
           "candidates": report["candidates"], "search_seconds": report["seconds"]}
    if pick is not None and pick["precision"] == RETRAINED:  # a model over the graph's names: mapped by name
        mrr, scored = score(load_bundle(out / "bundle.safetensors"), load_bundle(bundle_path), test, known)
        row.update(bytes=pick["bytes"], valid_mrr=pick["mrr"], test_mrr=mrr, test_triples_scored=scored,
                   retrained=pick["retrained"])
    elif pick is not None:
        row.update(bytes=pick["bytes"], valid_mrr=pick["mrr"],
                   test_mrr=ours(out / "bundle.safetensors", test, known)[0])
    return row


def main() -> None:
    a = arguments()
    from earl_service.imports import read_model, to_bundle

    torch.set_num_threads(a.threads)
    data = a.data or default_datasets() / "fb15k-237"
    work = REPO / "runs" / ("imported" + (f"_{a.tag}" if a.tag else ""))
    imported = read_model(a.folder)
    bundle_path = to_bundle(imported, known=False).save(work / "original.safetensors", precision="fp32")
    original_bytes = bundle_path.stat().st_size
    pk_mrr, test, known, pk_seconds = pykeen_mrr(a.folder, data, a.test_triples)
    our_mrr, our_seconds = ours(bundle_path, test, known)
    print(json.dumps({"pykeen": pk_mrr, "ours": our_mrr}), flush=True)
    budgets = []
    for fraction in (int(f) for f in a.fractions.split(",")):
        budgets.append(budget(a, bundle_path, data, work / f"compress-1-{fraction}", fraction, test, known))
        print(json.dumps({k: v for k, v in budgets[-1].items() if k != "candidates"}), flush=True)
    train = json.loads((a.folder / "train.json").read_text()) if (a.folder / "train.json").is_file() else {}
    data_out = {"train": train, "retrain_minutes": a.retrain_minutes, "original_bytes": original_bytes,
                "test_triples": len(test),
                "pykeen_test_mrr": pk_mrr, "pykeen_eval_seconds": round(pk_seconds, 1), "our_test_mrr": our_mrr,
                "our_eval_seconds": round(our_seconds, 1), "budgets": budgets}
    rows = [["original fp32", original_bytes, "1", "-", round(our_mrr, 4), 0.0]]
    rows += [[(f"retrained: {b['retrained']['candidate']} {b['retrained']['precision']}" if "retrained" in b
               else b["pick"] or "nothing fits"), b.get("bytes", "-"), f"1/{b['fraction']}", b["max_bytes"],
              round(b["test_mrr"], 4) if "test_mrr" in b else "-",
              round(b["test_mrr"] - our_mrr, 4) if "test_mrr" in b else "-"] for b in budgets]
    md = (f"# PyKEEN {train.get('model', '?')} (dim {train.get('embedding_dim', '?')}) on FB15k-237, imported "
          "and compressed\n\n"
          f"PyKEEN's ComplEx model class, its parameters trained here for {train.get('train_seconds', '?')} s "
          f"({train.get('epochs', '?')} epochs of {train.get('training_loop', '')}, {train.get('negatives', '?')} "
          f"shared negatives, batch {train.get('batch_size', '?')}, lr {train.get('lr', '?')}; bench/imported_train.py "
          "says why not PyKEEN's own loop): `" + str(train.get("command", "")) + "`. A short run on a shared 2-core "
          "machine: the figures are the import's fidelity and what each size costs.\n\n"
          f"Filtered test MRR on {len(test):,} test triples (a seeded sample): PyKEEN's RankBasedEvaluator {pk_mrr:.5f}, ours (the "
          f"imported bundle, exact scan) {our_mrr:.5f}, difference {our_mrr - pk_mrr:+.1e}.\n\n"
          + md_table(["bundle (pick)", "bytes", "of original", "budget", "test MRR", "MRR change"], rows)
          + ("" if not a.retrain_minutes else
             f"\n\nWith `--retrain-minutes {a.retrain_minutes:g}`: beside the coded sizes, `earl compress` on the "
             "graph at the same budget (compress/retrained.py), a new model over the graph's entities, tested on "
             "the same triples mapped by name.")
          + "\n\nEach budget's sizes (MRR: valid, 1,000 triples; est.: ruled out by its estimate):\n\n"
          + md_table(["budget", "precision", "bytes", "fits", "valid MRR", "fine-tuned: before -> after"],
                     [[f"1/{b['fraction']}", c["precision"], c.get("bytes", f"{c['estimate']} (est.)"),
                       "yes" if c.get("fits") else "no", round(c["mrr"], 4) if c.get("mrr") is not None else "-",
                       (f"{c['fine_tune']['mrr_before']:.4f} -> {c['fine_tune']['mrr_after']:.4f}"
                        f"{'' if c['fine_tune']['kept'] else ' (not kept)'}") if "fine_tune" in c else ""]
                      for b in budgets for c in b["candidates"]]) + "\n")
    write_results("imported_fb15k-237" + (f"_{a.tag}" if a.tag else ""), data_out, md)
    print(md)


if __name__ == "__main__":
    main()
