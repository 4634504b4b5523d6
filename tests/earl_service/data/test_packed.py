"""The packed vocabulary answers as the Vocab it packs: ids, names, membership, misses, suggestions, duplicates."""

import numpy as np
import pytest

from earl_service.data.packed import PackedVocab
from earl_service.data.vocab import Vocab
from earl_service.errors import UnknownEntityError, UnknownRelationError


def _names(n: int, seed: int = 0) -> list[str]:
    """Ids, labels-like names with spaces, accents and non-Latin letters, and an empty-looking one."""
    rng = np.random.default_rng(seed)
    pool = ["/m/0", "Q", "entité ", "Город_", "名前", "e", "a b\tc "]
    return [f"{pool[i % len(pool)]}{rng.integers(1 << 40)}" for i in range(n)] + ["", " ", "e1", "E1"]


@pytest.mark.parametrize("n", [50, 5000])
def test_lookups_and_misses_equal_the_dict(n):
    names = _names(n)
    vocab, packed = Vocab(names), PackedVocab(names)
    assert len(packed) == len(vocab) and list(packed) == names and list(packed.names) == names
    for i, name in enumerate(names):
        assert name in packed and packed.id(name) == vocab.id(name) == i
        assert packed.names[i] == name and packed.name(i) == name
    assert packed.names[-1] == names[-1] and packed.names[2:5] == names[2:5]
    np.testing.assert_array_equal(packed.ids(names[::7]), vocab.ids(names[::7]))
    for miss in ("e2", "e1 ", "/m/", names[0] + "x", names[0][:-1], "E", 3, None):
        assert (miss in packed) is (miss in vocab) is False
    with pytest.raises(UnknownEntityError) as err:
        packed.id("e2")
    with pytest.raises(UnknownEntityError) as want:
        vocab.id("e2")
    assert err.value.args == want.value.args
    with pytest.raises(IndexError):
        packed.name(len(names))


@pytest.mark.parametrize("n", [300, 5000])
def test_suggestions_equal_the_vocabs(n):
    """Below Vocab._SMALL every name is compared; above it the neighbours by sorted prefix and suffix."""
    names = _names(n, seed=1)
    vocab, packed = Vocab(names), PackedVocab(names)
    for name in [names[3][:-1] + "9", names[10].upper(), "e", "Q123", names[-5][1:], "zzz"]:
        assert packed.suggest(name) == vocab.suggest(name)


def test_a_relation_vocab_raises_its_own_error_and_duplicates_are_refused():
    packed = PackedVocab(["r0", "r1"], kind="relation")
    with pytest.raises(UnknownRelationError):
        packed.id("r2")
    with pytest.raises(ValueError, match="duplicate entity name 'b'"):
        PackedVocab(["a", "b", "c", "b"])


def test_names_sharing_a_hash_are_told_apart(monkeypatch):
    """Distinct names of one hash (forced here) are both found; a repeated name among them is still refused."""
    import builtins

    real = builtins.hash
    monkeypatch.setattr(builtins, "hash", lambda x: 7 if isinstance(x, str) and x.startswith("c") else real(x))
    packed = PackedVocab(["a", "c1", "b", "c2", "c3"])
    assert [packed.id(n) for n in ("c1", "c2", "c3", "a")] == [1, 3, 4, 0]
    assert "c4" not in packed
    with pytest.raises(ValueError, match="duplicate"):
        PackedVocab(["c1", "c2", "c1"])


def test_packing_takes_a_fraction_of_the_dicts_memory():
    names = [f"e{i}" for i in range(100_000)]
    packed = PackedVocab(names)
    assert packed.nbytes < 25 * len(names)  # a str (~55 B), its list slot and dict entry take > 100 B a name
    assert PackedVocab.of(packed) is packed
