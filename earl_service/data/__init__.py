"""Data: triple files in (text, RDF, Parquet, DataFrames), integer-id datasets with vocabularies, labels, and
generated graphs (synthetic, WordNet 3.0 whole; split by one rule, splits.py). Numpy only; imports `version`,
`errors`, `atomic`, `provenance`, `config`; nothing above.
"""

from earl_service.data.dataset import Dataset, load_dataset, load_triples_file
from earl_service.data.vocab import Vocab

__all__ = ["Dataset", "Vocab", "load_dataset", "load_triples_file"]
