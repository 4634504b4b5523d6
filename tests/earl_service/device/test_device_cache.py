"""device.cache: an entry answers exactly as the rebuild it stores, a changed bundle is rebuilt, a damaged entry is
detected and rebuilt (never answered from), and the cache keeps to its bound."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.device import reader
from earl_service.device.cache import MANIFEST, CacheConfig, TableCache, bundle_key, default_directory, rebuild_name
from earl_service.errors import BundleError


@pytest.fixture
def bundle_copy(codex_bundle, tmp_path) -> Path:
    """A copy of the CoDEx-S bundle that a test may replace, extend or damage."""
    return Path(shutil.copy(codex_bundle, tmp_path / "bundle.safetensors"))


@pytest.fixture
def cache(tmp_path) -> TableCache:
    return TableCache(CacheConfig(tmp_path / "cache"))


@pytest.fixture
def rebuilds(monkeypatch) -> list[str]:
    """The paths reader.load rebuilt, in order: a hit adds none."""
    calls, load = [], reader.load

    def counting(path, **kwargs):
        calls.append(str(path))
        return load(path, **kwargs)

    monkeypatch.setattr(reader, "load", counting)
    return calls


def entry_of(cache: TableCache, path: Path, use_scipy: bool | None = None) -> Path:
    key = bundle_key(path)
    assert key is not None
    return cache.root / f"{key.digest}-{rebuild_name(use_scipy)}"


def queries(model, count: int = 6):
    """(relation, head, tail) queries in both directions over the model's own triples."""
    names, relations = model.entities.names, model.relations.names
    for h, r, t in model.triples[:: max(1, len(model.triples) // count)][:count]:
        yield relations[r], names[h], None
        yield relations[r], None, names[t]


def assert_same_answers(got, want) -> None:
    """Exactly the same tables, names, labels and known answers, hence the same answers, scores to the bit."""
    np.testing.assert_array_equal(got.entity_embeddings, want.entity_embeddings)
    np.testing.assert_array_equal(got.relation_embeddings, want.relation_embeddings)
    np.testing.assert_array_equal(got.triples, want.triples)
    assert got.entities.names == want.entities.names and got.relations.names == want.relations.names
    assert got.entity_labels == want.entity_labels and got.relation_labels == want.relation_labels
    for relation, head, tail in queries(want):
        for k in (1, 10, len(want.entities)):
            for exclude_known in (True, False):
                assert got.answer(relation, head=head, tail=tail, k=k, exclude_known=exclude_known) == \
                    want.answer(relation, head=head, tail=tail, k=k, exclude_known=exclude_known)
    h, r, t = want.triples[3]
    triple = (want.entities.names[h], want.relations.names[r], want.entities.names[t])
    assert got.score(*triple) == want.score(*triple)


def test_cached_answers_equal_uncached_ones_exactly(codex_bundle, cache, rebuilds):
    uncached = reader.load(codex_bundle)
    first = cache.load(codex_bundle)  # a miss: rebuilt, then stored
    second = cache.load(codex_bundle)  # a hit: mapped from disk
    assert rebuilds == [str(codex_bundle), str(codex_bundle)]  # the uncached load and the miss; the hit rebuilt nothing
    assert isinstance(second.entity_embeddings.base, np.memmap) or isinstance(second.entity_embeddings, np.memmap)
    assert_same_answers(first, uncached)
    assert_same_answers(second, uncached)
    assert second.config == json.loads(json.dumps(uncached.config))


def test_a_bundle_with_labels_keeps_them(codex_bundle, tmp_path, cache):
    bundle = load_bundle(codex_bundle)
    head, tail = bundle.entities.names[:2]
    bundle.entity_labels = {head: "The Head", tail: "Ünïcode\ttail"}
    path = bundle.save(tmp_path / "labelled.safetensors")
    cache.load(path)
    hit = cache.load(path)
    assert hit.entity_labels == {head: "The Head", tail: "Ünïcode\ttail"}
    assert_same_answers(hit, reader.load(path))


def test_a_replaced_bundle_is_rebuilt_and_its_old_entry_removed(codex_bundle, bundle_copy, cache, rebuilds):
    before = cache.load(bundle_copy)
    old_entry = entry_of(cache, bundle_copy)
    load_bundle(codex_bundle).save(bundle_copy, precision="fp16")  # the same path, other weights
    after = cache.load(bundle_copy)
    assert len(rebuilds) == 2
    assert not np.array_equal(after.entity_embeddings, before.entity_embeddings)
    assert_same_answers(after, reader.load(bundle_copy))
    assert not old_entry.exists() and [e[0] for e in cache.entries()] == [entry_of(cache, bundle_copy)]


def test_an_extended_bundle_is_rebuilt(bundle_copy, cache, tmp_path, capsys):
    """`earl extend` rewrites the bundle with a new entity: the next load knows it, as an uncached one does."""
    before = cache.load(bundle_copy)
    head, relation = before.entities.names[0], before.relations.names[0]
    new = tmp_path / "new.tsv"
    new.write_text(f"{head}\t{relation}\tQnew-entity\n")
    assert main(["extend", str(bundle_copy), "--triples", str(new), "--out", str(bundle_copy)]) == 0
    capsys.readouterr()
    after = cache.load(bundle_copy)
    assert "Qnew-entity" in after.entities and "Qnew-entity" not in before.entities
    assert_same_answers(after, reader.load(bundle_copy))
    assert cache.load(bundle_copy).answer(relation, tail="Qnew-entity") == after.answer(relation, tail="Qnew-entity")
    assert len(cache.entries()) == 1


def test_a_touched_or_copied_bundle_is_verified_once_then_answered_from_cache(bundle_copy, cache, rebuilds,
                                                                               tmp_path):
    cache.load(bundle_copy)
    os.utime(bundle_copy, ns=(1, 1))  # same bytes, another mtime: the payload is hashed again, not rebuilt
    copy = Path(shutil.copy(bundle_copy, tmp_path / "elsewhere.safetensors"))
    for path in (bundle_copy, copy):
        model = cache.load(path)
        assert_same_answers(model, reader.load(path))
        manifest = json.loads((entry_of(cache, path) / MANIFEST).read_text())
        assert manifest["source"]["path"] == os.path.realpath(path)
    assert rebuilds == [str(bundle_copy), str(bundle_copy), str(copy)]  # the first miss, then the references only


def test_a_bundle_damaged_after_its_header_is_refused_as_uncached(bundle_copy, cache):
    cache.load(bundle_copy)
    data = bytearray(bundle_copy.read_bytes())
    data[-1] ^= 0xFF  # the header (hence the key) unchanged, the payload not what it records
    bundle_copy.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="corrupted or truncated"):
        reader.load(bundle_copy)
    with pytest.raises(BundleError, match="corrupted or truncated"):
        cache.load(bundle_copy)


def _flip(path: Path, offset: int = -5) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _set_manifest(path: Path, **changes) -> None:
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, **changes}))


