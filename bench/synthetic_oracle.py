"""The synthetic graph's ceiling: test MRR of ranking each query's answers by the generator's own odds
(popularity inside the relation's type; no model can do better in expectation), and by popularity alone, beside
compress picks on the same graph. The graph is drawn again from its config (the same arrays as
`python -m earl_service.data.synthetic` wrote), and the ranked triples are the pick's: the whole test split, or
the same random subset Run.ranked_triples draws (`--subset`, from the report's test_subset).

    python bench/synthetic_oracle.py --entities 1000000 \
        --report bench/results/compress_synthetic-1m_8MB_60min_rows_report.json     # ~2 minutes, 1.5 GB
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, write_results

from earl_service.data.synthetic import SyntheticConfig, generate, latent, oracle_ranks


def metrics(ranks: dict[str, np.ndarray]) -> dict[str, float]:
    """MRR and Hits@10, both directions pooled (as evaluate reports them), and the MRR's standard error."""
    pooled = np.concatenate([ranks["tail"], ranks["head"]])
    reciprocal = 1.0 / pooled
    return {"mrr": float(reciprocal.mean()), "hits_at_10": float((pooled <= 10).mean()),
            "standard_error": float(reciprocal.std(ddof=1) / np.sqrt(len(reciprocal)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset", type=int, default=None,
                        help="rank this random subset of the test split (default: the first report's test_subset)")
    parser.add_argument("--report", type=Path, action="append", default=[],
                        help="a compress report.json on this graph: its pick's test MRR goes beside the ceiling")
    args = parser.parse_args()
    reports = {str(p): json.loads(p.read_text()) for p in args.report}
    subset = args.subset if args.subset is not None else next(
        (r["test"].get("test_subset", 0) for r in reports.values()), 0)
    started = time.perf_counter()
    config = SyntheticConfig(entities=args.entities, seed=args.seed)
    kg = generate(config)
    drawn = latent(config, np.random.default_rng(config.seed))
    drawing = time.perf_counter() - started
    triples = kg.test  # every test triple's entities occur in train, so the "seen" protocol ranks them all
    if subset and subset < len(triples):  # Run.ranked_triples' subset
        triples = triples[np.random.default_rng(0).choice(len(triples), subset, replace=False)]
    rows = {"typed": metrics(oracle_ranks(kg, drawn, triples, typed=True)),
            "popularity": metrics(oracle_ranks(kg, drawn, triples, typed=False))}
    chance = float(np.mean(1.0 / np.arange(1, kg.num_entities + 1)))  # E[1/rank], rank uniform on 1..N
    picks = {path: {"pick": f"{r['pick']['candidate']} {r['pick']['precision']}", "bytes": r["pick"]["bytes"],
                    "test_mrr": r["test"]["mrr"], "test_subset": r["test"].get("test_subset", 0),
                    "share_of_ceiling": r["test"]["mrr"] / rows["typed"]["mrr"]} for path, r in reports.items()}
    md = [f"# The synthetic graph's ceiling: {kg.num_entities:,} entities, {len(kg.train):,} train triples", "",
          f"{len(triples):,} test triples ({'a random subset, as the picks were tested' if subset else 'all'}), "
          "filtered ranks, both directions pooled. Heads and tails are drawn independently given the relation "
          "(earl_service/data/synthetic.py), so ranking by popularity inside the relation's type is the best any "
          "model can do in expectation.", "",
          md_table(["ranking", "MRR", "standard error", "Hits@10"],
                   [["the generator's odds: popularity inside the relation's type (ceiling)", rows["typed"]["mrr"],
                     rows["typed"]["standard_error"], rows["typed"]["hits_at_10"]],
                    ["popularity alone, every entity", rows["popularity"]["mrr"],
                     rows["popularity"]["standard_error"], rows["popularity"]["hits_at_10"]],
                    ["uniform (chance)", chance, None, 10 / kg.num_entities]])]
    if picks:
        md += ["", md_table(["compress report", "pick", "bytes", "test MRR", "share of the ceiling"],
                            [[Path(p).name, v["pick"], f"{v['bytes']:,}", v["test_mrr"],
                              f"{100 * v['share_of_ceiling']:.1f}%"] for p, v in picks.items()])]
    md += ["", f"Drawing the graph took {drawing:.0f} s, ranking {time.perf_counter() - started - drawing:.0f} s."]
    _, path = write_results(f"synthetic_oracle_{kg.num_entities}", {
        "config": vars(config), "test_triples": len(triples), "subset": subset, "rows": rows, "chance_mrr": chance,
        "picks": picks}, "\n".join(md))
    print(path.read_text())


if __name__ == "__main__":
    main()
