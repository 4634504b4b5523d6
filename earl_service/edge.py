"""Edge reader: rebuild embeddings from a bundle and answer link prediction with numpy and safetensors only.

No torch, no faiss: this module and the two it imports (bundle_format, data) run on any device with numpy.
When scipy is importable its C sparse products do the graph sums (FB15k-237 rebuild: ~1.9 s instead of
~11 s with numpy alone; `pip install earl-service[edge]`); the results agree within float32 rounding. The
maths mirrors earl_service.model exactly (see there for the equations); float32 throughout except the
kNResEnt similarities, which use the same float64 rounding and tie-break as graph.nearest_reserved.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from .bundle_format import dequantize, read_safetensors, unpack_graph, unpack_strings
from .core import rotate
from .core.known import KnownAnswers, Side
from .data import Vocab
from .errors import ConfigError

SIM_STEPS = 10**9  # must equal earl_service.graph.SIM_STEPS
_CHUNK = 1 << 16  # edges per gather chunk: bounds the (chunk, 2d) temporaries

try:  # optional accelerator (module doc); EARL_EDGE_NO_SCIPY=1 forces the numpy path (tests use it)
    from scipy import sparse as _sparse

    if os.environ.get("EARL_EDGE_NO_SCIPY"):
        _sparse = None
except ImportError:
    _sparse = None


def _operator(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int, n_cols: int):
    """dense -> out with out[i] = sum_j vals_j * dense[cols_j] over entries with rows_j == i (`rows` sorted),
    built once and applied to every table that shares the sparsity: a scipy CSR matrix, or the numpy loop."""
    if _sparse is not None:  # COO -> CSR sums duplicate entries, as the loop in _spmm does
        matrix = _sparse.csr_matrix((vals, (rows, cols)), shape=(n_rows, n_cols))
        return lambda dense: np.asarray(matrix @ dense, dtype=dense.dtype)
    return lambda dense: _spmm(rows, cols, vals, dense, n_rows)


def _spmm(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, dense: np.ndarray, n_rows: int) -> np.ndarray:
    """out[i] = sum_j vals_j * dense[cols_j] over entries with rows_j == i; `rows` must be sorted."""
    out = np.zeros((n_rows, dense.shape[1]), dtype=dense.dtype)
    for start in range(0, len(rows), _CHUNK):
        r, c, v = rows[start : start + _CHUNK], cols[start : start + _CHUNK], vals[start : start + _CHUNK]
        if not len(r):
            continue
        contrib = dense[c] * v[:, None]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        out[r[starts]] += np.add.reduceat(contrib, starts, axis=0)
    return out


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


def _linear(x: np.ndarray, p: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def nearest_reserved(features_rows, features_cols, features_vals, n, width, reserved, k, temperature):
    """The k nearest reserved entities by rounded cosine similarity (same keys as the torch implementation)."""
    vals = features_vals.astype(np.float64)
    norms = np.zeros(n)
    np.add.at(norms, features_rows, vals * vals)
    inv = np.divide(1.0, np.sqrt(norms), out=np.zeros(n), where=norms > 0)
    unit = vals * inv[features_rows]
    position = np.full(n, -1)
    position[reserved] = np.arange(len(reserved))
    res_unit = np.zeros((len(reserved), width))
    is_res = position[features_rows] >= 0
    res_unit[position[features_rows[is_res]], features_cols[is_res]] = unit[is_res]
    k = min(k, len(reserved))
    tiebreak = (1 << 24) - 1 - np.arange(len(reserved), dtype=np.int64)
    order = np.argsort(features_rows, kind="stable")
    fr, fc, fu = features_rows[order], features_cols[order], unit[order]
    bounds = np.searchsorted(fr, np.arange(n + 1))
    block = max(1, (1 << 25) // max(1, len(reserved), width))
    ids = np.empty((n, k), dtype=np.int64)
    sims = np.empty((n, k))
    for start in range(0, n, block):
        stop = min(n, start + block)
        lo, hi = bounds[start], bounds[stop]
        rows = np.zeros((stop - start, width))
        rows[fr[lo:hi] - start, fc[lo:hi]] = fu[lo:hi]
        sim = np.round((rows @ res_unit.T) * SIM_STEPS).astype(np.int64)  # (b, N_res)
        key = sim * (1 << 24) + tiebreak
        top = np.argpartition(-key, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(key, top, 1), axis=1), 1)
        ids[start:stop] = top
        sims[start:stop] = np.take_along_axis(sim, top, 1) / SIM_STEPS
    logits = sims / temperature
    weights = np.exp(logits - logits.max(1, keepdims=True))
    return ids, (weights / weights.sum(1, keepdims=True)).astype(np.float32)


def encode(config: dict, params: dict[str, np.ndarray], reserved: np.ndarray, triples: np.ndarray,
           n: int, num_rel: int) -> tuple[np.ndarray, np.ndarray]:
    """Entity (N, 2d) and relation (R, d) embeddings, as EARL.forward computes them."""
    if config["model"] == "rotate":
        return params["entities"], params["relations"]
    dim = config["dim"]
    width = 2 * dim
    h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
    degree = (np.bincount(h, minlength=n) + np.bincount(t, minlength=n)).astype(np.float64)
    inv = np.divide(1.0, degree, out=np.zeros(n), where=degree > 0).astype(np.float32)
    # Entries of the message matrix as (row, col-kind, col, weight), one list per kind, sorted by row.
    out_order, in_order = np.argsort(h, kind="stable"), np.argsort(t, kind="stable")
    h_out, r_out, t_out = h[out_order], r[out_order], t[out_order]
    t_in, r_in, h_in = t[in_order], r[in_order], h[in_order]
    # The four sparse operators every layer reuses: relation ends and neighbours, out-edges and in-edges.
    rel_out_op = _operator(h_out, r_out, inv[h_out], n, num_rel)
    rel_in_op = _operator(t_in, r_in, inv[t_in], n, num_rel)
    ent_out_op = _operator(h_out, t_out, inv[h_out], n, n)
    ent_in_op = _operator(t_in, h_in, inv[t_in], n, n)

    def conrel_spmm(table_out: np.ndarray, table_in: np.ndarray) -> np.ndarray:
        """sum over e's edges / c_e of the relation-end rows: out-edges use table_out[r], in-edges table_in[r]."""
        return rel_out_op(table_out) + rel_in_op(table_in)

    uses_reserved = not config["no_reserved"] and config["reserved_ratio"] > 0
    uses_conrel = not (config["no_conrel"] or config["no_conrel_knn"])
    uses_knn = uses_reserved and not (config["no_knn"] or config["no_conrel_knn"])
    p = params
    if not (uses_conrel or uses_knn):
        raise ValueError("the no_conrel_knn ablation draws torch random inputs; the edge reader cannot rebuild it")
    first_w, pre = p["combine.0.weight"], p["combine.0.bias"]
    offset = 0
    if uses_conrel:
        ends = p["relation_ends"] @ p["conrel_mlp.0.weight"].T  # (2R, 2d)
        x = _relu(conrel_spmm(ends[:num_rel], ends[num_rel:]) + p["conrel_mlp.0.bias"])
        conrel = _linear(x, p, "conrel_mlp.2")
        pre = pre + conrel @ first_w[:, :width].T
        offset = width
    if uses_knn:
        rows = np.concatenate([h, t])
        cols = np.concatenate([r, r + num_rel])
        key = rows * (2 * num_rel) + cols
        uniq, counts = np.unique(key, return_counts=True)
        ids, weights = nearest_reserved(uniq // (2 * num_rel), uniq % (2 * num_rel), counts.astype(np.float64), n,
                                        2 * num_rel, reserved, config["k"], config["knn_temperature"])
        res = p["reserved_embeddings"] @ first_w[:, offset : offset + width].T  # (N_res, 2d)
        pre = pre + np.einsum("nk,nkd->nd", weights, res[ids], optimize=True)
    x = _relu(pre.astype(np.float32))
    hidden = _linear(x, p, "combine.2").astype(np.float32)
    if uses_reserved:
        hidden[reserved] = p["reserved_embeddings"]
    rel = p["relations"]
    layers = 0 if config["no_mulhop"] else config["layers"]
    for i in range(layers):
        g = f"gnn.{i}."
        w = np.concatenate([p[g + "out_ent.weight"], p[g + "in_ent.weight"], p[g + "self_loop.weight"]])
        proj = hidden @ w.T  # (N, 3 * 2d): out, in, self transforms
        rel_out = rel @ p[g + "out_rel.weight"].T + p[g + "out_rel.bias"] + p[g + "out_ent.bias"]
        rel_in = rel @ p[g + "in_rel.weight"].T + p[g + "in_rel.bias"] + p[g + "in_ent.bias"]
        msg = ent_out_op(proj[:, :width])  # out-neighbours
        msg += ent_in_op(proj[:, width : 2 * width])  # in-neighbours
        msg += conrel_spmm(rel_out, rel_in)
        hidden = msg + proj[:, 2 * width :] + p[g + "self_loop.bias"]
        rel = _linear(rel, p, g + "rel_update")
        if i < layers - 1:
            hidden, rel = _relu(hidden), _relu(rel)
    return hidden.astype(np.float32), rel.astype(np.float32)


