"""Entity search by id or label: exact, then prefix, then fuzzy; pagination; label resolution and its errors."""

import pytest

from earl_service.data.vocab import Vocab
from earl_service.errors import AmbiguousNameError, UnknownEntityError, UnknownRelationError
from earl_service.serve.names import CANDIDATES_SHOWN, NameSearch

IDS = ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q10", "Q11"]
LABELS = {"Q1": "Paris", "Q2": "Paris Hilton", "Q3": "Parish", "Q4": "Berlin", "Q5": "Bern", "Q6": "Bernhard Riemann",
          "Q7": "Paris", "Q10": "Leonhard Euler"}


@pytest.fixture
def search():
    return NameSearch(Vocab(IDS), LABELS)


def ids(page):
    return [m.id for m in page.items]


def test_exact_then_prefix_then_fuzzy(search):
    page = search.search("bern", limit=10)
    assert ids(page)[:3] == ["Q5", "Q6", "Q4"]  # exact "Bern"; then prefix "Bernhard Riemann"; then fuzzy "Berlin"
    scores = [m.score for m in page.items]
    assert scores[0] == 1.0 and 0.5 < scores[1] < 1.0 and scores[2] < 0.5 and scores == sorted(scores, reverse=True)
    assert page.items[0].label == "Bern" and page.total == len(page.items)


def test_ids_match_too_and_case_and_spaces_are_ignored(search):
    assert ids(search.search("q1", limit=3)) == ["Q1", "Q10", "Q11"]  # exact id, then shorter prefix first
    assert ids(search.search("  PARIS ", limit=2)) == ["Q1", "Q7"]  # two exact matches, by id order
    assert search.search("Leonard Euler", limit=1).items[0].id == "Q10"  # a typo: fuzzy


def test_pages_cover_the_ranking_once(search):
    whole = search.search("par", limit=100)
    assert whole.total == len(whole.items) >= 4
    pages = [search.search("par", limit=2, offset=o) for o in range(0, whole.total, 2)]
    assert [i for p in pages for i in ids(p)] == ids(whole)
    assert all(p.total == whole.total for p in pages) and search.search("par", offset=1000).items == []


def test_nothing_matches_nothing(search):
    assert search.search("xyzzy").total == 0 and search.search("   ").total == 0


def test_a_label_resolves_where_it_names_exactly_one(search):
    assert search.resolve("Q4") == IDS.index("Q4") and search.resolve("Berlin") == IDS.index("Q4")
    assert search.resolve("berlin") == IDS.index("Q4")  # casefolded when no label matches exactly
    with pytest.raises(AmbiguousNameError, match=r"names 2 entity ids: 'Q1', 'Q7'") as error:
        search.resolve("Paris")
    assert error.value.candidates == ["Q1", "Q7"]


def test_an_ambiguous_label_lists_at_most_a_few_candidates():
    names = [f"e{i}" for i in range(50)]
    search = NameSearch(Vocab(names), dict.fromkeys(names, "same"))
    with pytest.raises(AmbiguousNameError, match="and 40 more") as error:
        search.resolve("same")
    assert len(error.value.candidates) == CANDIDATES_SHOWN


def test_unknown_names_suggest_ids_and_labels(search):
    with pytest.raises(UnknownEntityError) as error:
        search.resolve("Berlinn")
    assert "Berlin" in error.value.suggestions
    relations = NameSearch(Vocab(["P27"], kind="relation"), {"P27": "country of citizenship"})
    with pytest.raises(UnknownRelationError) as error:
        relations.resolve("country of citizenshp")
    assert error.value.suggestions == ["country of citizenship"]


def test_a_large_vocabulary_searches_from_its_index():
    names = [f"/m/{i:06x}" for i in range(100_000)]
    labels = {n: f"entity number {i}" for i, n in enumerate(names)}
    search = NameSearch(Vocab(names), labels)
    page = search.search("entity number 4242", limit=5)
    assert page.items[0].id == names[4242] and page.items[0].score == 1.0
    assert page.total > 5 and page.items[1].label.startswith("entity number 4242")
