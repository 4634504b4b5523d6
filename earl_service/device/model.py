"""The device's link predictor: every entity scored exactly over a bundle's rebuilt embeddings (numpy only)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from earl_service.core.known import KnownAnswers
from earl_service.data.vocab import Vocab
from earl_service.serve.predictor import LinkPredictor


class EdgeModel(LinkPredictor):
    """LinkPredictor(index="exact") over a bundle's rebuilt embeddings: every entity scored exactly (by the bundle's
    scorer: RotatE, or an imported model's), so neither torch nor faiss is imported; `config` is the bundle's ModelConfig as a dict, `triples` (E, 3) its graph, or
    the graph's KnownAnswers already built (what the cache maps back)."""

    def __init__(self, config: dict, entities: Vocab, relations: Vocab, entity_embeddings: np.ndarray,
                 relation_embeddings: np.ndarray, triples: np.ndarray | KnownAnswers, relation_labels: dict[str, str],
                 entity_labels: dict[str, str] | None = None) -> None:
        super().__init__(entity_embeddings, relation_embeddings, entities, relations, triples, gamma=config["gamma"],
                         epsilon=config["epsilon"], model=config.get("model", "rotate"),
                         reciprocal=bool(config.get("reciprocal", False)), index="exact",
                         relation_labels=relation_labels, entity_labels=entity_labels)
        self.config = config

    @cached_property
    def triples(self) -> np.ndarray:
        """(E, 3) int64: the graph's distinct triples sorted by head, relation and tail (a bundle's own order)."""
        return self.known.triples()
