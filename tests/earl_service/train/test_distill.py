"""Distillation (train/distill.py): the teacher's shortlists are its exact top candidates among the graph's entities,
ids mapped by name; the loss's teacher term is a KL divergence over them; a run trains with a teacher end to end."""

import json

import numpy as np
import pytest
import torch

from earl_service.bundle.model_io import load_bundle
from earl_service.config import ModelConfig, TrainConfig
from earl_service.core import scorers
from earl_service.data.dataset import load_dataset
from earl_service.errors import ConfigError
from earl_service.model.modules import RotatE
from earl_service.train.distill import Distill, Shortlists, distill_term
from earl_service.train.loop import train
from earl_service.train.loss import loss_fn
from tests.earl_service.imports.test_compress_imported import model_and_graph

CPU = torch.device("cpu")


def teacher_and_graph(root, kind):
    """An imported `kind` model over e0..e1999 and a graph of 150 train triples that also names an entity the
    teacher lacks (zz, in one train triple)."""
    bundle = model_and_graph(root, kind)
    with (root / "data" / "train.txt").open("a") as f:
        f.write("zz\tr1\te5\n")
    return bundle, load_dataset(root / "data", labels=False)


def brute_force(bundle, dataset, key, k):
    """The teacher's k nearest graph entities to one query key, by the numpy scorer over every row."""
    config = bundle.config
    scorer = scorers.scorer(config.model, gamma=config.gamma, epsilon=config.epsilon, dim=config.dim)
    entities, relations = bundle.entity_embeddings().numpy(), bundle.relation_embeddings().numpy()
    r = dataset.num_relations
    anchor, relation, head = key // 2 // r, key // 2 % r, bool(key % 2)
    names = dataset.entities.names[: dataset.num_train_entities]
    row = {name: i for i, name in enumerate(bundle.entities)}
    query = scorer.query(entities[row[names[anchor]]], relations[row_of(bundle.relations, dataset, relation)],
                         inverse=head)
    known = np.array([i for i, name in enumerate(names) if name in row])
    dist = scorer.distances(query, entities, np.array([row[names[i]] for i in known]))
    order = np.argsort(dist, kind="stable")[:k]
    return known[order], -dist[order]


def row_of(vocab, dataset, relation):
    return list(vocab).index(dataset.relations.names[relation])


@pytest.mark.parametrize("kind", ["complex", "transe-l1", "rotate-l2"])
def test_shortlists_are_the_teachers_exact_top_candidates(tmp_path, capsys, kind):
    source, dataset = teacher_and_graph(tmp_path, kind)
    capsys.readouterr()
    bundle = load_bundle(source)
    lists = Shortlists.build(dataset, TrainConfig(distill_from=str(source), distill_candidates=5), CPU)
    zz = dataset.entities.names.index("zz")
    assert lists.summary["entities_known"] == dataset.num_train_entities - 1  # zz is no candidate
    assert zz not in lists.ids
    for q in range(0, len(lists.keys), 7):
        key = int(lists.keys[q])
        anchor = key // 2 // dataset.num_relations
        if anchor == zz:
            assert not lists.taught[q]
            continue
        ids, logits = brute_force(bundle, dataset, key, 5)
        assert lists.taught[q]
        np.testing.assert_allclose(lists.logits[q].numpy(), logits, rtol=1e-4, atol=1e-4)
        # Ties aside (none in random floats), the same entities in the same order.
        assert lists.ids[q].tolist() == ids.tolist()


