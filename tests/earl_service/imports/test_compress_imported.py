"""`earl compress --from`: an imported bundle at every precision under a byte budget, each size's filtered MRR on
the graph's valid split beside the original's, pq codebooks fine-tuned against the scorer and kept only when they
score better. The model: random tables whose graph is their own top answers, so the original ranks it near 1."""

import json
import shutil
import struct

import numpy as np
import pytest
import torch

from earl_service.bundle.codebooks import decode_table
from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.core import scorers
from earl_service.device import load
from earl_service.imports import sizes, tune
from earl_service.imports.compress import ImportedSearch, candidates, compress_imported, estimate, write_pick

N, R, D = 2000, 3, 16


def model_and_graph(root, kind="distmult", seed=0):
    """Arrays for `kind` (phases for rotate-l2) and a dataset folder of each (h, r)'s best tail by the scorer."""
    rng = np.random.default_rng(seed)
    entities = rng.normal(size=(N, 2 * D)).astype(np.float32)
    relations = (rng.uniform(-np.pi, np.pi, (R, D)) if kind == "rotate-l2" else rng.normal(size=(R, 2 * D)))
    relations = relations.astype(np.float32)
    (root / "src").mkdir(parents=True)
    np.save(root / "src" / "entity_embeddings.npy", entities)
    np.save(root / "src" / "relation_embeddings.npy", relations)
    (root / "src" / "entities.tsv").write_text("".join(f"e{i}\n" for i in range(N)))
    (root / "src" / "relations.tsv").write_text("".join(f"r{i}\n" for i in range(R)))
    scorer = scorers.SCORERS[kind]
    rows = []
    for h in rng.choice(N, 200, replace=False):
        r = int(rng.integers(R))
        dist = scorer.distances(scorer.query(entities[h], relations[r]), entities)
        dist[h] = np.inf
        rows.append((h, r, int(np.argmin(dist))))
    (root / "data").mkdir()
    for split, part in (("train", rows[:150]), ("valid", rows[150:180]), ("test", rows[180:])):
        (root / "data" / f"{split}.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in part))
    assert main(["import", str(root / "src"), "--scorer", kind, "--graph", str(root / "data"),
                 "--out", str(root / "b.safetensors")]) == 0
    return root / "b.safetensors"


def test_sizes_under_the_budget_with_their_mrr(tmp_path, capsys):
    bundle = model_and_graph(tmp_path)
    capsys.readouterr()
    fp32 = load_bundle(bundle).num_bytes
    search = ImportedSearch(max_bytes=fp32 // 3, time_limit_minutes=0.2)  # fine-tuning shares half: 6 s
    report = compress_imported(bundle, tmp_path / "out", search, graph=tmp_path / "data")
    rows = {r["precision"]: r for r in report["candidates"]}
    assert report["original"]["mrr"] > 0.5 and report["eval_triples"] == 30
    assert not rows["fp32"]["fits"] and not rows["fp16"]["fits"] and "bytes" not in rows["fp32"]  # ruled out early
    assert rows["int8"]["fits"] and abs(rows["int8"]["mrr"] - report["original"]["mrr"]) < 0.05
    fitting = [r for r in rows.values() if r.get("fits")]
    assert all(r["bytes"] <= search.max_bytes for r in fitting) and len(fitting) >= 3  # int8 and pq sizes
    pick = max(fitting, key=lambda r: (r["mrr"], -r["bytes"]))
    assert report["pick"] == pick["precision"]
    for row in fitting:
        if "fine_tune" in row:
            tuned = row["fine_tune"]
            assert tuned["steps"] > 0 and tuned["kept"] == (tuned["mrr_after"] > tuned["mrr_before"])
            assert row["mrr"] == pytest.approx(max(tuned["mrr_before"], tuned["mrr_after"]))
    # each size was scored from its file's tables as stored, rows decoded block by block: the same MRR as its
    # decoded bundle's
    from earl_service.imports.compress import filtered_mrr, read_graph

    graph = read_graph(tmp_path / "data", load_bundle(bundle))
    for row in fitting:
        written = load_bundle(tmp_path / "out" / row["path"])
        assert filtered_mrr(written, graph.splits["valid"], graph.known(R)) == row["mrr"], row["precision"]
    served = load(tmp_path / "out" / "bundle.safetensors")  # the pick answers in the numpy-only reader
    assert served.model == "distmult" and len(served.predict_tails("e0", "r1", 3)) == 3
    assert (tmp_path / "out" / "bundle.safetensors").stat().st_size <= search.max_bytes
    # The pick's file: the scored candidate's payload, with what was searched in its metrics beside the source's.
    picked = load_bundle(tmp_path / "out" / "bundle.safetensors")
    assert picked.sha256 == load_bundle(tmp_path / "out" / pick["path"]).sha256
    assert report["pick_metrics"] and picked.metrics["imported"] == load_bundle(bundle).metrics["imported"]
    summary = picked.metrics["compress"]
    assert summary["precision"] == pick["precision"] and summary["max_bytes"] == search.max_bytes
    assert summary["valid"] == {"mrr": pick["mrr"], "triples": 30} and summary["original"]["mrr"] == report[
        "original"]["mrr"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| original (fp32) |" in md and "**pick**" in md and "](frontier.png)" in md
    assert (tmp_path / "out" / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fine_tuning_time_goes_to_the_sizes_that_may_fit(tmp_path, capsys):
    """Half the time limit is shared by the pq sizes whose estimate fits; the others take none."""
    bundle = model_and_graph(tmp_path)
    capsys.readouterr()
    loaded = load_bundle(bundle)
    pq = [p for p in candidates(loaded, ImportedSearch(max_bytes=1)) if p.name.startswith("pq")]
    smallest = min(pq, key=lambda p: estimate(loaded, p))
    budget = estimate(loaded, smallest) + 1000  # the smallest pq size alone may fit (by its estimate)
    assert sum(estimate(loaded, p) <= budget for p in pq) == 1
    search = ImportedSearch(max_bytes=budget, time_limit_minutes=0.1)
    report = compress_imported(bundle, tmp_path / "out", search, graph=tmp_path / "data")
    row = next(r for r in report["candidates"] if r["precision"] == smallest.name)
    assert row["fine_tune"]["seconds"] == pytest.approx(3.0)  # all of half of 6 seconds


def test_a_stopped_search_continues_with_the_sizes_it_has_not_done(tmp_path, capsys, monkeypatch):
    """Each size's row is saved as it finishes (compress_state.json): a search stopped (a worker killed) and run
    again in the same folder scores only the sizes left, and a size whose file is gone again; another search's
    folder is refused."""
    from earl_service.errors import ConfigError
    from earl_service.imports import compress as imported_compress

    bundle = model_and_graph(tmp_path)
    capsys.readouterr()
    search = ImportedSearch(max_bytes=load_bundle(bundle).num_bytes // 3, time_limit_minutes=0.2)
    events = []
    stopped = compress_imported(bundle, tmp_path / "out", search, graph=tmp_path / "data",
                                on_progress=events.append, should_stop=lambda: len(events) >= 3)
    assert stopped is None and len(json.loads((tmp_path / "out" / "compress_state.json").read_text())["rows"]) == 3
    done = [e["precision"] for e in events]
    first_fit = next(r for r in json.loads((tmp_path / "out" / "compress_state.json").read_text())["rows"]
                     if r.get("fits"))
    (tmp_path / "out" / first_fit["path"]).unlink()  # its file is gone: scored again
    ran = []
    real_run = imported_compress.Search.run
    monkeypatch.setattr(imported_compress.Search, "run", lambda self, p, s: ran.append(p.name) or real_run(self, p, s))
    report = compress_imported(bundle, tmp_path / "out", search, graph=tmp_path / "data")
    assert first_fit["precision"] in ran and not set(ran) & (set(done) - {first_fit["precision"]})
    assert report["resumed_sizes"] == 3 - 1 and len(report["candidates"]) == len(done) + len(ran) - 1
    assert (tmp_path / "out" / "bundle.safetensors").is_file()
    with pytest.raises(ConfigError, match="other settings or another model"):
        compress_imported(bundle, tmp_path / "out", ImportedSearch(max_bytes=search.max_bytes // 2),
                          graph=tmp_path / "data")


def test_the_command_line(tmp_path, capsys):
    bundle = model_and_graph(tmp_path, kind="complex")
    capsys.readouterr()
    assert main(["compress", "--from", str(bundle), "--max-bytes", "1MB", "--time-limit", "0.5",
                 "--out", str(tmp_path / "out")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["pick"] == "fp32" and printed["original"]["mrr"] is None  # no graph: sizes, no MRR
    assert not (tmp_path / "out" / "frontier.png").exists()  # nothing scored, nothing to plot
    assert main(["compress", "--from", str(bundle), "--max-bytes", "2kB", "--out", str(tmp_path / "tiny")]) == 1
    assert json.loads(capsys.readouterr().out)["pick"] is None
    with pytest.raises(SystemExit):
        main(["compress", "--from", str(bundle), "--out", str(tmp_path / "x")])
    assert "required: --max-bytes" in capsys.readouterr().err
    assert main(["compress", "--max-bytes", "1MB", "--time-limit", "1", "--out", str(tmp_path / "x")]) == 2
    assert "needs a DATA folder" in capsys.readouterr().err


@pytest.mark.parametrize("candidates", [N, 64], ids=["every-entity", "sampled"])
def test_fine_tuning_lowers_the_whole_tables_loss_scoring_every_row_or_a_sample(tmp_path, capsys, candidates,
                                                                               monkeypatch):
    """Above tune.CANDIDATES entities a step scores the batch's own and a random sample (a sampled softmax, the
    table never decoded whole); either way the 1-N loss over every train triple goes down."""
    from earl_service.bundle.precision import ProductQuantized
    from earl_service.imports.compress import read_graph

    bundle = load_bundle(model_and_graph(tmp_path))
    capsys.readouterr()
    monkeypatch.setattr(tune, "CANDIDATES", candidates)
    codes, books = ProductQuantized(8).encode_tables(bundle.config, bundle.params, iterations=3)["entities"]
    relations, train = bundle.params["relations"], read_graph(tmp_path / "data", bundle).splits["train"]

    def loss(books):
        table = torch.from_numpy(decode_table(codes, books))
        h, r, t = (torch.from_numpy(train[:, i]) for i in range(3))
        logits = tune.logits("distmult", tune.query("distmult", table[h], torch.from_numpy(relations)[r],
                                                     inverse=False), table)
        return float(torch.nn.functional.cross_entropy(logits, t))

    tuned = tune.tune("distmult", codes, books, relations, train, tune.Tuning(seconds=30, steps=60))
    assert loss(tuned) < 0.9 * loss(books)


@pytest.mark.parametrize("kind", ["complex", "transe-l1"])
def test_fine_tuning_in_chunks_of_queries_equals_one_pass(monkeypatch, kind):
    """A step scores its queries a few at a time (tune.LOGITS bounds the logits held at once) and gathers their
    gradients before one pass into the codebooks: the codebooks it trains are those of scoring the batch at once."""
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 256, (300, 4), dtype=np.uint8)
    books = rng.normal(size=(4, 256, 2 * D // 4)).astype(np.float16)
    relations = rng.normal(size=(3, 2 * D)).astype(np.float32)
    train = np.stack([rng.integers(0, 300, 500), rng.integers(0, 3, 500), rng.integers(0, 300, 500)], 1)
    tuned = {}
    for logits in (10**9, 300 * 7):  # every query at once; 7 queries a chunk
        monkeypatch.setattr(tune, "LOGITS", logits)
        tuned[logits] = tune.tune(kind, codes, books, relations, train, tune.Tuning(seconds=60, steps=5, batch_size=64))
    assert not np.array_equal(tuned[10**9], books)
    np.testing.assert_allclose(tuned[300 * 7].astype(np.float32), tuned[10**9].astype(np.float32), atol=1e-3)


@pytest.mark.parametrize("reciprocal", [False, True], ids=["plain", "reciprocal"])
@pytest.mark.parametrize("kind", tune.TUNABLE)
def test_torch_twins_equal_the_numpy_scorers(kind, reciprocal):
    """Each query and distance, and with reciprocal relations (8 rows for 4 relations) head queries through the
    inverse rows, as core/scorers.py forms them."""
    rng = np.random.default_rng(3)
    entities = rng.normal(size=(50, 2 * D)).astype(np.float32)
    width = D if kind == "rotate-l2" else 2 * D
    relations = rng.uniform(-np.pi, np.pi, (8 if reciprocal else 4, width)).astype(np.float32)
    scorer = scorers.scorer(kind, gamma=1.0, epsilon=1.0, dim=D, reciprocal=reciprocal)
    ids = np.array([3, 0, 2, 1])
    for inverse in (False, True):
        q = tune.side_query(kind, torch.from_numpy(entities[:4]), torch.from_numpy(relations), torch.from_numpy(ids),
                            inverse=inverse, reciprocal=reciprocal)
        got = -tune.logits(kind, q, torch.from_numpy(entities)).numpy()
        for i, r in enumerate(ids):
            query = scorer.side_query(entities[i], relations, int(r), "head" if inverse else "tail")
            np.testing.assert_allclose(got[i], scorer.distances(query, entities), rtol=1e-4, atol=1e-4)
    if reciprocal:  # the head query is not the plain model's: the inverse rows are read
        plain = scorers.SCORERS[kind].query(entities[0], relations[3], inverse=True)
        assert not np.allclose(scorer.side_query(entities[0], relations, 3, "head"), plain)


def test_sizes_from_shapes_and_header_equal_the_searchs_estimates(tmp_path, capsys):
    """What the API checks a job's budget by (imports/sizes.py on the file's header and the model's shapes) is the
    estimate the search rules sizes out by; and a search reports each size and stops when asked."""
    path = model_and_graph(tmp_path)
    bundle = load_bundle(path)
    shapes = {name: tuple(v.shape) for name, v in bundle.params.items()}
    fixed = sizes.fixed_bytes(path)
    assert fixed == sum(v.nbytes for v in bundle.fixed_parts().values())  # no reserved entities: 8 below
    searched = candidates(bundle, ImportedSearch(max_bytes=1))
    assert [p.name for p in searched] == ["fp32", "fp16", "int8", "pq:16", "pq:8", "pq:4", "pq:2"]  # pq:32 > int8
    assert sizes.smallest("distmult", D, shapes, fixed_bytes=fixed) == min(
        (estimate(bundle, p) - 8, p.name) for p in searched)
    events: list[dict] = []
    stopped = compress_imported(path, tmp_path / "out", ImportedSearch(max_bytes=10**9, fine_tune=False),
                                on_progress=events.append, should_stop=lambda: len(events) == 2)
    assert stopped is None and [(e["step"], e["total"], e["precision"]) for e in events] == [
        (1, 7, "fp32"), (2, 7, "fp16")]


def test_the_picks_summary_is_left_out_where_it_would_not_fit_the_budget(tmp_path, capsys):
    bundle = model_and_graph(tmp_path)
    capsys.readouterr()
    (tmp_path / "out" / "candidates").mkdir(parents=True)
    scored = tmp_path / "out" / "candidates" / "fp32.safetensors"
    shutil.copyfile(bundle, scored)
    size = scored.stat().st_size
    report = {"source": "b.safetensors", "eval_triples": 0, "original": {"bytes": size, "precision": "fp32"}}
    pick = {"precision": "fp32", "path": "candidates/fp32.safetensors", "mrr": None}
    assert not write_pick(tmp_path / "out", {**report, "max_bytes": size}, pick)
    assert (tmp_path / "out" / "bundle.safetensors").read_bytes() == scored.read_bytes()
    assert write_pick(tmp_path / "out", {**report, "max_bytes": size + 1000}, pick)
    written = tmp_path / "out" / "bundle.safetensors"
    assert size < written.stat().st_size <= size + 1000
    assert struct.unpack("<Q", written.read_bytes()[:8])[0] % 8 == 0  # safetensors' padded header
    again = load_bundle(written)  # verified: the payload and its checksum as written
    assert again.sha256 == load_bundle(scored).sha256 and again.metrics["compress"]["from"] == "b.safetensors"
    assert np.array_equal(again.params["entities"], load_bundle(scored).params["entities"])


def test_a_reciprocal_model_is_scored_and_tuned_through_its_inverse_rows(tmp_path, capsys):
    """A ComplEx model with reciprocal relations whose inverse rows are conj(r) answers every head query as the plain
    model does (t o conj(r)), so its search scores the same; other inverse rows score otherwise."""
    from dataclasses import replace

    from earl_service.bundle.model_io import Bundle

    plain = load_bundle(model_and_graph(tmp_path, "complex"))
    capsys.readouterr()
    relations = plain.params["relations"]
    conj = np.concatenate([relations[:, :D], -relations[:, D:]], axis=1)
    search = ImportedSearch(max_bytes=plain.num_bytes // 3, time_limit_minutes=0.1, precisions=("int8", "pq:8"))
    reports = {}
    for name, inverse in (("plain", None), ("conj", conj), ("other", np.roll(conj, 1, axis=0))):
        source = plain if inverse is None else Bundle(
            replace(plain.config, reciprocal=True), {**plain.params, "relations": np.concatenate([relations, inverse])},
            plain.reserved, plain.entities, plain.relations, plain.triples, plain.metrics)
        reports[name] = compress_imported(source, tmp_path / name, search, graph=tmp_path / "data")
    mrr = {name: report["original"]["mrr"] for name, report in reports.items()}
    assert mrr["conj"] == pytest.approx(mrr["plain"], abs=1e-12) and mrr["other"] < mrr["plain"] - 0.05
    int8 = {name: next(r for r in report["candidates"] if r["precision"] == "int8") for name, report in reports.items()}
    assert int8["conj"]["mrr"] == pytest.approx(int8["plain"]["mrr"], abs=0.01)
    tuned = [r for r in reports["conj"]["candidates"] if "fine_tune" in r]
    assert tuned and all(r["fine_tune"]["steps"] > 0 for r in tuned)
    pick = load_bundle(tmp_path / "conj" / "bundle.safetensors")
    assert pick.config.reciprocal and pick.params["relations"].shape == (2 * R, 2 * D)
