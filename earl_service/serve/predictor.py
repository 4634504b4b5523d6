"""Top-k link prediction by entity and relation name over rebuilt embeddings, known answers left out.

The search itself (a FAISS proxy shortlist, then an exact RotatE re-rank) lives in earl_service/serve/index.py; an
imported model's, a FAISS flat index of its scorer's own metric and the same exact re-rank, in serve/metric.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from earl_service.core import rotate, scorers
from earl_service.core.known import KnownAnswers, Side
from earl_service.data.packed import AnyVocab, PackedVocab
from earl_service.data.vocab import Vocab
from earl_service.errors import ConfigError
from earl_service.serve.codes import CodesIndex
from earl_service.serve.index import CALIBRATION_QUERIES, HNSW_THRESHOLD, ProxyIndex, SampleQuery, calibrate
from earl_service.serve.ivf import IVF_THRESHOLD, CodesIVF, cache_file
from earl_service.serve.metric import MetricCodes, MetricIndex
from earl_service.serve.names import NameSearch, Page
from earl_service.serve.tables import DenseTable, EntityTable, PQTable, entity_table

if TYPE_CHECKING:
    from earl_service.bundle.model_io import Bundle

IndexKind = Literal["auto", "flat", "hnsw", "ivf", "exact"]
Prediction = tuple[str, float]


def configure_threads(threads: int) -> None:
    """Set torch's and FAISS's intra-op threads: 1 in the API (many small concurrent queries), 2 in workers."""
    import torch

    torch.set_num_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass


log = logging.getLogger(__name__)

STR_OVERHEAD = 49 + 8  # bytes of an empty CPython str, and its pointer in a list or dict


class LinkPredictor:
    """Answer (h, r, ?) and (?, r, t) queries with entity names, best first.

    entity_embeddings (N, 2d) float32 [re | im], or an EntityTable (serve/tables.py) decoding them by the row from
    a bundle's int8 rows or pq codes; relation_embeddings (R, d) raw relation values, mapped to phases by
    value * pi / ((gamma + epsilon) / d) as in training; known_triples (E, 3) int64 ids whose answers `exclude_known`
    drops, or their KnownAnswers already built. `model` names the scorer: earl and rotate score with RotatE, an
    imported model with its own (core/scorers.py; its tables laid out as that says). `index` is "auto", "flat",
    "hnsw", "ivf" or "exact" (no index: score every entity). An imported model's float table: a flat index of its
    scorer's metric for any but "exact" (serve/metric.py; "exact" also where its scorer has none), its pq table the
    ADC scan of its codes by that metric (serve/metric.MetricCodes), its int8 table the exact scan. A float table:
    serve/index.py's ProxyIndex (`faiss_threads` and `flat_rotations` go to it): flat or HNSW by size, the GPU flat
    index when FAISS has a GPU; where "auto" gives the CPU flat index, the scan of the table's pair codes
    (serve/tables.PairCoded) instead if it answers the graph's own queries faster. A coded table: the flat ADC scan
    (serve/codes.py), or from IVF_THRESHOLD entities ("auto") or "ivf" the
    lists of serve/ivf.py, cached in `index_file` (from_bundle: beside the bundle, by its sha256).
    Entities and relations are named by id, or by a label that names exactly one (`entity_labels`,
    `relation_labels`: {id: label}); `labelled` adds the labels to predictions.
    """

    def __init__(
        self,
        entity_embeddings: np.ndarray | EntityTable,
        relation_embeddings: np.ndarray,
        entities: AnyVocab,
        relations: Vocab,
        known_triples: np.ndarray | KnownAnswers,
        *,
        gamma: float,
        epsilon: float,
        model: str = "rotate",
        reciprocal: bool = False,
        index: IndexKind = "auto",
        hnsw_threshold: int = HNSW_THRESHOLD,
        relation_labels: dict[str, Any] | None = None,
        entity_labels: dict[str, str] | None = None,
        faiss_threads: int | None = 1,
        flat_rotations: int | None = None,
        index_file: Path | None = None,
    ) -> None:
        self.table = entity_embeddings if isinstance(entity_embeddings, EntityTable) else DenseTable(entity_embeddings)
        # (N, 2d): the float32 array itself, or the table read like one (rows decoded when indexed)
        self.entity_embeddings: Any = self.table.dense() if isinstance(self.table, DenseTable) else self.table
        self.relation_embeddings = np.ascontiguousarray(relation_embeddings, dtype=np.float32)  # (R, d) for RotatE
        self.model = model
        self.dim, self.gamma = self.entity_embeddings.shape[1] // 2, float(gamma)
        self.scorer = scorers.scorer(model, gamma=gamma, epsilon=epsilon, dim=self.dim, reciprocal=reciprocal)
        _check_shapes(self.table, self.relation_embeddings, entities, relations, self.scorer)
        self.entities, self.relations = PackedVocab.of(entities), relations  # names in one buffer (data/packed.py)
        self.phase_scale = rotate.phase_scale(gamma=gamma, epsilon=epsilon, dim=self.dim)
        self.relation_labels = _plain_labels(relation_labels or {})
        self.entity_labels = dict(entity_labels or {})
        triples = None
        if isinstance(known_triples, KnownAnswers):  # already indexed (the device reader's cache)
            self.known = known_triples
        else:
            triples = np.asarray(known_triples, dtype=np.int64).reshape(-1, 3)
            self.known = KnownAnswers(triples, len(relations)).compact(len(entities))
        self.index: ProxyIndex | CodesIndex | CodesIVF | MetricIndex | MetricCodes | None = None
        if index != "exact" and self.scorer.metric is not None and isinstance(self.table, DenseTable):
            self.index = MetricIndex.build(self.table.dense(), self.scorer, faiss_threads=faiss_threads,
                                           kind="hnsw" if index == "hnsw" else "flat")
            # The index's own rows (MetricIndex.build) serve as the table: the floats given are not held twice.
            self.table = DenseTable(self.index.entities)
            self.entity_embeddings = self.table.dense()
        elif index != "exact" and self.scorer.metric is not None and isinstance(self.table, PQTable):
            self.index = MetricCodes(self.table, self.scorer, faiss_threads=faiss_threads)
        elif index != "exact" and self.scorer.indexable:
            def sample() -> list[SampleQuery]:  # only a float table's build asks for it, at most once
                return self._calibration_sample(self.known.triples() if triples is None else triples)

            self.index = self._build_index(index, cache(sample), index_file=index_file,
                                           hnsw_threshold=hnsw_threshold, faiss_threads=faiss_threads,
                                           flat_rotations=flat_rotations)

    def _build_index(self, index: IndexKind, sample: Callable[[], list[SampleQuery]], *, index_file: Path | None,
                     hnsw_threshold: int, faiss_threads: int | None, flat_rotations: int | None,
                     ) -> ProxyIndex | CodesIndex | CodesIVF:
        """The search over the table (class doc). A coded table is scanned on its codes. A float table gets
        ProxyIndex's; where that is the flat index ("auto" below `hnsw_threshold` on a CPU) the scan of its pair
        codes is timed beside it on the graph's own queries and the faster is kept: on FB15k-237's RotatE d168 the
        codes answered in 2.0 ms of CPU against the flat index's 3.8, on the table an EARL d127 bundle rebuilds in
        10.2 against 3.3 (its distances crowd within the codes' slack, so ~2,500 rows are re-ranked, not ~150)."""
        if not isinstance(self.table, DenseTable):
            big = index == "ivf" or (index == "auto" and self.num_entities >= IVF_THRESHOLD)
            return (CodesIVF.build(self.table, cache=index_file, faiss_threads=faiss_threads) if big
                    else CodesIndex.build(self.table, faiss_threads=faiss_threads))
        kind: Literal["auto", "flat", "hnsw"] = "flat" if index == "flat" else "hnsw" if index == "hnsw" else "auto"
        floats = ProxyIndex.build(self.table.dense(), kind=kind,
                                  hnsw_threshold=hnsw_threshold, faiss_threads=faiss_threads,
                                  flat_rotations=flat_rotations, sample=sample)
        if index != "auto" or floats.kind != "flat":
            return floats
        codes = CodesIndex.build(self.table, faiss_threads=faiss_threads)
        best, timings = calibrate({"codes": codes, "flat": floats}, sample)
        log.info("float table: the codes scan took %s ms a query against the flat index's %s; keeping %s",
                 *(f"{timings[k]:.2f}" if k in timings else "-" for k in ("codes", "flat")), best)
        if best == "codes":
            return codes
        self.table.forget_codes()
        return floats

    @classmethod
    def from_bundle(cls, bundle: Bundle, *, from_codes: bool = True, **kwargs: Any) -> LinkPredictor:
        """A predictor over a bundle's rebuilt embeddings and its graph's triples as the known answers; a RotatE
        bundle's int8 or pq entity table is served from what the file stores unless `from_codes` is False."""
        table = entity_table(bundle.stored, lambda: bundle.entity_embeddings().numpy(), from_codes=from_codes)
        if bundle.path is not None and bundle.sha256:
            kwargs.setdefault("index_file", cache_file(bundle.path, bundle.sha256))
        return cls(table, bundle.relation_embeddings().numpy(), bundle.entities,
                   bundle.relations, bundle.triples, gamma=bundle.config.gamma, epsilon=bundle.config.epsilon,
                   model=bundle.config.model, reciprocal=bundle.config.reciprocal, relation_labels=bundle.relation_labels,
                   entity_labels=bundle.entity_labels, **kwargs)

    @property
    def num_entities(self) -> int:
        return self.entity_embeddings.shape[0]

    @property
    def resident_bytes(self) -> int:
        """About what this predictor keeps in memory: its tables, known answers, index and names (the packed entity
        names' buffer and index; relation names and labels at CPython's str overhead each). The API's model cache
        budgets memory by it."""
        names = self.entities.nbytes + sum(len(n) + STR_OVERHEAD for n in self.relations.names)
        labels = sum(len(v) + STR_OVERHEAD for v in (*self.entity_labels.values(), *self.relation_labels.values()))
        index = self.index.index_bytes if self.index is not None else 0
        return (self.table.nbytes + self.relation_embeddings.nbytes + self.known.nbytes + index
                + names + labels)

    @property
    def index_kind(self) -> str:
        """"exact" (no index), "flat", "hnsw", "gpu-flat", "codes-flat" (the ADC scan on a table's codes) or
        "metric-flat" (an imported model's)."""
        return self.index.kind if self.index else "exact"

    @property
    def rotations(self) -> int:
        """P of the index's proxy (1 without an index)."""
        return self.index.rotations if self.index else 1

    @property
    def calibration_ms(self) -> dict[int, float]:
        """Mean query ms per proxy P that the flat index timed when it was built (empty when it timed none)."""
        return self.index.calibration_ms if self.index else {}

    def _calibration_sample(self, triples: np.ndarray) -> list[SampleQuery]:
        """Both directions of CALIBRATION_QUERIES of the graph's own triples (random ids for an empty graph)."""
        rng = np.random.default_rng(0)
        n, size = self.num_entities, CALIBRATION_QUERIES
        picks = (triples[rng.integers(len(triples), size=size)] if len(triples) else
                 np.stack([rng.integers(n, size=size), rng.integers(len(self.relations), size=size),
                           rng.integers(n, size=size)], 1))
        sample = []
        for h, r, t in picks:
            directions: tuple[tuple[Side, int], ...] = (("tail", int(h)), ("head", int(t)))
            for side, anchor in directions:
                sample.append((self.query_vector(side, anchor, int(r)), self.known.answers(side, anchor, int(r))))
        return sample

    # ------------------------------------------------------------------ names and labels

    @cached_property
    def entity_search(self) -> NameSearch:
        return NameSearch(self.entities, self.entity_labels)

    @cached_property
    def relation_search(self) -> NameSearch:
        return NameSearch(self.relations, self.relation_labels)

    def entity_id(self, name: str) -> int:
        """The id of an entity named by id or by a label that names exactly one (NameSearch.resolve)."""
        return self.entities.id(name) if name in self.entities else self.entity_search.resolve(name)

    def relation_id(self, name: str) -> int:
        return self.relations.id(name) if name in self.relations else self.relation_search.resolve(name)

    def search_entities(self, query: str, *, limit: int = 10, offset: int = 0) -> Page:
        """Entities whose id or label matches `query`: exact, then prefix, then fuzzy; ranked and paginated."""
        return self.entity_search.search(query, limit=limit, offset=offset)

    def labelled(self, predictions: list[Prediction]) -> list[dict[str, Any]]:
        """Predictions as {"entity", "label", "score"} (label None where the entity has none)."""
        return [{"entity": e, "label": self.entity_labels.get(e), "score": s} for e, s in predictions]

    # ------------------------------------------------------------------ queries

    def predict_tails(self, head: str, relation: str, k: int = 10, *, exclude_known: bool = True) -> list[Prediction]:
        """Top-k (tail, score) for (head, relation, ?), best first; score = gamma - distance (RotatE), an imported
        model's own score (core.scorers.Scorer.score)."""
        return self._predict("tail", head, relation, k, exclude_known, exact=False)

    def predict_heads(self, tail: str, relation: str, k: int = 10, *, exclude_known: bool = True) -> list[Prediction]:
        """Top-k (head, score) for (?, relation, tail), best first."""
        return self._predict("head", tail, relation, k, exclude_known, exact=False)

    def brute_force_tails(self, head: str, relation: str, k: int = 10, *, exclude_known: bool = True,
                          ) -> list[Prediction]:
        """Like predict_tails, scoring every entity exactly (the reference for the index path)."""
        return self._predict("tail", head, relation, k, exclude_known, exact=True)

    def brute_force_heads(self, tail: str, relation: str, k: int = 10, *, exclude_known: bool = True,
                          ) -> list[Prediction]:
        return self._predict("head", tail, relation, k, exclude_known, exact=True)

    def answer(self, relation: str, *, head: str | None = None, tail: str | None = None, k: int = 10,
               exclude_known: bool = True) -> dict[str, Any]:
        """One query as plain JSON (GET and POST /predict, `earl predict`): exactly one of `head` (top-k tails) or
        `tail` (top-k heads), each name an id or a label that names one. The query as ids with their labels
        (`head_label`, `relation_label`, `tail_label`; None without one) and `predictions` [{"entity", "label",
        "score"}, ...]."""
        side: Side = "tail" if head is not None else "head"
        anchor = head if tail is None else tail
        if anchor is None or (head is not None and tail is not None):
            raise ConfigError("give exactly one of head (to predict tails) or tail (to predict heads)")
        anchor = self.entities.names[self.entity_id(anchor)]  # an id, also when given by label
        relation = self.relations.names[self.relation_id(relation)]
        found = self._predict(side, anchor, relation, k, exclude_known, exact=False)
        head, tail = (anchor, None) if side == "tail" else (None, anchor)
        # A bundle without its graph (RotatE, known_answers none) knows no answers to leave out: say so.
        return {"direction": side, **self._named(head, relation, tail), "k": k,
                "exclude_known": exclude_known and self.known.num_triples > 0, "predictions": self.labelled(found)}

    def score(self, head: str, relation: str, tail: str) -> dict[str, Any]:
        """The distance and score (RotatE: gamma - distance; an imported model: its library's) of one triple,
        whether the graph holds it, and its filtered realistic ranks: `tail_rank` of tail among the tails of (head,
        relation, ?), `head_rank` of head among the heads of (?, relation, tail), other known answers left out (one
        exact pass over N each). Names by id or by a label that names one; the answer gives ids and their labels."""
        h, r, t = self.entity_id(head), self.relation_id(relation), self.entity_id(tail)
        tails = self.distances(self.query_vector("tail", h, r))  # (N,) |h o r - e|
        heads = self.distances(self.query_vector("head", t, r))  # (N,) |conj(r) o t - e|
        known_tails = self.known.answers("tail", h, r)
        distance = float(tails[t])
        names = self._named(self.entities.names[h], self.relations.names[r], self.entities.names[t])
        return {**names, "distance": distance, "score": self.scorer.score(distance),
                "known": bool(np.isin(t, known_tails)),
                "tail_rank": rotate.realistic_rank(tails, t, excluded=known_tails),
                "head_rank": rotate.realistic_rank(heads, h, excluded=self.known.answers("head", t, r)),
                "entities": self.num_entities}

    def _named(self, head: str | None, relation: str, tail: str | None) -> dict[str, Any]:
        """A query's ids, each followed by its label (None where there is none)."""
        return {"head": head, "head_label": self.entity_labels.get(head or ""),
                "relation": relation, "relation_label": self.relation_labels.get(relation),
                "tail": tail, "tail_label": self.entity_labels.get(tail or "")}

    def known_answers(self, side: Side, anchor: str, relation: str) -> list[str]:
        """Names of the known tails of (anchor, relation, ?) or heads of (?, relation, anchor)."""
        ids = self.known.answers(side, self.entity_id(anchor), self.relation_id(relation))
        return [self.entities.names[i] for i in ids]

    def query_vector(self, side: Side, anchor: int, relation: int) -> np.ndarray:
        """(2d,) h o r for tail queries, conj(r) o t for head queries (|h o r - t| = |h - conj(r) o t|); an imported
        model's query as its scorer forms it (core.scorers.Scorer.side_query)."""
        return self.scorer.side_query(self.entity_embeddings[anchor], self.relation_embeddings, relation, side)

    def distances(self, query: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """Exact distance (RotatE: sum_i |q_i - e_i|) from query (2d,) to entities `ids` (all when None)."""
        return self.scorer.distances(query, self.entity_embeddings, ids)

    def _predict(self, side: Side, anchor_name: str, relation_name: str, k: int,
                 exclude_known: bool, *, exact: bool) -> list[Prediction]:
        if k < 1:
            raise ConfigError(f"k must be >= 1, not {k}")
        anchor, relation = self.entity_id(anchor_name), self.relation_id(relation_name)
        query = self.query_vector(side, anchor, relation)
        excluded = self.known.answers(side, anchor, relation) if exclude_known else np.zeros(0, dtype=np.int64)
        if exact or self.index is None:
            ids, dist = np.arange(self.num_entities), self.distances(query)
        else:
            ids, dist = self.index.certified_shortlist(query, k, excluded)
        ids, dist = rotate.top_k(ids, dist, k, excluded=excluded)
        names = self.entities.names
        return [(names[int(i)], self.scorer.score(d)) for i, d in zip(ids, dist, strict=True)]


def _plain_labels(labels: dict[str, Any]) -> dict[str, str]:
    """{id: label} of string labels; CoDEx's {"label": ...} objects (in bundles from before labels.relations)
    give their label."""
    plain = {name: value.get("label") if isinstance(value, dict) else value for name, value in labels.items()}
    return {name: label for name, label in plain.items() if isinstance(label, str) and label}


def _check_shapes(entity_embeddings: EntityTable, relation_embeddings: np.ndarray, entities: AnyVocab,
                  relations: Vocab, scorer: scorers.Scorer) -> None:
    """Refuse embeddings that do not fit each other or the vocabularies, naming what to fix."""
    n, width = entity_embeddings.shape
    num_rel, columns = relation_embeddings.shape
    if width % 2 or columns != scorer.relation_width(width // 2):
        raise ConfigError(f"entity embeddings have {width} columns and relations {columns}; this model's scorer "
                          f"reads entity rows of 2d columns and relation rows of {'d' if scorer.phases else '2d'}")
    if n != len(entities) or num_rel != scorer.relation_rows(len(relations)):
        raise ConfigError(f"{n} entity rows for {len(entities)} names, {num_rel} relation rows for "
                          f"{len(relations)} names{' (reciprocal: two rows a relation)' if scorer.reciprocal else ''}")


__all__ = ["HNSW_THRESHOLD", "LinkPredictor", "configure_threads"]
