"""Train the model bench/imported.py imports: a PyKEEN ComplEx (dim 200) on FB15k-237 for a wall-clock budget.

    python bench/imported_train.py --out runs/imported/complex-200 --minutes 10

The model is PyKEEN's own `ComplEx` (its representations and interaction, saved as PipelineResult.save_to_directory
saves: torch.save of the model as trained_model.pkl, the triples factory's to_path_binary as training_triples/).
Its parameters are trained here by a plain torch loop through the model's representations: cross-entropy of each
triple's true tail (query h o r) and true head (t o conj(r)) against 512 entities drawn per batch, Adam. PyKEEN's
own training loops took 450 s (sLCWA, 8 negatives, batch 1024) and about 510 s (LCWA) an epoch on this shared
2-core machine, and 2 sLCWA epochs left the model at chance (test MRR 0.0007). The model's own regularizer (ComplEx's default LpRegularizer)
is added to the loss each step, as PyKEEN's loops add it. train.json beside it records the settings, epochs and seconds.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import default_datasets  # noqa: E402

SETTINGS = {"model": "ComplEx", "embedding_dim": 200, "training_loop": "sampled cross-entropy (torch)",
            "batch_size": 1024, "negatives": 512, "lr": 0.003, "init_scale": 0.1,
            "seed": 0}


def queries(model, anchors: torch.Tensor, relations: torch.Tensor, *, head: bool) -> torch.Tensor:
    """(B, d) complex queries through PyKEEN's representations: h o r for tails, t o conj(r) for heads (ComplEx's
    Re(<h, r, conj(t)>) = Re(<t, conj(r), conj(h)>))."""
    e = model.entity_representations[0](indices=anchors)
    r = model.relation_representations[0](indices=relations)
    return e * (torch.conj(r) if head else r)


def real_dot(q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Re(q . conj(e)) for (B, d) queries against (C, d) candidates -> (B, C)."""
    return q.real @ e.real.T + q.imag @ e.imag.T


def step_loss(model, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each true tail (and head) against the batch's shared negatives."""
    loss = torch.zeros(())
    rep = model.entity_representations[0]
    for anchor, answer, head in ((h, t, False), (t, h, True)):
        q = queries(model, anchor, r, head=head)
        own = (q * torch.conj(rep(indices=answer))).real.sum(-1, keepdim=True)  # (B, 1)
        logits = torch.cat([own, real_dot(q, rep(indices=negatives))], dim=1)  # (B, 1 + K)
        loss = loss + torch.nn.functional.cross_entropy(logits, torch.zeros(len(h), dtype=torch.long))
    return loss


def train(data: Path, out: Path, minutes: float, threads: int = 2) -> dict:
    from pykeen.models import ComplEx
    from pykeen.triples import TriplesFactory

    torch.set_num_threads(threads)
    torch.manual_seed(SETTINGS["seed"])
    factory = TriplesFactory.from_path(data / "train.txt")
    model = ComplEx(triples_factory=factory, embedding_dim=SETTINGS["embedding_dim"], random_seed=SETTINGS["seed"])
    with torch.no_grad():  # PyKEEN's initial rows give scores near 100: a softmax saturated from the first step
        for weight in model.parameters():
            weight.mul_(SETTINGS["init_scale"])
    optimizer = torch.optim.Adam(model.parameters(), lr=SETTINGS["lr"])
    triples = factory.mapped_triples
    start, steps, losses = time.perf_counter(), 0, []
    while time.perf_counter() - start < minutes * 60:
        for batch in torch.randperm(len(triples)).split(SETTINGS["batch_size"]):
            h, r, t = triples[batch].T
            loss = step_loss(model, h, r, t, torch.randint(factory.num_entities, (SETTINGS["negatives"],)))
            # ComplEx's default LpRegularizer adds to a term on every lookup until it is collected, as PyKEEN's own
            # loop does each step: left alone it held every step's graph (21 GB after 10 minutes, then the OOM killer)
            loss = loss + model.collect_regularization_term()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            losses.append(float(loss.detach()))
            if time.perf_counter() - start > minutes * 60:
                break
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.eval(), out / "trained_model.pkl", pickle_protocol=pickle.HIGHEST_PROTOCOL)
    factory.to_path_binary(out / "training_triples")
    record = {**SETTINGS, "steps": steps, "epochs": round(steps * SETTINGS["batch_size"] / len(triples), 2),
              "first_loss": losses[0], "last_loss": losses[-1], "train_seconds": round(seconds, 1),
              "minutes": minutes, "data": str(data), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="FB15k-237 folder (default: the shared datasets')")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    a = p.parse_args()
    print(json.dumps(train(a.data or default_datasets() / "fb15k-237", a.out, a.minutes, a.threads)))


if __name__ == "__main__":
    main()
