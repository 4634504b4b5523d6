"""New entities without retraining, measured on CoDEx-S.

Hold out 5% of the training entities and every training triple that mentions them; train EARL on the rest;
then `extend` the bundle with the held-out training triples (new entities connected to known ones). Report
filtered test MRR on the test triples that mention a held-out entity, for:
  - the extended bundle (trained encoders, never saw these entities),
  - the same graph with an untrained encoder (random weights: the floor),
  - EARL trained on the full training set (saw them: the ceiling).

    python bench/extend.py            # 1500 steps per model
    python bench/extend.py --quick    # 300 steps
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results

from earl_service.bundle.model_io import bundle_from_model, load_bundle
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import Dataset, load_dataset
from earl_service.data.vocab import Vocab
from earl_service.model.modules import EARL
from earl_service.train.evaluate import KnownAnswers, rank_triples, summarize
from earl_service.train.loop import BUNDLE, train


def names_of(ds: Dataset, triples: np.ndarray) -> list[tuple[str, str, str]]:
    return [(ds.entities.name(h), ds.relations.name(r), ds.entities.name(t)) for h, r, t in triples.tolist()]


def to_ids(bundle, triples: list[tuple[str, str, str]]) -> np.ndarray:
    e, r = bundle.entities, bundle.relations
    return np.array([[e.id(h), r.id(rel), e.id(t)] for h, rel, t in triples], dtype=np.int64).reshape(-1, 3)


def mrr(bundle, test_ids: np.ndarray, all_ids: np.ndarray) -> dict:
    known = KnownAnswers(all_ids, len(bundle.relations))
    ranks = rank_triples(bundle.entity_embeddings(), bundle.relation_embeddings(), bundle.scorer, test_ids, known)
    return summarize(ranks)["both"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--holdout", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    steps = 300 if args.quick else args.steps
    ds = load_dataset(args.datasets / "codex-s")
    rng = np.random.default_rng(args.seed)
    held = rng.choice(ds.num_train_entities, int(args.holdout * ds.num_train_entities), replace=False)
    is_held = np.zeros(ds.num_entities, dtype=bool)
    is_held[held] = True

    def mentions(t):
        return is_held[t[:, 0]] | is_held[t[:, 2]]

    kept_train, new_train = ds.train[~mentions(ds.train)], ds.train[mentions(ds.train)]
    # Test triples about a held-out entity whose other end is known (or also held out and introduced).
    test = ds.test[mentions(ds.test)]
    all_named = names_of(ds, np.concatenate([ds.train, ds.valid, ds.test]))
    test_named = names_of(ds, test)

    # The reduced dataset: vocabularies rebuilt from the kept training triples only.
    kept_names = names_of(ds, kept_train)
    ents = Vocab(list(dict.fromkeys(n for h, _, t in kept_names for n in (h, t))))
    rels = Vocab(list(dict.fromkeys(r for _, r, _ in kept_names)), kind="relation")
    reduced = Dataset(ents, rels, len(ents), np.array([[ents.id(h), rels.id(r), ents.id(t)] for h, r, t in kept_names]))
    cfg, tcfg = ModelConfig(dim=args.dim, seed=args.seed), TrainConfig(steps=steps, eval_every=0, progress=False, threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train(reduced, cfg, tcfg, tmp / "reduced", final_eval=False)
        new_file = tmp / "new.tsv"
        new_file.write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in names_of(ds, new_train)))
        extended = load_bundle(tmp / "reduced" / BUNDLE).extend(new_file)
        ext_ids = to_ids(extended, [x for x in all_named if x[1] in extended.relations])
        test_ids = to_ids(extended, [x for x in test_named if x[1] in extended.relations])
        result = {"extended": mrr(extended, test_ids, ext_ids)}
        untrained = bundle_from_model(EARL(cfg, len(extended.relations), torch.from_numpy(extended.reserved)), cfg,
                                      extended.entities, extended.relations, extended.triples)
        result["untrained_encoder"] = mrr(untrained, test_ids, ext_ids)
        train(ds, cfg, tcfg, tmp / "full", final_eval=False)
        full = load_bundle(tmp / "full" / BUNDLE)
        result["fully_trained"] = mrr(full, to_ids(full, test_named), to_ids(full, all_named))
    counts = {"held_out_entities": len(held), "held_out_train_triples": len(new_train),
              "test_triples": len(test), "steps": steps, "dim": args.dim}
    rows = [[label, result[key]["mrr"], result[key]["hits_at_10"], result[key]["count"]] for key, label in (
        ("extended", "extended bundle (trained encoders, entities unseen in training)"),
        ("untrained_encoder", "same graph, untrained encoder"), ("fully_trained", "trained on all entities"))]
    md = ["# New entities without retraining (CoDEx-S)", "",
          f"{counts['held_out_entities']} entities ({args.holdout:.0%}) and their {counts['held_out_train_triples']} "
          f"training triples held out; {counts['test_triples']} test triples mention them (ranked both directions). "
          f"EARL dim {args.dim}, {steps} steps.", "",
          md_table(["model", "test MRR", "Hits@10", "rankings"], rows)]
    js, mdp = write_results("extend_quick" if args.quick else "extend", {"counts": counts, "results": result},
                            "\n".join(md))
    print(mdp.read_text())


if __name__ == "__main__":
    main()
