"""Serving an imported model's pq bundle straight from its codes: the exact scan the server ran over the coded table
(every row decoded, block by block) against the ADC scan of the codes by the scorer's own metric with its exact
re-rank (serve/metric.MetricCodes), and the float table's FAISS flat index for reference (which needs the table
decoded whole beside the codes: its bytes are in the table). One query at a time, one thread.

    python bench/imported_codes_scan.py --bundle runs/imported_45min_retrain/compress-1-32/candidates/pq-25.safetensors \
        --data ../shared/datasets/fb15k-237
    python bench/imported_codes_scan.py --synthetic 1000000x256:32:distmult

The float flat index is what the server held for an imported pq bundle before (it decoded the table at load).
A bundle's queries are (head, relation) and (relation, tail) of its own graph, known answers excluded (what
`GET /predict` does by default); a synthetic table (clustered fp16 codebooks, random codes: a hard case, nothing to
prune by) gets random ones. Every answer of the codes scan is checked against the exact scan's. Writes
bench/results/imported_codes_scan.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, write_results  # noqa: E402

R = 8  # relations of a synthetic table


def synthetic(spec: str):
    """A LinkPredictor over a random pq table `ROWSxWIDTH:M:SCORER` and R random relations, no graph."""
    from earl_service.core import scorers
    from earl_service.data.vocab import Vocab
    from earl_service.serve.predictor import LinkPredictor
    from earl_service.serve.tables import PQTable

    shape, m, kind = spec.split(":")
    rows, width = map(int, shape.split("x"))
    rng = np.random.default_rng(0)
    sub = width // int(m)
    books = (rng.normal(size=(int(m), 1, sub)) + 0.3 * rng.normal(size=(int(m), 256, sub))).astype(np.float16)
    table = PQTable(rng.integers(0, 256, (rows, int(m)), dtype=np.uint8), books)
    relation_width = scorers.SCORERS[kind].relation_width(width // 2)
    relations = rng.normal(size=(R, relation_width)).astype(np.float32)

    def build(index: str, codes: bool = True) -> LinkPredictor:
        return LinkPredictor(table if codes else table.dense(), relations, Vocab([f"e{i}" for i in range(rows)]),
                             Vocab([f"r{i}" for i in range(R)], kind="relation"), np.zeros((0, 3), np.int64),
                             gamma=0.0, epsilon=2.0, model=kind, index=index)

    queries = [("tail", f"e{h}", f"r{r}") for h, r in zip(rng.integers(rows, size=200), rng.integers(R, size=200),
                                                          strict=True)]
    return build, queries, {"source": spec, "scorer": kind, "rows": rows, "width": width, "codes": int(m)}


def from_bundle(path: str, data: str | None):
    from earl_service.bundle.model_io import load_bundle
    from earl_service.serve.predictor import LinkPredictor

    bundle = load_bundle(path, keep_codes=True)
    rng = np.random.default_rng(0)
    names, rels = bundle.entities.names, bundle.relations.names
    if len(bundle.triples):
        named = [(names[h], rels[r], names[t]) for h, r, t in bundle.triples]
    elif data:  # a graph-less bundle: its dataset's test triples
        named = [tuple(line.split("\t")[:3]) for line in (Path(data) / "test.txt").read_text().splitlines()]
    else:
        raise SystemExit(f"{path} holds no graph: give --data, the dataset folder whose test triples to ask")
    picked = [named[i] for i in rng.choice(len(named), 100, replace=False)]
    queries = [q for h, r, t in picked for q in (("tail", h, r), ("head", t, r))]

    def build(index: str, codes: bool = True) -> LinkPredictor:
        return LinkPredictor.from_bundle(bundle, index=index, from_codes=codes)

    codes = bundle.stored["codes"].shape[1] if "codes" in bundle.stored else None
    return build, queries, {"source": Path(path).name, "scorer": bundle.config.model, "rows": len(names),
                            "width": 2 * bundle.config.dim, "codes": codes}


def timed(predictor, queries, k: int) -> tuple[float, list]:
    answers, seconds = [], []
    for side, anchor, relation in queries:
        ask = predictor.predict_tails if side == "tail" else predictor.predict_heads
        start = time.perf_counter()
        answers.append(ask(anchor, relation, k))
        seconds.append(time.perf_counter() - start)
    return round(1e3 * float(np.median(seconds)), 3), answers


def measure(build, queries, info: dict, k: int, limit: int) -> dict:
    row = dict(info, queries=len(queries))
    exact_queries = queries[:limit]  # the exact scan of a big coded table is slow: a prefix of the queries
    served = {name: build(index) for name, index in (("codes", "auto"), ("exact", "exact"))}
    assert served["codes"].index_kind == "metric-codes", served["codes"].index_kind
    row["codes_ms"], codes_answers = timed(served["codes"], queries, k)
    row["exact_ms"], exact_answers = timed(served["exact"], exact_queries, k)
    row["exact_queries"] = len(exact_queries)
    row["answers_equal"] = codes_answers[: len(exact_answers)] == exact_answers
    shortlists = []
    index = served["codes"].index
    for side, anchor, relation in queries[:50]:
        p = served["codes"]
        q = p.query_vector(side, p.entity_id(anchor), p.relation_id(relation))
        shortlists.append(len(index.certified_shortlist(q, k, np.zeros(0, np.int64))[0]))
    row["shortlist_median"] = int(np.median(shortlists))
    row["codes_bytes"] = int(served["codes"].table.nbytes)
    start = time.perf_counter()
    flat = build("flat", codes=False)
    row["float_build_s"] = round(time.perf_counter() - start, 2)
    row["float_table_bytes"] = int(flat.table.nbytes + (flat.index.index_bytes if flat.index else 0))
    row["float_flat_ms"], _ = timed(flat, queries, k)
    row["float_kind"] = flat.index_kind
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", action="append", default=[], help="an imported model's pq bundle")
    p.add_argument("--synthetic", action="append", default=[], help="ROWSxWIDTH:M:SCORER (random pq table)")
    p.add_argument("--data", help="a graph-less bundle's dataset folder (its test triples are the queries)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--exact-queries", type=int, default=50, help="queries the exact scan answers (it is slow)")
    p.add_argument("--tag", default="")
    a = p.parse_args()
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    rows = []
    for path in a.bundle:
        build, queries, info = from_bundle(path, a.data)
        rows.append(measure(build, queries, dict(info, kind="bundle"), a.k, a.exact_queries))
    for spec in a.synthetic:
        build, queries, info = synthetic(spec)
        rows.append(measure(build, queries, dict(info, kind="synthetic"), a.k, a.exact_queries))
    md = ("# An imported pq bundle served from its codes\n\n"
          f"One query at a time, one thread, top {a.k}, median ms a query. Float flat: what the server ran before, the "
          "table decoded whole at load into FAISS's flat index of the scorer's metric (its bytes: the float table "
          "and the index's copy); codes: the ADC scan of the codes by that metric and the exact re-rank of its "
          "certified shortlist (serve/metric.MetricCodes; its bytes: the codes and codebooks); exact: every row "
          "decoded from its codes and scored (index=\"exact\"). `equal`: the codes scan's answers equal the exact "
          "scan's on every query both answered.\n\n"
          + md_table(["source", "scorer", "rows", "width", "codes", "exact ms", "codes ms", "shortlist (median)",
                      "equal", "codes bytes", "float flat ms", "float bytes"],
                     [[r["source"], r["scorer"], r["rows"], r["width"], r["codes"], r["exact_ms"], r["codes_ms"],
                       r["shortlist_median"], "yes" if r["answers_equal"] else "NO", f"{r['codes_bytes']:,}",
                       r["float_flat_ms"], f"{r['float_table_bytes']:,}"] for r in rows]))
    write_results("imported_codes_scan" + (f"_{a.tag}" if a.tag else ""), {"k": a.k, "results": rows}, md)
    print(md)


if __name__ == "__main__":
    main()
