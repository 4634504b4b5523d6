"""Every scorer in numpy as a query vector and a distance to each candidate: RotatE, and the imported models'
TransE (L1, L2), DistMult, ComplEx and PyKEEN's RotatE (an L2 norm).

One convention: a distance, lower is better, as core.rotate's, so `rotate.top_k` and `rotate.realistic_rank` rank
every scorer. The source library's score is `score(distance)`: -distance for the imported ones (TransE and RotatE-L2
score minus a norm; DistMult and ComplEx a product, whose negation is the distance), gamma - distance for RotatE.
Entity rows are 2d floats; complex numbers are [re | im] halves (re_0..re_{d-1}, then im_0..im_{d-1}).

A reciprocal-relations model (LibKGE's `reciprocal_relations_model`) has 2R relation rows: rows R..2R-1 are the
inverse relations, and a head query (?, r, t) is the tail query (t, r + R, ?) through them (`side_query`), so its
head scores are not its tail scores of the same triple.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from earl_service.core import rotate
from earl_service.core.known import KnownAnswers

# The models a bundle may hold without training them here (`earl import`): the config's `model` names the scorer.
ImportedKind = Literal["transe-l1", "transe-l2", "distmult", "complex", "rotate-l2"]
IMPORTED: tuple[ImportedKind, ...] = get_args(ImportedKind)

RECIPROCAL_SUFFIX = "_reciprocal"  # the inverse relations' names where a table lists them (LibKGE's, `earl export`)

Distance = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (b, 2d) candidate rows, (2d,) query -> (b,)


def _l1(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    return np.abs(rows - query).sum(1)


def _l2(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    diff = rows - query
    return np.sqrt(np.einsum("bw,bw->b", diff, diff))


def _negative_dot(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    return -np.einsum("bw,w->b", rows, query)  # per row, not BLAS: a row scores alike in any block


def blocked(distance: Distance, query: np.ndarray, entities: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """distance(entities[ids], query) in blocks of rotate.BLOCK_ROWS rows (every row when ids is None) -> (M,)."""
    out = np.empty(len(entities) if ids is None else len(ids), dtype=np.float32)
    for start in range(0, len(out), rotate.BLOCK_ROWS):
        rows = slice(start, start + rotate.BLOCK_ROWS) if ids is None else ids[start : start + rotate.BLOCK_ROWS]
        out[start : start + rotate.BLOCK_ROWS] = distance(entities[rows], query)
    return out


def complex_product(x: np.ndarray, r: np.ndarray, *, conjugate: bool = False) -> np.ndarray:
    """x o r, or x o conj(r): x and r (.., 2d) as [re | im] halves -> (.., 2d)."""
    dim = x.shape[-1] // 2
    re, im = x[..., :dim], x[..., dim:]
    r_re, r_im = r[..., :dim], (-r[..., dim:] if conjugate else r[..., dim:])
    return np.concatenate([re * r_re - im * r_im, re * r_im + im * r_re], axis=-1).astype(np.float32)


@dataclass(frozen=True)
class Scorer(ABC):
    """A scorer: query(anchor, relation, inverse) then distances to candidate rows; inverse = a head query.
    `reciprocal`: head queries go through inverse relation rows (module doc); side_query picks the row."""

    reciprocal: bool = field(default=False, kw_only=True)
    formula: ClassVar[str]  # the source library's score, in words (docs, `earl export` tables' meta.json)
    complex_entities: ClassVar[bool] = False  # entity rows are d complex numbers, [re | im]
    phases: ClassVar[bool] = False  # relation rows are d rotations (phases), not 2d floats
    indexable: ClassVar[bool] = False  # the FAISS proxy index (serve/index.py) is RotatE's only

    @property
    def metric(self) -> str | None:
        """The FAISS metric whose order is this distance's ("ip": minus the dot product, "l2", "l1"), so that a flat
        index of it shortlists exactly (serve/metric.MetricIndex); None where there is none (RotatE's sum of
        moduli)."""
        return None

    def relation_width(self, dim: int) -> int:
        """Floats per relation row for entity rows of 2 * dim floats."""
        return dim if self.phases else 2 * dim

    def relation_rows(self, relations: int) -> int:
        """Rows of the relation table of a graph of `relations` relations: twice as many for a reciprocal model."""
        return 2 * relations if self.reciprocal else relations

    def side_query(self, entity: np.ndarray, relations: np.ndarray, relation: int, side: str) -> np.ndarray:
        """The query of (entity, relation, ?) (side "tail") or of (?, relation, entity) ("head") over the whole
        relation table: a reciprocal model's head query is the tail query through row relation + R."""
        if side == "head" and self.reciprocal:
            return self.query(entity, relations[relation + len(relations) // 2])
        return self.query(entity, relations[relation], inverse=side == "head")

    def relation_table(self, stored: np.ndarray) -> np.ndarray:
        """The relation rows as another tool reads them (`earl export --format`): phases in radians for a rotation,
        else as stored."""
        return stored

    @abstractmethod
    def query(self, entity: np.ndarray, relation: np.ndarray, *, inverse: bool = False) -> np.ndarray:
        """(.., 2d): the vector whose distance to a candidate row ranks it."""

    def distances(self, query: np.ndarray, entities: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """Exact distance from query (2d,) to entities[ids] (every row when None) -> (M,) float32."""
        return blocked(self.distance, query, entities, ids)

    @abstractmethod
    def distance(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """(b,) distances of candidate rows (b, 2d) to the query (2d,)."""

    def score(self, distance: float) -> float:
        """The source library's score of a distance (higher is better)."""
        return -float(distance)

    @abstractmethod
    def largest(self, entity_max: float, relation_max: float, width: int) -> float:
        """A bound on any number scoring reaches, for entries at most entity_max / relation_max, rows of width."""


@dataclass(frozen=True)
class RotatE(Scorer):
    """RotatE as trained here: sum_i |h_i r_i - t_i| over complex moduli; relations raw values, phase = value * scale."""

    scale: float = 1.0
    gamma: float = 0.0
    formula = "gamma - sum_i |h_i * r_i - t_i| (complex h, r, t)"
    complex_entities = True
    phases = True
    indexable = True

    def relation_table(self, stored: np.ndarray) -> np.ndarray:
        return (stored * np.float32(self.scale)).astype(np.float32)

    def query(self, entity: np.ndarray, relation: np.ndarray, *, inverse: bool = False) -> np.ndarray:
        return rotate.query(entity, relation, scale=self.scale, inverse=inverse)

    def distance(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        return rotate.distances(query, rows)

    def score(self, distance: float) -> float:
        return self.gamma - float(distance)

    def largest(self, entity_max: float, relation_max: float, width: int) -> float:
        return 9 * entity_max**2 * width  # decode._check_score_range's bound: an L2 index sums these squares


@dataclass(frozen=True)
class RotatEL2(Scorer):
    """PyKEEN's RotatE: ||h o r - t||_2 over all 2d reals; relations d phases in radians (unit moduli)."""

    formula = "-sqrt(sum_i |h_i * r_i - t_i|^2) (complex h, r, t; |r_i| = 1)"
    complex_entities = True
    phases = True

    metric = "l2"

    def distance(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        return _l2(rows, query)

    def query(self, entity: np.ndarray, relation: np.ndarray, *, inverse: bool = False) -> np.ndarray:
        return rotate.query(entity, relation, scale=1.0, inverse=inverse)  # |h o r - t| = |h - conj(r) o t|

    def largest(self, entity_max: float, relation_max: float, width: int) -> float:
        return 9 * entity_max**2 * width


@dataclass(frozen=True)
class TransE(Scorer):
    """-||h + r - t||_p: a tail query is h + r, a head query t - r, both compared to the candidate by the p-norm."""

    p: int = 1
    formula = "-||h + r - t||_p"

    @property
    def metric(self) -> str:
        return "l1" if self.p == 1 else "l2"

    def distance(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        return _l1(rows, query) if self.p == 1 else _l2(rows, query)

    def query(self, entity: np.ndarray, relation: np.ndarray, *, inverse: bool = False) -> np.ndarray:
        return (entity - relation if inverse else entity + relation).astype(np.float32)

    def largest(self, entity_max: float, relation_max: float, width: int) -> float:
        term = 2 * entity_max + relation_max  # |h + r - t| per coordinate
        return max(term, term**2) * width


@dataclass(frozen=True)
class DistMult(Scorer):
    """sum_i h_i r_i t_i: the query h o r (or t o r: DistMult is symmetric), the distance minus its dot product."""

    formula = "sum_i h_i * r_i * t_i"
    metric = "ip"

    def distance(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        return _negative_dot(rows, query)

    def query(self, entity: np.ndarray, relation: np.ndarray, *, inverse: bool = False) -> np.ndarray:
        return (entity * relation).astype(np.float32)

    def largest(self, entity_max: float, relation_max: float, width: int) -> float:
        return entity_max**2 * relation_max * width


@dataclass(frozen=True)
class ComplEx(Scorer):
    """Re(sum_i h_i r_i conj(t_i)): the query h o r for tails, t o conj(r) for heads (Re(z) = Re(conj(z))), then
    Re(q . conj(e)) is the real dot product of the [re | im] rows."""

    formula = "Re(sum_i h_i * r_i * conj(t_i)) (complex h, r, t)"
    complex_entities = True
    metric = "ip"

    def distance(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        return _negative_dot(rows, query)

    def query(self, entity: np.ndarray, relation: np.ndarray, *, inverse: bool = False) -> np.ndarray:
        return complex_product(entity, relation, conjugate=inverse)

    def largest(self, entity_max: float, relation_max: float, width: int) -> float:
        return 2 * entity_max**2 * relation_max * width


SCORERS: dict[str, Scorer] = {"transe-l1": TransE(1), "transe-l2": TransE(2), "distmult": DistMult(),
                              "complex": ComplEx(), "rotate-l2": RotatEL2()}
assert tuple(SCORERS) == IMPORTED


def scorer(model: str, *, gamma: float, epsilon: float, dim: int, reciprocal: bool = False) -> Scorer:
    """The scorer of a model kind: RotatE for the trained ones (earl, rotate), an imported one by its name; with
    inverse relation rows for head queries when `reciprocal` (an imported model's, RotatE's included)."""
    if model in SCORERS:
        return replace(SCORERS[model], reciprocal=True) if reciprocal else SCORERS[model]
    return RotatE(scale=rotate.phase_scale(gamma=gamma, epsilon=epsilon, dim=dim), gamma=float(gamma),
                  reciprocal=reciprocal)


RANK_BLOCK_ROWS = 16_384  # entity rows a ranking pass reads (and decodes, for a coded table) at a time
RANK_QUERIES = 256  # queries ranked against each block of rows


def filtered_ranks(scorer: Scorer, entities: Any, relations: np.ndarray, triples: np.ndarray,
                   known: KnownAnswers, *, side: Literal["tail", "head"]) -> np.ndarray:
    """(B,) realistic ranks of each triple's tail (or head) among all entities, other known answers (a
    core.known.KnownAnswers) left out: 1 + strictly nearer + ties / 2, as rotate.realistic_rank.

    `entities`: the (N, 2d) float32 table, or anything that reads like one (len, and rows by a slice or an id array
    as float32), such as a coded table decoded block by block (bundle/decode.StoredRows). The rows are read
    RANK_BLOCK_ROWS at a time and every one of RANK_QUERIES queries is ranked against each block, so a coded table
    is decoded once per RANK_QUERIES queries and never whole. Each query's own distance comes from the same per-row
    distance (a row scores alike in any block), so the counts are those of one pass over every row."""
    triples = np.asarray(triples, dtype=np.int64)
    inverse = side == "head"
    out = np.empty(len(triples), dtype=np.float64)
    n = len(entities)
    for first in range(0, len(triples), RANK_QUERIES):
        batch = triples[first : first + RANK_QUERIES]
        anchors, targets = (batch[:, 2], batch[:, 0]) if inverse else (batch[:, 0], batch[:, 2])
        anchor_rows, target_rows = entities[anchors], entities[targets]
        queries = [scorer.side_query(anchor_rows[i], relations, r, side) for i, r in enumerate(batch[:, 1])]
        mine = np.array([scorer.distance(target_rows[i : i + 1], q)[0] for i, q in enumerate(queries)])
        # ids that do not compete: the other known answers and the target itself
        left_out = [np.union1d(known.answers(side, int(a), int(r)), [t])
                    for a, r, t in zip(anchors, batch[:, 1], targets, strict=True)]
        better, ties = np.zeros(len(batch), np.int64), np.zeros(len(batch), np.int64)
        for start in range(0, n, RANK_BLOCK_ROWS):
            rows = entities[start : start + RANK_BLOCK_ROWS]
            for i, q in enumerate(queries):
                dist = scorer.distances(q, rows)
                ids = left_out[i]
                inside = ids[(ids >= start) & (ids < start + len(rows))] - start
                dist[inside] = np.nan  # compares false: neither nearer nor tied
                better[i] += np.count_nonzero(dist < mine[i])
                ties[i] += np.count_nonzero(dist == mine[i])
        out[first : first + len(batch)] = 1.0 + better + ties / 2.0
    return out


def largest_magnitude(x: np.ndarray, block: int = 65_536) -> float:
    """max |x| (0 for an empty array; NaN or infinite when x holds such a value), `block` rows at a time: np.abs
    of a whole table is a second table (1 GB beside a 1M x 256 float32 import)."""
    rows = x.reshape(len(x), math.prod(x.shape[1:])) if x.ndim else x.reshape(1, 1)
    peaks = [np.abs(rows[i : i + block]).max(initial=0.0) for i in range(0, len(rows), block)]
    return float(np.max(peaks, initial=0.0))  # np.max keeps a NaN


def fits_float32(scorer: Scorer, entities: np.ndarray, relations: np.ndarray) -> tuple[bool, float]:
    """(whether every number scoring these finite tables reaches stays finite in float32, that bound)."""
    bound = scorer.largest(largest_magnitude(entities), largest_magnitude(relations), max(entities.shape[-1], 1))
    return math.isfinite(bound) and bound < float(np.finfo(np.float32).max), bound


__all__ = ["IMPORTED", "RANK_BLOCK_ROWS", "RECIPROCAL_SUFFIX", "RANK_QUERIES", "SCORERS", "ComplEx", "DistMult", "ImportedKind", "RotatE", "RotatEL2", "Scorer", "TransE",
           "complex_product", "filtered_ranks", "fits_float32", "largest_magnitude", "scorer"]
