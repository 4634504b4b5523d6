"""`earl import` of PyKEEN models trained here (CoDEx-S, 2 epochs): our scores and filtered ranks are PyKEEN's own,
at fp32; int8 and pq bundles of them answer in both readers alike. Skipped where pykeen is not installed (CI installs
it: the Makefile's venv has the bench extra)."""

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import codex_s_path
from safetensors import safe_open

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.device import load
from earl_service.errors import ModelImportError
from earl_service.imports import read_model
from earl_service.serve.predictor import LinkPredictor

pykeen = pytest.importorskip("pykeen", reason="the pykeen extra (pip install 'earl-service[pykeen]'); CI has it")

# PyKEEN model name and keywords -> the scorer its import gets.
MODELS = {"TransE": ({"scoring_fct_norm": 1}, "transe-l1"), "TransE-L2": ({"scoring_fct_norm": 2}, "transe-l2"),
          "DistMult": ({}, "distmult"), "ComplEx": ({}, "complex"), "RotatE": ({}, "rotate-l2")}
TEST_TRIPLES = 150


@pytest.fixture(scope="module")
def codex():
    from pykeen.triples import TriplesFactory

    root = codex_s_path()
    train = TriplesFactory.from_path(root / "train.txt")
    test = TriplesFactory.from_path(root / "test.txt", entity_to_id=train.entity_to_id,
                                    relation_to_id=train.relation_to_id)
    return train, test.mapped_triples[:TEST_TRIPLES]


@pytest.fixture(scope="module")
def trained(codex, tmp_path_factory):
    """name -> (PyKEEN folder, its model, our bundle of it): each trained 2 epochs with PyKEEN's pipeline and saved
    with save_to_directory, then imported with `earl import` (its graph: the training triples)."""
    from pykeen.pipeline import pipeline
    from pykeen.triples import TriplesFactory

    train, test = codex
    root = tmp_path_factory.mktemp("pykeen")
    torch.set_num_threads(1)
    out = {}
    for name, (kwargs, _) in MODELS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = pipeline(training=train, testing=TriplesFactory(test, train.entity_to_id, train.relation_to_id),
                              model=name.split("-")[0], model_kwargs={"embedding_dim": 16, **kwargs},
                              training_kwargs={"num_epochs": 2, "batch_size": 1024, "use_tqdm": False},
                              evaluation_kwargs={"use_tqdm": False, "batch_size": 256}, random_seed=0, device="cpu")
        result.save_to_directory(root / name)
        assert main(["import", str(root / name), "--out", str(root / f"{name}.safetensors")]) == 0
        out[name] = (root / name, result.model.eval(), root / f"{name}.safetensors")
    return out


@pytest.mark.parametrize("name", MODELS)
def test_scores_equal_pykeens(trained, codex, name, capsys):
    """score_t / score_h / score_hrt of PyKEEN and our distances (minus them) agree within 1e-5 of each query's
    largest score: relative for the norms, and for the products (DistMult, ComplEx) whose scores cross zero."""
    folder, model, path = trained[name]
    edge = load(path)
    assert edge.model == MODELS[name][1] and edge.index_kind == "exact"
    _, test = codex
    with torch.no_grad():
        tails, heads = model.score_t(test[:, :2]).numpy(), model.score_h(test[:, 1:]).numpy()  # (B, N)
        triples = model.score_hrt(test).numpy()[:, 0]  # (B,)
    for i, (h, r, t) in enumerate(test.numpy()):
        ours = -edge.distances(edge.query_vector("tail", h, r))
        np.testing.assert_allclose(ours, tails[i], rtol=1e-5, atol=1e-5 * np.abs(tails[i]).max())
        ours = -edge.distances(edge.query_vector("head", t, r))
        np.testing.assert_allclose(ours, heads[i], rtol=1e-5, atol=1e-5 * np.abs(heads[i]).max())
        score = edge.score(edge.entities.names[h], edge.relations.names[r], edge.entities.names[t])["score"]
        assert score == pytest.approx(float(triples[i]), rel=1e-5, abs=1e-5 * float(np.abs(tails[i]).max()))


