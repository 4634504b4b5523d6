"""EARL: entity-agnostic knowledge-graph embeddings (AAAI 2023) with RotatE scoring, as a library."""

__version__ = "0.1.0"
