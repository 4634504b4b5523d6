"""Data: triple files in (text, RDF, Parquet, DataFrames), integer-id datasets with vocabularies, labels, and
generated graphs (synthetic, WordNet 3.0 whole; split by one rule, splits.py). Numpy only; imports `version`,
`errors`, `atomic`, `provenance`, `config`; nothing above.

The names below load on first use, so that a module needing only `data.vocab` (the device reader answering from its
cache) does not pay for the readers, the dataset loader and their imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from earl_service.data.dataset import Dataset, load_dataset, load_triples_file
    from earl_service.data.vocab import Vocab

__all__ = ["Dataset", "Vocab", "load_dataset", "load_triples_file"]


def __getattr__(name: str) -> Any:
    if name == "Vocab":
        from earl_service.data import vocab

        return vocab.Vocab
    if name in __all__:
        from earl_service.data import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module 'earl_service.data' has no attribute {name!r}")
