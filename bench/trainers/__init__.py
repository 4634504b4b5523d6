"""Train one configuration under a wall-clock budget and collect what the paper tables report.

Two trainers share one contract: `run_earl` (this repository's `earl_service.train.loop`, EARL or plain RotatE) and
`run_pykeen` (PyKEEN 1.11's RotatE or NodePiece+RotatE). Both take the same `Budget` (wall-clock minutes that
include periodic validation, a step cap, validation cadence and early-stopping patience), keep the best
checkpoint by validation MRR, and return one flat record: parameters, steps done, why training stopped
(`early_stopping` = converged, `time_limit`, `steps`), wall-clock, test metrics per protocol (filtered,
realistic ranks), saved-artifact bytes and the validation curve (MRR against wall-clock).
"""

from trainers.budget import THREADS, Budget, Optim, effi
from trainers.earl import dim_for_parameters, earl_parameters, run_earl, test_earl
from trainers.pykeen_model import (
    NodePieceSpec,
    build_pykeen_model,
    nodepiece_width_for,
    pykeen_nodepiece_parameters,
    pykeen_rotate_dim_for,
    pykeen_rotate_parameters,
    pykeen_rotate_ranks,
)
from trainers.pykeen_run import PYKEEN_CHECKPOINT, run_pykeen

__all__ = ["PYKEEN_CHECKPOINT", "THREADS", "Budget", "NodePieceSpec", "Optim", "build_pykeen_model",
           "dim_for_parameters", "earl_parameters", "effi", "nodepiece_width_for", "pykeen_nodepiece_parameters",
           "pykeen_rotate_dim_for", "pykeen_rotate_parameters", "pykeen_rotate_ranks", "run_earl", "run_pykeen",
           "test_earl"]
