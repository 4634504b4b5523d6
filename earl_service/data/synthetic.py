"""Synthetic knowledge graphs with power-law degrees and typed, Zipf-distributed relations, deterministic by seed.

The generative model, chosen to look like Freebase/Wikidata extracts rather than a uniform random graph:
- every entity has a type (type sizes are Zipf) and a popularity weight w = rank^-alpha (a random rank), so
  degrees follow a power law with a few hubs of tens of thousands of edges and a long tail of degree 1-3;
- relation frequencies are Zipf (a handful of relations hold most triples, as `/people/person/gender` does);
- relation r has a head type and a tail type; its heads and tails are drawn proportionally to w inside
  those types (preferential attachment), so relational features cluster by type as in real graphs;
- every entity gets at least one triple, duplicates are removed, and valid/test hold triples whose
  entities and relation all occur in train (earl_service.data.splits).

    python -m earl_service.data.synthetic --entities 1000000 --out data/synthetic-1m    # writes train/valid/test.tsv
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from earl_service.data.splits import take_out, unique_triples
from earl_service.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyntheticConfig:
    entities: int = 100_000
    triples_per_entity: float = 10.0  # train triples = entities * triples_per_entity
    relations: int = 200
    types: int = 50
    degree_alpha: float = 0.75  # popularity w_i = i^-alpha: degree tail P(k) ~ k^-(1 + 1/alpha), about k^-2.3
    relation_zipf: float = 1.1  # relation r (by rank) holds a share ~ r^-s of the triples
    type_zipf: float = 1.0
    valid: int = 5_000
    test: int = 5_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.entities < 2 or self.relations < 1 or self.types < 1 or self.triples_per_entity <= 0:
            raise ConfigError("entities >= 2, relations >= 1, types >= 1 and triples_per_entity > 0 are required")


@dataclass
class SyntheticKG:
    """Integer triples (head, relation, tail); entity ids 0..N-1, relation ids 0..R-1."""

    num_entities: int
    num_relations: int
    train: np.ndarray  # (E, 3) int64
    valid: np.ndarray
    test: np.ndarray

    def to_dataset(self):
        """The graph as an `earl_service.data.dataset.Dataset` with names e<i> / r<i> (no text files involved)."""
        from earl_service.data.dataset import Dataset
        from earl_service.data.vocab import Vocab

        return Dataset(entities=Vocab([f"e{i}" for i in range(self.num_entities)]),
                       relations=Vocab([f"r{i}" for i in range(self.num_relations)], kind="relation"),
                       num_train_entities=self.num_entities, train=self.train, valid=self.valid, test=self.test)

    def write_tsv(self, folder: str | os.PathLike, *, chunk: int = 1 << 20) -> Path:
        """train.tsv / valid.tsv / test.tsv with names e<i> and r<i>, written in chunks."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, triples in (("train", self.train), ("valid", self.valid), ("test", self.test)):
            tmp = folder / f".{name}.tsv.tmp"
            with tmp.open("w", encoding="utf-8", newline="\n") as f:
                for start in range(0, len(triples), chunk):
                    part = triples[start : start + chunk]
                    f.write("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in part.tolist()))
            os.replace(tmp, folder / f"{name}.tsv")
        return folder


def _zipf_shares(count: int, exponent: float) -> np.ndarray:
    w = np.arange(1, count + 1, dtype=np.float64) ** -exponent
    return w / w.sum()


def _draw(rng: np.random.Generator, members: np.ndarray, cumulative: np.ndarray, size: int) -> np.ndarray:
    """`size` draws from `members` with probability proportional to their weights (cumulative sums given)."""
    pos = np.searchsorted(cumulative, rng.random(size) * cumulative[-1], side="right")
    return members[np.minimum(pos, len(members) - 1)]


@dataclass
class Latent:
    """What the graph is drawn from: each entity's type and popularity, each relation's head and tail types.
    Relation `rel_perm[rank]` is the one of frequency rank `rank`, and head_type / tail_type are by rank."""

    entity_type: np.ndarray  # (N,)
    weight: np.ndarray  # (N,) popularity
    members: list[np.ndarray]  # by type: its entities
    head_type: np.ndarray  # (R,) by frequency rank
    tail_type: np.ndarray
    rel_perm: np.ndarray  # frequency rank -> relation id


def latent(config: SyntheticConfig, rng: np.random.Generator) -> Latent:
    """Draw the types, popularities and relation signatures (the first draws of `rng`, as generate makes them)."""
    n, num_rel = config.entities, config.relations
    types = min(config.types, n, num_rel)  # every type is then the head type and the tail type of some relation
    entity_type = rng.choice(types, size=n, p=_zipf_shares(types, config.type_zipf))
    weight = (rng.permutation(n) + 1.0) ** -config.degree_alpha  # (N,) popularity, a random rank per entity
    order = np.argsort(entity_type, kind="stable")
    bounds = np.searchsorted(entity_type[order], np.arange(types + 1))
    members = [order[bounds[k] : bounds[k + 1]] for k in range(types)]
    nonempty = np.array([len(m) > 0 for m in members])

    # Each relation links a head type to a tail type (large types more often); the first relations cover every
    # type once as head and once as tail, so every entity can receive a triple.
    type_p = np.where(nonempty, _zipf_shares(types, config.type_zipf), 0.0)
    type_p /= type_p.sum()
    head_type = rng.choice(types, size=num_rel, p=type_p)
    tail_type = rng.choice(types, size=num_rel, p=type_p)
    live = np.flatnonzero(nonempty)
    cover = min(num_rel, len(live))
    head_type[:cover] = rng.permutation(live)[:cover]
    tail_type[:cover] = rng.permutation(live)[:cover]
    rel_perm = rng.permutation(num_rel)  # relation ids do not reveal frequency rank
    return Latent(entity_type, weight, members, head_type, tail_type, rel_perm)


def generate(config: SyntheticConfig) -> SyntheticKG:
    """Draw the graph; the same config gives the same arrays on every machine (numpy PCG64)."""
    cfg = config
    rng = np.random.default_rng(cfg.seed)
    n, num_rel = cfg.entities, cfg.relations
    drawn = latent(cfg, rng)
    entity_type, members, head_type, tail_type, rel_perm = (drawn.entity_type, drawn.members, drawn.head_type,
                                                            drawn.tail_type, drawn.rel_perm)
    cumulative = [np.cumsum(drawn.weight[m]) for m in members]

    target = round(n * cfg.triples_per_entity) + cfg.valid + cfg.test
    shares = _zipf_shares(num_rel, cfg.relation_zipf)
    triples = np.zeros((0, 3), dtype=np.int64)
    for _ in range(20):  # popular (hub, relation) pairs repeat: draw more until enough distinct triples remain
        missing_count = target - len(triples)
        if missing_count <= 0:
            break
        counts = rng.multinomial(int(missing_count * 1.1) + 16, shares)
        parts = [triples]
        for rank in np.flatnonzero(counts):
            size, a, b = int(counts[rank]), head_type[rank], tail_type[rank]
            h = _draw(rng, members[a], cumulative[a], size)
            t = _draw(rng, members[b], cumulative[b], size)
            parts.append(np.stack([h, np.full(size, rel_perm[rank]), t], 1))
        triples = unique_triples(np.concatenate(parts), n, num_rel)
    triples = triples[rng.permutation(len(triples))[:target]]

    # Entities never drawn get one triple each, as head of a relation whose head type is theirs (or tail).
    seen = np.zeros(n, dtype=bool)
    seen[triples[:, 0]] = True
    seen[triples[:, 2]] = True
    missing = np.flatnonzero(~seen)
    if missing.size:
        triples = np.concatenate([_cover(rng, missing, entity_type, head_type, tail_type, rel_perm, members,
                                         cumulative), triples])
        triples, _ = take_out(triples, len(missing), n, num_rel)  # back to `target` triples, nobody left without one
    train, held_out = take_out(triples, cfg.valid + cfg.test, n, num_rel)
    valid, test = held_out[: cfg.valid], held_out[cfg.valid :]
    return SyntheticKG(n, num_rel, np.ascontiguousarray(train), valid, test)


def _cover(rng, missing, entity_type, head_type, tail_type, rel_perm, members, cumulative) -> np.ndarray:
    rows = []
    by_head = {int(k): np.flatnonzero(head_type == k) for k in np.unique(head_type)}
    by_tail = {int(k): np.flatnonzero(tail_type == k) for k in np.unique(tail_type)}
    for k in np.unique(entity_type[missing]):
        ents = missing[entity_type[missing] == k]
        if int(k) in by_head:
            ranks = rng.choice(by_head[int(k)], size=len(ents))
            others = np.array([_draw(rng, members[tail_type[r]], cumulative[tail_type[r]], 1)[0] for r in ranks])
            rows.append(np.stack([ents, rel_perm[ranks], others], 1))
        else:
            ranks = rng.choice(by_tail[int(k)], size=len(ents))
            others = np.array([_draw(rng, members[head_type[r]], cumulative[head_type[r]], 1)[0] for r in ranks])
            rows.append(np.stack([others, rel_perm[ranks], ents], 1))
    return np.concatenate(rows).astype(np.int64)


def oracle_ranks(kg: SyntheticKG, drawn: Latent, triples: np.ndarray, *, typed: bool = True) -> dict[str, np.ndarray]:
    """Filtered ranks ("tail", "head") of `triples` as the generator's own odds order the answers: by popularity
    inside the relation's tail (head) type (`typed`), or by popularity alone over every entity. Heads and tails are
    drawn independently given the relation, so no model ranks better in expectation than the typed order: it is
    the graph's ceiling. Entities outside the type (no chance) tie behind it, realistic ranks as evaluate's."""
    n, rank_of = kg.num_entities, np.argsort(drawn.rel_perm)  # relation id -> frequency rank
    pool = drawn.members if typed else [np.arange(n)]
    ascending = [np.sort(drawn.weight[m]) for m in pool]
    kind_of = drawn.entity_type if typed else np.zeros(n, dtype=np.int64)
    known = np.concatenate([kg.train, kg.valid, kg.test])
    ranks = {}
    for side, anchor, target, side_type in (("tail", 0, 2, drawn.tail_type), ("head", 2, 0, drawn.head_type)):
        keys = known[:, anchor] * kg.num_relations + known[:, 1]
        order = np.argsort(keys, kind="stable")
        keys, answers = keys[order], known[order, target]
        out = np.empty(len(triples))
        for i, (head, relation, tail) in enumerate(triples.tolist()):
            query, answer = (head if side == "tail" else tail) * kg.num_relations + relation, (tail if side == "tail" else head)
            kind = int(side_type[rank_of[relation]]) if typed else 0
            known_answers = answers[np.searchsorted(keys, query) : np.searchsorted(keys, query, side="right")]
            others = known_answers[known_answers != answer]
            inside = others[kind_of[others] == kind]  # known answers the filter takes out of the ranking
            w = drawn.weight[answer]
            if kind_of[answer] == kind:  # ties (equal popularity) count half, as evaluate counts equal distances
                below, upto = np.searchsorted(ascending[kind], w), np.searchsorted(ascending[kind], w, side="right")
                above = len(ascending[kind]) - upto - int((drawn.weight[inside] > w).sum())
                tied = upto - below - 1 - int((drawn.weight[inside] == w).sum())
                out[i] = 1 + above + tied / 2
            else:  # no chance under the generator: tied with the rest of the entities outside the type
                tied = n - len(ascending[kind]) - (len(others) - len(inside))
                out[i] = len(ascending[kind]) - len(inside) + (tied + 1) / 2
        ranks[side] = out
    return ranks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m earl_service.data.synthetic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entities", type=int, default=SyntheticConfig.entities)
    p.add_argument("--triples-per-entity", type=float, default=SyntheticConfig.triples_per_entity)
    p.add_argument("--relations", type=int, default=SyntheticConfig.relations)
    p.add_argument("--types", type=int, default=SyntheticConfig.types)
    p.add_argument("--valid", type=int, default=SyntheticConfig.valid)
    p.add_argument("--test", type=int, default=SyntheticConfig.test)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for train.tsv, valid.tsv, test.tsv")
    a = p.parse_args(argv)
    kg = generate(SyntheticConfig(entities=a.entities, triples_per_entity=a.triples_per_entity, relations=a.relations,
                                  types=a.types, valid=a.valid, test=a.test, seed=a.seed))
    kg.write_tsv(a.out)
    print(f"{a.out}: {kg.num_entities} entities, {kg.num_relations} relations, {len(kg.train)} train, "
          f"{len(kg.valid)} valid, {len(kg.test)} test triples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