@pytest.mark.parametrize("name", MODELS)
def test_filtered_ranks_equal_pykeens_evaluator(trained, codex, name, tmp_path):
    """Imported with --graph = train + test (what PyKEEN's filtered evaluation leaves out), `earl score`'s tail and
    head ranks are the realistic ranks PyKEEN's RankBasedEvaluator gives each test triple; on CoDEx-S all but one
    of 1,500 are equal, and a rank that differs does so by no more than the candidates tied with the answer within
    float32 rounding (1e-5 of the largest score)."""
    from pykeen.evaluation import RankBasedEvaluator

    folder, model, _ = trained[name]
    train, test = codex
    evaluator = RankBasedEvaluator(clear_on_finalize=False)
    evaluator.evaluate(model, test, additional_filter_triples=[train.mapped_triples], batch_size=256, use_tqdm=False)
    theirs = {side: np.concatenate(evaluator.ranks[side, "realistic"]) for side in ("tail", "head")}
    names = {i: n for n, i in train.entity_to_id.items()}, {i: n for n, i in train.relation_to_id.items()}
    graph = tmp_path / "known.txt"
    known = np.concatenate([train.mapped_triples.numpy(), test.numpy()])
    graph.write_text("".join(f"{names[0][h]}\t{names[1][r]}\t{names[0][t]}\n" for h, r, t in known))
    assert main(["import", str(folder), "--out", str(tmp_path / "b.safetensors"), "--graph", str(graph)]) == 0
    edge = load(tmp_path / "b.safetensors")
    ours = [edge.score(names[0][h], names[1][r], names[0][t]) for h, r, t in test.numpy()]
    with torch.no_grad():
        scores = {"tail": model.score_t(test[:, :2]).numpy(), "head": model.score_h(test[:, 1:]).numpy()}  # (B, N)
    for side, column in (("tail", 2), ("head", 0)):
        mine = np.array([s[f"{side}_rank"] for s in ours])
        assert (mine == theirs[side]).mean() >= 0.98
        for i in np.flatnonzero(mine != theirs[side]):  # a float32 near-tie may fall either way, and only that
            row = scores[side][i]
            near = np.abs(row - row[test[i, column]]) <= 1e-5 * np.abs(row).max()
            assert abs(mine[i] - theirs[side][i]) <= near.sum() - 1


def test_names_and_known_triples_are_pykeens(trained, codex):
    train, _ = codex
    bundle = load_bundle(trained["TransE"][2])
    assert bundle.entities.names == sorted(train.entity_to_id, key=train.entity_to_id.get)
    assert bundle.relations.names == sorted(train.relation_to_id, key=train.relation_to_id.get)
    assert {tuple(t) for t in bundle.triples.tolist()} == {tuple(t) for t in train.mapped_triples.tolist()}
    assert bundle.metrics["imported"] == {"format": "pykeen", "library": f"pykeen {pykeen.get_version()}",
                                          "class": "TransE", "scorer": "transe-l1", "source": "TransE"}


def test_complex_rows_were_interleaved_and_become_halves(trained):
    """PyKEEN's weight (N, 2d) holds re_0, im_0, re_1, ...; the bundle's rows hold re_0..re_{d-1}, im_0..."""
    for name in ("ComplEx", "RotatE"):
        _, model, path = trained[name]
        weight = model.entity_representations[0]._embeddings.weight.detach().numpy()  # (N, 2d) interleaved
        ours = load_bundle(path).params["entities"]
        d = weight.shape[1] // 2
        np.testing.assert_array_equal(ours[:, :d], weight[:, 0::2])
        np.testing.assert_array_equal(ours[:, d:], weight[:, 1::2])
    _, model, path = trained["RotatE"]
    relation = model.relation_representations[0](indices=None).detach()
    np.testing.assert_allclose(load_bundle(path).params["relations"], torch.angle(relation).numpy(), rtol=1e-6)


