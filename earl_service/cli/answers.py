"""`earl predict`, `earl score` and `earl export --format npy|tsv|parquet`: answers from a bundle (numpy only by
default: the edge reader, no torch)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from earl_service.errors import BundleError, ConfigError

if TYPE_CHECKING:
    from earl_service.serve.predictor import LinkPredictor

READERS = ("edge", "torch")


def add_answer_commands(sub) -> None:
    p = sub.add_parser("predict", help="top-k tails of (head, relation, ?) or heads of (?, relation, tail)")
    _add_bundle_argument(p)
    anchor = p.add_mutually_exclusive_group(required=True)
    anchor.add_argument("--head", help="predict the tails of (HEAD, RELATION, ?)")
    anchor.add_argument("--tail", help="predict the heads of (?, RELATION, TAIL)")
    anchor.add_argument("--queries", metavar="FILE",
                        help="answer every line of FILE with one load (- reads stdin): HEAD<TAB>RELATION for tails, "
                             "?<TAB>RELATION<TAB>TAIL for heads; a table per query, or one JSON object a line with "
                             "--json (docs/answers.md)")
    p.add_argument("--relation", help="the relation of --head or --tail (a --queries file gives one a line)")
    p.add_argument("-k", type=int, default=10, help="answers to show (default: %(default)s)")
    p.add_argument("--include-known", action="store_true", help="keep answers the graph already holds")
    _add_output_options(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("score", help="distance, score and filtered ranks of one triple (RotatE, or an imported "
                                     "model's scorer)")
    _add_bundle_argument(p)
    p.add_argument("head")
    p.add_argument("relation")
    p.add_argument("tail")
    _add_output_options(p)
    p.set_defaults(func=cmd_score)


def _add_bundle_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", help="a bundle file, or a run directory holding bundle.safetensors")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (as the HTTP API answers) instead of a table")
    p.add_argument("--reader", choices=READERS, default="edge",
                   help="edge: numpy only, every entity scored exactly (default); torch: the server's path "
                        "(torch rebuild, FAISS shortlist, exact re-rank)")
    c = p.add_argument_group("cache (what the edge reader rebuilt, kept on disk so that later calls skip the rebuild)")
    c.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="where (default: $EARL_CACHE_DIR, else $XDG_CACHE_HOME/earl, else ~/.cache/earl)")
    c.add_argument("--no-cache", action="store_true", help="rebuild from the bundle; neither read nor write the cache")


def bundle_file(path: str | Path) -> Path:
    """The bundle a command names: a file, or a run directory's bundle.safetensors."""
    path = Path(path)
    if path.is_dir():
        path = path / "bundle.safetensors"
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle file")
    return path


def load_predictor(path: str | Path, reader: str = "edge", *, cache_dir: Path | None = None) -> LinkPredictor:
    """edge.load (numpy; through the table cache in `cache_dir` when one is given) or LinkPredictor.from_bundle
    (torch, FAISS) of the bundle at `path`."""
    if reader == "torch":
        from earl_service.bundle.model_io import load_bundle
        from earl_service.serve.predictor import LinkPredictor

        return LinkPredictor.from_bundle(load_bundle(bundle_file(path), keep_codes=True))
    if cache_dir is not None:
        from earl_service.device.cache import CacheConfig, TableCache

        return TableCache(CacheConfig(cache_dir)).load(bundle_file(path))
    from earl_service.device import reader as edge

    return edge.load(bundle_file(path))


def cache_dir(a: argparse.Namespace) -> Path | None:
    """The table cache a command uses: --cache-dir, or the default one; None with --no-cache or --reader torch."""
    if a.no_cache or a.reader != "edge":
        return None
    if a.cache_dir:
        return Path(a.cache_dir)
    from earl_service.device.cache import default_directory

    return default_directory(os.environ)


def cmd_predict(a: argparse.Namespace) -> int:
    if a.queries is not None:
        return _predict_queries(a)
    if not a.relation:
        raise ConfigError("--relation is required with --head or --tail")
    found = load_predictor(a.bundle, a.reader, cache_dir=cache_dir(a)).answer(
        a.relation, head=a.head, tail=a.tail, k=a.k, exclude_known=not a.include_known)
    print(json.dumps(found, indent=2) if a.json else predictions_table(found))
    return 0


def _predict_queries(a: argparse.Namespace) -> int:
    """Every query of the --queries file from one load: one JSON object a line (--json) or a table each."""
    from earl_service.cli import queries as query_file

    if a.relation:
        raise ConfigError("--relation goes on each line of the --queries file, not on the command line")
    queries = query_file.read_queries(a.queries)  # a bad line stops before the bundle is loaded
    predictor = load_predictor(a.bundle, a.reader, cache_dir=cache_dir(a))
    query_file.check_names(predictor, queries, a.queries)
    for i, found in enumerate(query_file.answers(predictor, queries, k=a.k, exclude_known=not a.include_known)):
        print(json.dumps(found) if a.json else ("\n" if i else "") + predictions_table(found))
    return 0


def cmd_score(a: argparse.Namespace) -> int:
    scored = load_predictor(a.bundle, a.reader, cache_dir=cache_dir(a)).score(a.head, a.relation, a.tail)
    if a.json:
        print(json.dumps(scored, indent=2))
    else:
        print("\n".join(f"{key:<15}{_cell(value)}" for key, value in scored.items() if value is not None))
    return 0


def predictions_table(found: dict[str, Any]) -> str:
    """A title naming the query, then one row per answer with every field the predictor gave (labels too, where
    any answer has one)."""
    head, relation, tail = (_labelled(found, end) for end in ("head", "relation", "tail"))
    title = f"tails of ({head}, {relation}, ?)" if found["direction"] == "tail" else f"heads of (?, {relation}, {tail})"
    rows = found["predictions"]
    if not rows:
        return f"{title}: no answers"
    fields = dict.fromkeys(key for row in rows for key in row)
    columns = ["rank", *(key for key in fields if any(row.get(key) is not None for row in rows))]  # no empty column
    cells = [[str(i), *(_cell(row.get(c)) for c in columns[1:])] for i, row in enumerate(rows, 1)]
    widths = [max(len(c), *(len(r[j]) for r in cells)) for j, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([title, *(line.rstrip() for line in lines)])


def _labelled(found: dict[str, Any], end: str) -> str:
    """The query's id at `end` (head, relation, tail), its label in brackets where it has one."""
    label = found.get(f"{end}_label")
    return f"{found[end]} ({label})" if label else str(found[end])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"  # a rank of 4.0 reads "4", a score "0.572032"
    return "" if value is None else str(value)


def cmd_export_tables(a: argparse.Namespace) -> int:
    """`earl export BUNDLE --format npy|tsv|parquet --out DIR`: the rebuilt embeddings with their ids."""
    from earl_service.device import reader as edge
    from earl_service.device.tables import export_tables

    files = export_tables(edge.load(bundle_file(a.run_dir)), a.out, fmt=a.format)
    print(json.dumps({"format": a.format, "files": [str(f) for f in files],
                      "bytes": sum(f.stat().st_size for f in files)}))
    return 0