@dataclass
class EdgeModel:
    config: dict
    entities: Vocab
    relations: Vocab
    entity_embeddings: np.ndarray  # (N, 2d) float32
    relation_embeddings: np.ndarray  # (R, d) float32
    triples: np.ndarray  # (E, 3) known triples
    relation_labels: dict[str, str]
    known: KnownAnswers = field(init=False, repr=False)  # the triples as a lookup of each query's answers

    def __post_init__(self) -> None:
        self.known = KnownAnswers(self.triples, len(self.relations))

    def predict_tails(self, head: str, relation: str, k: int = 10, *, exclude_known: bool = True):
        """Top-k tails of (head, relation, ?) as (entity, RotatE score), best first."""
        return self._predict("tail", head, relation, k, exclude_known)

    def predict_heads(self, tail: str, relation: str, k: int = 10, *, exclude_known: bool = True):
        """Top-k heads of (?, relation, tail), using |h o r - t| = |h - conj(r) o t|."""
        return self._predict("head", tail, relation, k, exclude_known)

    def _predict(self, side: Side, anchor_name: str, relation_name: str, k: int, exclude_known: bool,
                 ) -> list[tuple[str, float]]:
        """Every entity scored exactly, known answers dropped when asked; ties by id as in LinkPredictor."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, not {k}")
        anchor, relation = self.entities.id(anchor_name), self.relations.id(relation_name)
        scale = rotate.phase_scale(gamma=self.config["gamma"], epsilon=self.config["epsilon"], dim=self.config["dim"])
        query = rotate.query(self.entity_embeddings[anchor], self.relation_embeddings[relation], scale=scale,
                             inverse=side == "head")
        dist = rotate.distances(query, self.entity_embeddings)
        excluded = self.known.answers(side, anchor, relation) if exclude_known else None
        ids, dist = rotate.top_k(np.arange(len(dist)), dist, k, excluded=excluded)
        gamma = self.config["gamma"]
        return [(self.entities.name(int(i)), float(gamma - d)) for i, d in zip(ids, dist, strict=True)]


def load(path: str | os.PathLike) -> EdgeModel:
    """Verify a bundle (format, version, checksum) and rebuild every embedding with numpy."""
    meta, tensors, _ = read_safetensors(path)
    config = json.loads(meta["config"])
    entities = Vocab(unpack_strings(tensors["vocab.entities"]), kind="entity")
    relations = Vocab(unpack_strings(tensors["vocab.relations"]), kind="relation")
    triples = unpack_graph(tensors["graph.packed"])
    params = {name[len("param.") :]: dequantize(tensors, name) for name in tensors
              if name.startswith("param.") and not name.endswith(".scale")}
    reserved = tensors["buffer.reserved"].astype(np.int64)
    ent, rel = encode(config, params, reserved, triples, len(entities), len(relations))
    return EdgeModel(config, entities, relations, ent, rel, triples, json.loads(meta.get("relation_labels", "{}")))