@pytest.mark.parametrize("precision", ["int8", "pq"])
@pytest.mark.parametrize("name", ["TransE", "ComplEx", "RotatE"])
def test_int8_and_pq_bundles_answer_alike_in_both_readers(trained, name, precision, tmp_path, capsys):
    """The imported tables at int8 (a scale per row) and pq (the entity table coded): smaller than fp32, and the
    numpy-only device reader gives the torch-side reader's top-k; the coded table stays close to the original."""
    folder, _, fp32 = trained[name]
    out = tmp_path / f"{precision}.safetensors"
    assert main(["import", str(folder), "--out", str(out), "--precision", precision]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["bytes"] < fp32.stat().st_size and printed["precision"] == precision
    bundle, original = load_bundle(out), load_bundle(fp32)
    assert bundle.precision.startswith(precision) and bundle.config == original.config
    with safe_open(out, "np") as f:
        coded = sorted(json.loads(f.metadata().get("pq_manifest", "{}")))
    assert coded == (["entities"] if precision == "pq" else [])
    # 2-epoch embeddings are close to random: 4 floats a code byte keep about 3/4 of each row.
    error = np.abs(bundle.params["entities"] - original.params["entities"]).mean()
    assert error < (0.01 if precision == "int8" else 0.4) * np.abs(original.params["entities"]).mean()
    edge, torch_side = load(out), LinkPredictor.from_bundle(bundle)
    for h, r, t in bundle.triples[:: len(bundle.triples) // 15][:15]:
        head, relation, tail = bundle.entities.names[h], bundle.relations.names[r], bundle.entities.names[t]
        assert edge.predict_tails(head, relation, 10) == torch_side.predict_tails(head, relation, 10)
        assert edge.predict_heads(tail, relation, 10) == torch_side.predict_heads(tail, relation, 10)


def test_the_model_without_pykeen_installed_is_a_clear_error(trained, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pykeen", None)  # import pykeen now raises ImportError
    with pytest.raises(ModelImportError, match=r"needs pykeen .*pip install 'earl-service\[pykeen\]'"):
        read_model(trained["TransE"][0])


@pytest.mark.parametrize("name", ["ComplEx", "RotatE", "TransE"])
def test_inverse_triples_answer_heads_through_the_inverse_relations(codex, tmp_path, name):
    """A model trained with create_inverse_triples holds 2R relation rows (r at 2r, r_inv at 2r + 1) and predicts
    heads as f(t, r_inv, *): imported with reciprocal relations, our tail and head scores are PyKEEN's predict_t and
    predict_h, and its filtered ranks PyKEEN's evaluator's (all but float32 near-ties)."""
    from pykeen.evaluation import RankBasedEvaluator
    from pykeen.pipeline import pipeline
    from pykeen.triples import TriplesFactory

    root = codex_s_path()
    train = TriplesFactory.from_path(root / "train.txt", create_inverse_triples=True)
    _, test = codex
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pipeline(training=train, testing=TriplesFactory(test, train.entity_to_id, train.relation_to_id),
                          model=name, model_kwargs={"embedding_dim": 16, **MODELS[name][0]},
                          training_kwargs={"num_epochs": 2, "batch_size": 1024, "use_tqdm": False},
                          evaluation_kwargs={"use_tqdm": False, "batch_size": 256}, random_seed=0, device="cpu")
    model = result.model.eval()
    assert model.use_inverse_triples and model.relation_representations[0].max_id == 2 * train.real_num_relations
    result.save_to_directory(tmp_path / "src")
    names = {i: n for n, i in train.entity_to_id.items()}, {i: n for n, i in train.relation_to_id.items()}
    known = np.concatenate([train.mapped_triples.numpy(), test.numpy()])
    (tmp_path / "known.txt").write_text("".join(f"{names[0][h]}\t{names[1][r]}\t{names[0][t]}\n" for h, r, t in known))
    assert main(["import", str(tmp_path / "src"), "--graph", str(tmp_path / "known.txt"),
                 "--out", str(tmp_path / "b.safetensors")]) == 0
    edge = load(tmp_path / "b.safetensors")
    assert edge.scorer.reciprocal and read_model(tmp_path / "src").source["reciprocal"]
    with torch.no_grad():
        scores = {"tail": model.predict_t(test[:, :2]).numpy(), "head": model.predict_h(test[:, 1:]).numpy()}
    for i, (h, r, t) in enumerate(test.numpy()[:50]):
        for side, anchor in (("tail", h), ("head", t)):
            ours = -edge.distances(edge.query_vector(side, anchor, r))
            want = scores[side][i]
            np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    evaluator = RankBasedEvaluator(clear_on_finalize=False)
    evaluator.evaluate(model, test, additional_filter_triples=[train.mapped_triples], batch_size=256, use_tqdm=False)
    ours = [edge.score(names[0][h], names[1][r], names[0][t]) for h, r, t in test.numpy()]
    for side in ("tail", "head"):
        theirs = np.concatenate(evaluator.ranks[side, "realistic"])
        assert (np.array([s[f"{side}_rank"] for s in ours]) == theirs).mean() >= 0.98
