"""bench/compress.py: each compress row records its search (minutes, best export of each model kind)."""

import importlib.util
import json

from conftest import REPO

_spec = importlib.util.spec_from_file_location("bench_compress", REPO / "bench" / "compress.py")
assert _spec and _spec.loader
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def _export(model: str, dim: int, precision: str, mrr: float, subset: int = 0) -> dict:
    return {"candidate": f"{model}-d{dim}", "model": model, "dim": dim, "precision": precision, "bytes": dim * 1000,
            "mrr": mrr, "valid_subset": subset}


REPORT = {
    "spent_seconds": 3660.0,
    "test": {"mrr": 0.29},
    "exports": [
        _export("earl", 95, "pq:95", 0.2950),
        _export("earl", 95, "int8", 0.2940),
        _export("earl", 200, "pq:50", 0.31, subset=2000),  # an early rung's subset score: not comparable
        _export("rotate", 414, "pq:207", 0.3021),
        _export("rotate", 30, "fp32", 0.25),
    ],
}


def test_search_summary_takes_each_kinds_best_whole_split_export():
    summary = table.search_summary(REPORT)
    assert summary["search_minutes"] == 61.0
    assert summary["best_of_model"] == {
        "earl": {"dim": 95, "precision": "pq:95", "bytes": 95000, "valid_mrr": 0.2950},
        "rotate": {"dim": 414, "precision": "pq:207", "bytes": 414000, "valid_mrr": 0.3021},
    }
    md = table.markdown([{"dataset": "d", "budget": "4MB", "minutes": 60.0,
                          "compress": {"fits": True, "test_mrr": 0.29, "model": "rotate", "dim": 414,
                                       "precision": "pq:207", "bytes": 414000, **summary}}], quick=False)
    assert "| d | 4MB | 61.0 | 0.2950 (d95 pq:95, 95,000 B) | 0.3021 (d414 pq:207, 414,000 B) |" in md


def test_old_rows_are_filled_only_from_their_own_report(tmp_path):
    folder = tmp_path / "4MB" / "compress"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(REPORT))
    rows = {"4MB": {"compress": {"test_mrr": 0.29}}, "8MB": {"compress": {"test_mrr": 0.30}}}
    table.fill_searches(rows, tmp_path)
    assert rows["4MB"]["compress"]["best_of_model"]["earl"]["dim"] == 95
    assert "best_of_model" not in rows["8MB"]["compress"]  # no report on disk

    rows = {"4MB": {"compress": {"test_mrr": 0.31}}}  # a later search left this report: not the row's
    table.fill_searches(rows, tmp_path)
    assert "best_of_model" not in rows["4MB"]["compress"]
    assert "| 4MB |  | not recorded | not recorded |" in table.markdown(
        [{"dataset": "d", "budget": "4MB", "minutes": 60.0, "compress": {"fits": True, **rows["4MB"]["compress"],
                                                                         "model": "rotate", "dim": 1,
                                                                         "precision": "fp32", "bytes": 1}}],
        quick=False)
