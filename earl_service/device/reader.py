"""Edge reader: rebuild embeddings from a bundle and answer link prediction with numpy and safetensors only.

No torch, no faiss: this module and what it imports (bundle_format, data, core, and predict, whose exact path
loads neither) run on any device with numpy.
When scipy is importable its C sparse products do the graph sums, several times faster than numpy alone
(bench/results/rebuild.md; `pip install earl-service[edge]`); the results agree within float32 rounding. The
maths mirrors earl_service.model.modules exactly (see there for the equations), in float32; kNResEnt is core.knn's,
the same search the torch encoder reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from earl_service.bundle.decode import DecodedBundle, decode
from earl_service.bundle.format import read_safetensors
from earl_service.core import knn as core_knn
from earl_service.device.model import EdgeModel
from earl_service.errors import BundleError

_CHUNK = 1 << 16  # edges per gather chunk: bounds the (chunk, 2d) temporaries

Operator = Callable[[np.ndarray], np.ndarray]


def scipy_sparse(use_scipy: bool | None = None) -> ModuleType | None:
    """scipy.sparse for the graph sums, or None for the numpy path. use_scipy None: scipy when importable;
    True: scipy, or ImportError; False: numpy."""
    if use_scipy is False:
        return None
    try:
        from scipy import sparse
    except ImportError:
        if use_scipy:
            raise
        return None
    return sparse


def _operator(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int, n_cols: int,
              sparse: ModuleType | None) -> Operator:
    """dense -> out with out[i] = sum_j vals_j * dense[cols_j] over entries with rows_j == i (`rows` sorted),
    built once and applied to every table that shares the sparsity: a scipy CSR matrix, or the numpy loop."""
    if sparse is not None:  # COO -> CSR sums duplicate entries, as the loop in _spmm does
        matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(n_rows, n_cols))
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


@dataclass(frozen=True)
class _Operators:
    """The sparse sums every layer reuses, all divided by c_e: relation ends and neighbours, out- and in-edges."""

    rel_out: Operator  # (R, 2d) -> (N, 2d): sum over e's out-edges of table[r] / c_e
    rel_in: Operator
    ent_out: Operator  # (N, 2d) -> (N, 2d): sum over e's out-edges (e, r, t) of table[t] / c_e
    ent_in: Operator

    @classmethod
    def of(cls, triples: np.ndarray, n: int, num_rel: int, sparse: ModuleType | None) -> _Operators:
        h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
        degree = (np.bincount(h, minlength=n) + np.bincount(t, minlength=n)).astype(np.float64)
        inv = np.divide(1.0, degree, out=np.zeros(n), where=degree > 0).astype(np.float32)
        out_order, in_order = np.argsort(h, kind="stable"), np.argsort(t, kind="stable")  # entries sorted by row
        h_out, r_out, t_out = h[out_order], r[out_order], t[out_order]
        t_in, r_in, h_in = t[in_order], r[in_order], h[in_order]
        return cls(_operator(h_out, r_out, inv[h_out], n, num_rel, sparse),
                   _operator(t_in, r_in, inv[t_in], n, num_rel, sparse),
                   _operator(h_out, t_out, inv[h_out], n, n, sparse),
                   _operator(t_in, h_in, inv[t_in], n, n, sparse))

    def conrel(self, table_out: np.ndarray, table_in: np.ndarray) -> np.ndarray:
        """sum over e's edges / c_e of the relation-end rows: out-edges use table_out[r], in-edges table_in[r]."""
        return self.rel_out(table_out) + self.rel_in(table_in)


def encode(bundle: DecodedBundle, *, use_scipy: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Entity (N, 2d) and relation (R, d) embeddings, as EARL.forward computes them (scipy_sparse(use_scipy)); RotatE's
    and an imported model's are the stored tables."""
    p, cfg = bundle.params, bundle.config
    if cfg.model != "earl":
        return p["entities"], p["relations"]
    if not (cfg.uses_conrel or cfg.uses_knn):
        raise BundleError("the no_conrel_knn ablation draws torch random inputs; the edge reader cannot rebuild it")
    ops = _Operators.of(bundle.triples, len(bundle.entities), len(bundle.relations), scipy_sparse(use_scipy))
    hidden = _initial(bundle, ops)
    rel = p["relations"]
    width = 2 * cfg.dim
    for i in range(cfg.gnn_layers):
        g = f"gnn.{i}."
        w = np.concatenate([p[g + "out_ent.weight"], p[g + "in_ent.weight"], p[g + "self_loop.weight"]])
        proj = hidden @ w.T  # (N, 3 * 2d): out, in, self transforms
        rel_out = rel @ p[g + "out_rel.weight"].T + p[g + "out_rel.bias"] + p[g + "out_ent.bias"]
        rel_in = rel @ p[g + "in_rel.weight"].T + p[g + "in_rel.bias"] + p[g + "in_ent.bias"]
        msg = ops.ent_out(proj[:, :width])  # out-neighbours
        msg += ops.ent_in(proj[:, width : 2 * width])  # in-neighbours
        msg += ops.conrel(rel_out, rel_in)
        hidden = msg + proj[:, 2 * width :] + p[g + "self_loop.bias"]
        rel = _linear(rel, p, g + "rel_update")
        if i < cfg.gnn_layers - 1:
            hidden, rel = _relu(hidden), _relu(rel)
    return hidden.astype(np.float32), rel.astype(np.float32)


def _initial(bundle: DecodedBundle, ops: _Operators) -> np.ndarray:
    """h^0 (N, 2d): f_m([ConRel; kNResEnt]) for every entity, own rows for reserved entities (EARL.initial)."""
    p, cfg = bundle.params, bundle.config
    num_rel, width = len(bundle.relations), 2 * cfg.dim
    first_w, pre = p["combine.0.weight"], p["combine.0.bias"]
    offset = 0
    if cfg.uses_conrel:
        ends = p["relation_ends"] @ p["conrel_mlp.0.weight"].T  # (2R, 2d)
        x = _relu(ops.conrel(ends[:num_rel], ends[num_rel:]) + p["conrel_mlp.0.bias"])
        conrel = _linear(x, p, "conrel_mlp.2")
        pre = pre + conrel @ first_w[:, :width].T
        offset = width
    if cfg.uses_knn:
        features = core_knn.relational_features(bundle.triples, len(bundle.entities), num_rel)
        ids, weights = core_knn.nearest_reserved(features, bundle.reserved, cfg.k, cfg.knn_temperature)
        res = p["reserved_embeddings"] @ first_w[:, offset : offset + width].T  # (N_res, 2d)
        pre = pre + np.einsum("nk,nkd->nd", weights, res[ids], optimize=True)
    hidden = _linear(_relu(pre.astype(np.float32)), p, "combine.2").astype(np.float32)
    if "reserved_embeddings" in p:  # as EARL.initial: absent without reserved entities
        hidden[bundle.reserved] = p["reserved_embeddings"]
    return hidden


def load(path: str | os.PathLike, *, use_scipy: bool | None = None) -> EdgeModel:
    """Verify a bundle (format, version, checksum and every check of core.decode, as load_bundle does) and
    rebuild every embedding with numpy; use_scipy as in scipy_sparse."""
    meta, tensors, _ = read_safetensors(path)
    bundle = decode(meta, tensors, source=str(path))
    ent, rel = encode(bundle, use_scipy=use_scipy)
    return EdgeModel(bundle.config.to_dict(), bundle.entities, bundle.relations, ent, rel, bundle.triples,
                     bundle.relation_labels, bundle.entity_labels)