DAMAGE = {
    "embeddings truncated": lambda e: os.truncate(e / "entity_embeddings.npy", 1000),
    "an embedding bit flipped": lambda e: _flip(e / "entity_embeddings.npy"),
    "a known answer flipped": lambda e: _flip(e / "tail_answers.npy"),
    "a name flipped": lambda e: _flip(e / "strings.json", 40),
    "npy header garbled": lambda e: _flip(e / "relation_embeddings.npy", 12),
    "a file missing": lambda e: (e / "head_keys.npy").unlink(),
    "an empty file": lambda e: (e / "head_answers.npy").write_bytes(b""),
    "manifest missing": lambda e: (e / MANIFEST).unlink(),
    "manifest not JSON": lambda e: (e / MANIFEST).write_text("{\"cache_format\": 1, "),
    "manifest of another version": lambda e: _set_manifest(e / MANIFEST, earl_service="0.0.1"),
    "manifest without its files": lambda e: _set_manifest(e / MANIFEST, files={}),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_rebuilt_never_answered_from(codex_bundle, cache, rebuilds, damage):
    uncached = reader.load(codex_bundle)
    cache.load(codex_bundle)
    DAMAGE[damage](entry_of(cache, codex_bundle))
    model = cache.load(codex_bundle)
    assert rebuilds == [str(codex_bundle)] * 3  # the reference, the first miss, the rebuild of the damaged entry
    assert_same_answers(model, uncached)
    assert_same_answers(cache.load(codex_bundle), uncached)  # rewritten whole: a hit again
    assert len(rebuilds) == 3


def test_least_recently_used_entries_go_first(codex_bundle, tmp_path, rebuilds):
    bundle = load_bundle(codex_bundle)
    paths = [bundle.save(tmp_path / f"{p}.safetensors", precision=p) for p in ("fp32", "fp16", "int8")]
    cache = TableCache(CacheConfig(tmp_path / "cache", max_entries=2))
    a, b, c = paths
    cache.load(a)
    cache.load(b)
    cache.load(a)  # a hit: a is now the most recently used
    cache.load(c)
    assert sorted(e[0].name for e in cache.entries()) == sorted(entry_of(cache, p).name for p in (a, c))
    assert rebuilds == [str(a), str(b), str(c)]


def test_an_entry_over_the_byte_bound_is_not_written(codex_bundle, tmp_path):
    cache = TableCache(CacheConfig(tmp_path / "cache", max_bytes=10_000))
    assert_same_answers(cache.load(codex_bundle), reader.load(codex_bundle))
    assert cache.entries() == []


def test_a_leftover_write_folder_is_cleared(codex_bundle, cache):
    stale = cache.root / ".tmp-1-1"
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))
    cache.load(codex_bundle)
    assert not stale.exists()


def test_a_file_that_is_no_bundle_gets_the_readers_error(tmp_path, cache):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\xff" * 7)
    assert bundle_key(path) is None
    with pytest.raises(BundleError, match="too short for a safetensors header"):
        cache.load(path)
    assert cache.entries() == []


def test_default_directory():
    assert default_directory({"EARL_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert default_directory({"XDG_CACHE_HOME": "/b"}) == Path("/b/earl")
    assert default_directory({}) == Path.home() / ".cache" / "earl"


def test_an_entry_is_used_only_by_the_rebuild_that_wrote_it(tmp_path, codex_bundle):
    """scipy's and numpy's rebuilds agree within float32 rounding only (a near tie can swap): each gets its own
    entry, so a cached answer is the one the same call gives uncached."""
    cache = TableCache(CacheConfig(tmp_path / "cache"))
    numpy_model = cache.load(codex_bundle, use_scipy=False)
    assert entry_of(cache, codex_bundle, False).is_dir() and not entry_of(cache, codex_bundle, True).exists()
    scipy_model = cache.load(codex_bundle, use_scipy=True)
    assert entry_of(cache, codex_bundle, True).is_dir()
    np.testing.assert_allclose(scipy_model.entity_embeddings, numpy_model.entity_embeddings, rtol=1e-4, atol=1e-5)
    assert rebuild_name(None) == "scipy"  # installed here: the default rebuild
