"""Train the model bench/imported.py imports: PyKEEN's ComplEx on FB15k-237 for a fixed wall-clock budget.

    python bench/imported_train.py --out runs/imported/complex-200 --minutes 13

PyKEEN's own pipeline (sLCWA, softplus loss, Adam), stopped after the first epoch that ends past `--minutes`
(a training callback), saved with `save_to_directory`; train.json beside it records the settings, epochs and
seconds. 8 negatives a positive, batch 1024: at 64 negatives and batch 2048 one epoch took 1,293 s on this
2-core machine, and at 8 about 450 s. Without inverse triples: `earl import` reads head queries through the
model's own relations.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import default_datasets  # noqa: E402

SETTINGS = {"model": "ComplEx", "embedding_dim": 200, "training_loop": "sLCWA", "loss": "softplus",
            "negatives": 8, "batch_size": 1024, "lr": 0.005, "max_epochs": 500, "seed": 0}


def train(data: Path, out: Path, minutes: float) -> dict:
    from pykeen.pipeline import pipeline
    from pykeen.training.callbacks import TrainingCallback
    from pykeen.triples import TriplesFactory

    class Deadline(TrainingCallback):
        """Stops training after the first epoch that ends past the deadline."""

        def __init__(self, seconds: float) -> None:
            super().__init__()
            self.deadline, self.epochs = time.monotonic() + seconds, 0

        def post_epoch(self, epoch: int, epoch_loss: float, **kwargs) -> None:
            self.epochs = epoch
            if time.monotonic() > self.deadline:
                self.training_loop._should_stop = True

    torch.set_num_threads(2)
    train_tf = TriplesFactory.from_path(data / "train.txt")
    start, stop = time.perf_counter(), Deadline(minutes * 60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = _pipeline(pipeline, train_tf, stop)
    seconds = time.perf_counter() - start
    result.save_to_directory(out)
    record = {**SETTINGS, "epochs": stop.epochs, "train_seconds": round(seconds, 1), "minutes": minutes,
              "data": str(data), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _pipeline(pipeline, train_tf, stop):
    """PyKEEN's pipeline on the training triples, no evaluation (bench/imported.py evaluates)."""
    from pykeen.triples import TriplesFactory

    one = TriplesFactory(train_tf.mapped_triples[:1], train_tf.entity_to_id, train_tf.relation_to_id)
    return pipeline(training=train_tf, testing=one, model=SETTINGS["model"],
                    model_kwargs={"embedding_dim": SETTINGS["embedding_dim"]}, loss=SETTINGS["loss"],
                    training_loop=SETTINGS["training_loop"],
                    negative_sampler_kwargs={"num_negs_per_pos": SETTINGS["negatives"]},
                    optimizer_kwargs={"lr": SETTINGS["lr"]},
                    training_kwargs={"num_epochs": SETTINGS["max_epochs"], "batch_size": SETTINGS["batch_size"],
                                     "use_tqdm": False, "callbacks": [stop]},
                    evaluation_kwargs={"use_tqdm": False}, random_seed=SETTINGS["seed"], device="cpu")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="FB15k-237 folder (default: the shared datasets')")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=14.0)
    a = p.parse_args()
    data = a.data or default_datasets() / "fb15k-237"
    print(json.dumps(train(data, a.out, a.minutes)))


if __name__ == "__main__":
    main()