def test_a_batch_looks_up_its_queries_shortlists(tmp_path, capsys):
    source, dataset = teacher_and_graph(tmp_path, "complex")
    capsys.readouterr()
    lists = Shortlists.build(dataset, TrainConfig(distill_from=str(source), distill_candidates=4,
                                                  distill_temperature=2.0), CPU)
    batch = torch.as_tensor(dataset.train, dtype=torch.long)
    taught = lists.lookup(batch)
    r = dataset.num_relations
    for i in (0, 3, len(batch) - 1):
        h, rel, t = batch[i].tolist()
        tail = int(torch.searchsorted(lists.keys, torch.tensor(2 * (h * r + rel))))
        head = int(torch.searchsorted(lists.keys, torch.tensor(2 * (t * r + rel) + 1)))
        assert taught.tails[i].tolist() == lists.ids[tail].tolist()
        assert taught.heads[i].tolist() == lists.ids[head].tolist()
        assert torch.equal(taught.head_logits[i], lists.logits[head])
    zz = dataset.entities.names.index("zz")
    assert not taught.tail_taught[batch[:, 0] == zz].any() and taught.tail_taught[batch[:, 0] != zz].all()
    # The temperature divides the teacher's scores.
    plain = Shortlists.build(dataset, TrainConfig(distill_from=str(source), distill_candidates=4), CPU)
    torch.testing.assert_close(plain.logits, 2.0 * lists.logits)


def test_the_teacher_term_is_a_kl_divergence_over_taught_queries():
    teacher = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    same = distill_term(teacher + 3.0, Distill(teacher, torch.tensor([True, True]), 1.0))
    assert float(same) == pytest.approx(0.0, abs=1e-6)  # a shift changes no softmax
    student = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    p = torch.softmax(teacher[0], 0)
    kl = float((p * (p.log() - torch.log_softmax(student[0], 0))).sum())
    only_first = distill_term(student, Distill(teacher, torch.tensor([True, False]), 1.0))
    assert float(only_first) == pytest.approx(kl, rel=1e-5)
    assert float(distill_term(student, Distill(teacher, torch.tensor([False, False]), 1.0))) == 0.0


def test_the_loss_adds_the_weighted_term_to_the_triples_loss():
    gen = torch.Generator().manual_seed(0)
    scorer = RotatE(ModelConfig(model="rotate", dim=4, gamma=6.0, epsilon=2.0))
    entities, relations = torch.randn(30, 8, generator=gen), torch.randn(3, 4, generator=gen)
    batch = torch.tensor([[0, 1, 2], [3, 2, 4]])
    heads, tails = torch.randint(0, 30, (2, 6), generator=gen), torch.randint(0, 30, (2, 6), generator=gen)
    listed = torch.randint(0, 30, (2, 2, 3), generator=gen)  # each positive's head and tail shortlists
    teacher = Distill(torch.randn(4, 3, generator=gen), torch.tensor([True, True, False, True]), 0.5)
    plain = loss_fn(scorer, entities, relations, batch, heads, tails, 1.0)
    taught = loss_fn(scorer, entities, relations, batch, torch.cat([heads, listed[0]], 1),
                     torch.cat([tails, listed[1]], 1), 1.0, distill=teacher)
    query = torch.cat([scorer.rotate(entities[batch[:, 0]], relations[batch[:, 1]]),
                       scorer.rotate(entities[batch[:, 2]], relations[batch[:, 1]], inverse=True)])
    rows = entities[torch.cat([listed[1], listed[0]])]  # tails first, as the loss orders its queries
    student = scorer.gamma - torch.stack([scorer.distance(query, rows[:, j]) for j in range(3)], 1)
    expected = plain + 0.5 * distill_term(student, teacher)
    torch.testing.assert_close(taught, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["rotate", "earl"])
def test_a_run_trains_with_a_teacher(tmp_path, capsys, model):
    source, dataset = teacher_and_graph(tmp_path, "complex")
    capsys.readouterr()
    cfg = TrainConfig(steps=6, batch_size=32, negatives=8, eval_every=0, checkpoint_every=0, progress=False,
                      distill_from=str(source), distill_candidates=4)
    metrics = train(dataset, ModelConfig(model=model, dim=8), cfg,
                    tmp_path / "run", final_eval=False, curves=False)
    assert metrics["steps"] == 6 and metrics["distill"]["taught"] > 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["distill"]["candidates"] == 4
    with pytest.raises(ConfigError, match="sampled"):
        train(dataset, ModelConfig(model="earl", dim=8),
              TrainConfig(steps=1, sampled=True, progress=False, distill_from=str(source)), tmp_path / "s")
