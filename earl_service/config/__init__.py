"""What can be asked for: frozen config dataclasses (`fields`), training recipes (`recipes`) and the option
table (`options`) from which `earl train`, the API's job form and the worker's job mapping are derived.

Torch-free; imports only `errors` and `core`. The dataclasses are re-exported here.
"""

from earl_service.config.fields import (
    ABLATIONS,
    COLUMN_ORDERS,
    COMPUTE,
    GRAPH_OPTIONAL,
    IMPORTED,
    MODELS,
    DataConfig,
    ModelConfig,
    ModelKind,
    Text,
    TrainConfig,
    TrainedKind,
)

__all__ = ["ABLATIONS", "COLUMN_ORDERS", "COMPUTE", "GRAPH_OPTIONAL", "IMPORTED", "MODELS", "DataConfig", "ModelConfig",
           "ModelKind", "Text", "TrainConfig", "TrainedKind"]
