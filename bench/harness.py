"""Train one configuration under a wall-clock budget and collect what the paper tables report.

Two trainers share one contract: `run_earl` (this repository's `earl_service.train.loop`, EARL or plain RotatE) and
`run_pykeen` (PyKEEN 1.11's RotatE or NodePiece+RotatE). Both take the same `Budget` (wall-clock minutes that
include periodic validation, a step cap, validation cadence and early-stopping patience), keep the best
checkpoint by validation MRR, and return one flat record: parameters, steps done, why training stopped
(`early_stopping` = converged, `time_limit`, `steps`), wall-clock, test metrics per protocol (filtered,
realistic ranks), saved-artifact bytes and the validation curve (MRR against wall-clock).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import Dataset
from earl_service.model.modules import build_model, trainable_parameters
from earl_service.train.evaluate import KnownAnswers, realistic_ranks, summarize

THREADS = 2  # the machine's cores; every run in every table uses the same


@dataclass(frozen=True)
class Budget:
    """How long one run may train and how it validates. Validation time counts against `minutes`."""

    minutes: float
    max_steps: int = 1_000_000
    eval_every: int = 100  # steps between validations
    eval_max_triples: int = 0  # validate on a fixed random subset of this many valid triples (0: all)
    patience: int = 20  # validations without improvement before early stopping

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fixed_steps(self, steps: int) -> Budget:
        """This budget training exactly `steps` steps: patience outlasts the run, so early stopping never ends it."""
        return replace(self, max_steps=steps, patience=steps // self.eval_every + 1)

    @property
    def patience_outlasts_run(self) -> bool:
        """Whether the step cap, not early stopping, ends the run (a fixed-step design)."""
        return self.patience * self.eval_every > self.max_steps


@dataclass(frozen=True)
class Optim:
    """The optimisation settings shared by both trainers (the paper's defaults)."""

    batch_size: int = 1024
    negatives: int = 256  # per side: this many head and this many tail corruptions per positive
    lr: float = 1e-3
    margin: float = 10.0
    adversarial_temperature: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _seen_subset(ds: Dataset, split: str, limit: int) -> np.ndarray:
    """The triples `Run.evaluate(split, "seen", limit=...)` ranks: seen-entity filter, then the same fixed subset."""
    triples = ds.split(split)
    triples = triples[ds.seen_mask(triples)]
    if limit and len(triples) > limit:
        triples = triples[np.random.default_rng(0).choice(len(triples), limit, replace=False)]
    return triples


def _metrics(m: dict) -> dict:
    return {k: m[k] for k in ("mrr", "mr", "hits_at_1", "hits_at_3", "hits_at_10", "count") if k in m}


class Machine:
    """What else used the machine during a run: the load average, and the share of CPU time the hypervisor gave
    to other guests (`steal` in /proc/stat; on a shared VM it slows a run without showing in the load)."""

    def __init__(self):
        self.load = os.getloadavg()
        self.ticks = _cpu_ticks()

    def summary(self) -> dict:
        ticks = _cpu_ticks()
        steal = None
        if self.ticks and ticks:
            delta = [b - a for a, b in zip(self.ticks, ticks, strict=True)]  # same kernel, same /proc/stat columns
            total = sum(delta[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
            steal = round(delta[7] / total, 4) if total > 0 else None
        return {"load_average_1min": {"start": round(self.load[0], 2), "end": round(os.getloadavg()[0], 2)},
                "cpu_steal_share": steal}


def _cpu_ticks() -> list[int] | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    return [int(x) for x in fields[1:]] if fields[0] == "cpu" and len(fields) > 8 else None


def _stopped(budget: Budget, stopped: str, machine: Machine) -> dict:
    """Why training stopped, the budget, and what else ran on the machine meanwhile."""
    return {"stopped": stopped, "converged": stopped == "early_stopping", "budget": budget.to_dict(),
            **machine.summary()}


# ---------------------------------------------------------------- earl_service (EARL and plain RotatE)


def earl_parameters(ds: Dataset, cfg: ModelConfig) -> int:
    """Trainable parameters of a model config on this dataset, without training it."""
    from earl_service.model.graph import choose_reserved

    n = ds.num_train_entities
    reserved = (choose_reserved(n, cfg.reserved_ratio, cfg.seed) if cfg.model == "earl" and cfg.uses_reserved
                else torch.zeros(0, dtype=torch.long))
    return trainable_parameters(build_model(cfg, n, ds.num_relations, reserved))


def dim_for_parameters(ds: Dataset, base: ModelConfig, target: int, *, lo: int = 1, hi: int = 2000) -> int:
    """The dim whose parameter count is closest to `target` (counts grow with dim, so bisect)."""
    from dataclasses import replace

    def count(d: int) -> int:
        return earl_parameters(ds, replace(base, dim=d))

    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) < target:
            lo = mid + 1
        else:
            hi = mid
    return min((d for d in (lo - 1, lo) if d >= 1), key=lambda d: abs(count(d) - target))


def run_earl(ds: Dataset, cfg: ModelConfig, budget: Budget, out_dir: Path, *, optim: Optim = Optim(),
             protocols: tuple[str, ...] = ("seen",), bf16: bool = False, seed: int = 0, final_eval: bool = True) -> dict:
    """Train with `earl_service.train.loop` under the budget; test the best checkpoint under each protocol.

    Resumable: the training state is checkpointed at every validation, and a call on a directory holding a
    checkpoint (an earlier attempt that was interrupted) continues from it; the budget counts the training
    time of every attempt (`train_seconds`), not the time lost between them. Any other leftover is removed.
    """
    from dataclasses import replace

    from earl_service.train.loop import CHECKPOINT, train

    out_dir = Path(out_dir)
    resume = (out_dir / CHECKPOINT).exists()
    if not resume:
        shutil.rmtree(out_dir, ignore_errors=True)  # a stale best.pt must not stand in for this run's
    cfg = replace(cfg, gamma=optim.margin)
    tcfg = TrainConfig(steps=budget.max_steps, batch_size=optim.batch_size, negatives=optim.negatives, lr=optim.lr,
                       adversarial_temperature=optim.adversarial_temperature, eval_every=budget.eval_every,
                       patience=budget.patience, eval_max_triples=budget.eval_max_triples,
                       time_limit_minutes=budget.minutes, compute="bf16" if bf16 else "fp32", threads=THREADS, progress=False, seed=seed,
                       checkpoint_every=budget.eval_every)
    t0, machine = time.perf_counter(), Machine()
    resumed_from = torch.load(out_dir / CHECKPOINT, weights_only=True)["state"]["step"] if resume else None
    m = train(ds, cfg, tcfg, out_dir, resume=resume, protocol="seen", final_eval=final_eval)
    test = test_earl(ds, out_dir, protocols, seen=m["test"]) if "test" in m else {}
    history = json.loads((Path(out_dir) / "history.json").read_text())
    return {
        "implementation": "earl_service",
        "model": cfg.model,
        "dim": cfg.dim,
        "parameters": m["trainable_parameters"],
        "steps": m["steps"],
        "best_step": m["best_step"],
        **_stopped(budget, m["stopped"], machine),
        "train_seconds": m["train_seconds"],
        "wall_seconds": time.perf_counter() - t0,  # of the last attempt only, when resumed
        "resumed_from_step": resumed_from,
        "median_step_seconds": m["median_step_seconds"],
        "step_seconds_total": float(sum(history["step_times"])),  # train_seconds less validation and checkpoints
        "valid": _metrics(m.get("valid", {})),
        "test": test,
        "artifact_bytes": m["bundle_bytes"],
        "artifact": "bundle.safetensors (fp32 weights, graph, vocabularies)",
        "history": {"eval_steps": history["eval_steps"], "eval_seconds": history["eval_seconds"],
                    "eval_mrr": history["eval_mrr"]},
        "config": {"model": cfg.to_dict(), "optim": optim.to_dict(), "bf16": bf16, "seed": seed},
        "threads": THREADS,
    }


def test_earl(ds: Dataset, out_dir: Path, protocols: tuple[str, ...], *, seen: dict | None = None) -> dict:
    """Test metrics of a finished run's best checkpoint under each protocol (`seen`: pass the trainer's own)."""
    from earl_service.train.run import load_run

    run = None
    if seen is None:
        run = load_run(out_dir, ds, device="cpu")
        seen = run.evaluate("test", "seen")
    test = {"seen": _metrics(seen)}
    if "all" in protocols:
        if ds.seen_mask(ds.test).all():
            test["all"] = dict(test["seen"])  # no test triple has an unseen entity: the two protocols coincide
        else:
            test["all"] = _metrics((run or load_run(out_dir, ds, device="cpu")).evaluate("test", "all"))
    return test


# ---------------------------------------------------------------- PyKEEN


@dataclass(frozen=True)
class NodePieceSpec:
    """NodePiece tokenisation as in PyKEEN's galkin2022 configs: anchors per entity, relations per entity.

    Those configs search anchors with CSGraphAnchorSearcher, which in PyKEEN 1.11.1 sizes its graph from the
    largest entity id in train and fails when valid/test hold entities absent from train; run_pykeen uses the
    BFS ScipySparseAnchorSearcher (also nearest anchors by hops), which takes the entity count.
    """

    anchors: int
    anchor_tokens: int
    relation_tokens: int

    @property
    def tokens(self) -> int:
        return self.anchor_tokens + self.relation_tokens


def pykeen_rotate_parameters(ds: Dataset, dim: int) -> int:
    """PyKEEN's RotatE stores complex entities and relations: 2*dim reals each."""
    return 2 * dim * (ds.num_entities + ds.num_relations)


def pykeen_nodepiece_parameters(ds: Dataset, width: int, spec: NodePieceSpec) -> int:
    """NodePiece+RotatE parameters at real width `width` (complex dim width/2), MLP aggregation, inverse relations.

    anchors (A+1) x w, relation tokens (2R+1) x w, ConcatMLP (T*w -> 2w -> w) with biases. Checked against the
    built model in run_pykeen (the record keeps the counted number).
    """
    t = spec.tokens
    return 2 * t * width * width + 2 * width * width + width * (spec.anchors + 1 + 2 * ds.num_relations + 1 + 3)


def nodepiece_width_for(ds: Dataset, target: int, spec: NodePieceSpec) -> int:
    """The even real width whose NodePiece parameter count is closest to `target`."""
    return min(range(2, 4001, 2), key=lambda w: abs(pykeen_nodepiece_parameters(ds, w, spec) - target))


def pykeen_rotate_dim_for(ds: Dataset, target: int) -> int:
    return max(1, round(target / (2 * (ds.num_entities + ds.num_relations))))


PYKEEN_CHECKPOINT = "pykeen_checkpoint.pt"


def _seeded_anchor_searcher(seed: int) -> Any:
    """PyKEEN's ScipySparseAnchorSearcher, its pick among each entity's nearest anchors drawn from `seed`.

    PyKEEN's own pick uses an unseeded generator, so two builds of one NodePiece model got different anchor tokens.
    """
    from pykeen.nn.node_piece.anchor_search import ScipySparseAnchorSearcher

    class SeededSearcher(ScipySparseAnchorSearcher):
        def select(self, pool: np.ndarray, k: int) -> np.ndarray:  # (entities, anchors) bool -> (entities, k), -1 pads
            rng = np.random.default_rng(seed)
            tokens = np.full((pool.shape[0], k), -1, dtype=int)
            for i, row in enumerate(pool):
                (reachable,) = row.nonzero()
                chosen = rng.choice(reachable, size=min(k, reachable.size), replace=False, shuffle=False)
                tokens[i, : len(chosen)] = chosen
            return tokens

    return SeededSearcher()


def build_pykeen_model(ds: Dataset, kind: str, *, dim: int = 0, width: int = 0, spec: NodePieceSpec | None = None,
                       optim: Optim = Optim(), seed: int = 0) -> tuple[torch.nn.Module, Any, dict]:
    """PyKEEN's RotatE (complex `dim`) or NodePiece+RotatE (real `width`) on `ds`: (model, triples factory, shape)."""
    from pykeen.losses import NSSALoss
    from pykeen.models import NodePiece, RotatE
    from pykeen.triples import CoreTriplesFactory

    # Every entity of every split gets an id (valid/test-only ones never occur in a training triple), so that the
    # `all` protocol can rank them; the `seen` protocol restricts candidates to training entities, as run_earl does.
    factory = CoreTriplesFactory.create(mapped_triples=torch.as_tensor(ds.train, dtype=torch.long),
                                        num_entities=ds.num_entities, num_relations=ds.num_relations,
                                        create_inverse_triples=kind == "nodepiece")
    loss = NSSALoss(margin=optim.margin, adversarial_temperature=optim.adversarial_temperature)
    if kind == "rotate":
        # Entities drawn from U(0, 1) as in PyKEEN's own sun2019 RotatE configs: PyKEEN's RotatE scores with the L2
        # norm of h*r - t (the original uses the sum of complex moduli), and with its default Xavier init every
        # distance starts far below the margin, where the loss barely moves (valid MRR stayed at chance for 150
        # steps on CoDEx-S).
        model = RotatE(triples_factory=factory, embedding_dim=dim, entity_initializer="uniform", loss=loss,
                       random_seed=seed)
        return model, factory, {"dim": dim}
    if kind == "nodepiece":
        assert spec is not None and width % 2 == 0, "NodePiece needs a spec and an even real width"
        anchors = {"selection": "MixtureAnchorSelection", "searcher": _seeded_anchor_searcher(seed),
                   "selection_kwargs": {"selections": ["Degree", "PageRank", "Random"], "ratios": [0.4, 0.4, 0.2],
                                        "selections_kwargs": [None, None, {"random_seed": seed}],
                                        "num_anchors": spec.anchors}}
        model = NodePiece(
            triples_factory=factory, embedding_dim=width, interaction="rotate", aggregation="mlp",
            entity_initializer="xavier_uniform_", relation_initializer="init_phases",
            relation_constrainer="complex_normalize", tokenizers=["AnchorTokenizer", "RelationTokenizer"],
            num_tokens=[spec.anchor_tokens, spec.relation_tokens], tokenizers_kwargs=[anchors, {}], loss=loss,
            random_seed=seed)
        return model, factory, {"dim": width // 2, "real_width": width, **asdict(spec)}
    raise ValueError(f"kind must be 'rotate' or 'nodepiece', not {kind!r}")


@torch.no_grad()
def pykeen_rotate_ranks(model: torch.nn.Module, triples: np.ndarray, known: KnownAnswers, num_candidates: int, *,
                        batch_size: int = 256) -> dict[str, np.ndarray]:
    """Filtered realistic ranks (tail and head) under a PyKEEN model with the RotatE interaction (RotatE, NodePiece).

    PyKEEN scores -||h o r - t||_2 over complex vectors: tails from the query q = h o r, heads from q = t o conj(r),
    or, for a model trained on inverse triples, as tails of (t, r_inv). Its evaluator materialises the (batch,
    entities, dim) differences to do so, 100 s per 3,000 FB15k-237 validation triples on 2 cores, which would
    spend most of a PyKEEN run's budget on validation. The same distances as one product per batch,
    ||q - x||^2 = ||q||^2 + ||x||^2 - 2 <q, x> over the real views (float64, against cancellation), give the same
    ranks; tests check the metrics against PyKEEN's RankBasedEvaluator. The first `num_candidates` entities
    compete, with every other true answer in `known` filtered out.
    """
    from pykeen.utils import ensure_complex

    model.eval()
    entities, relations, _ = model._get_representations(h=None, r=None, t=None, mode=None)
    entities, relations = ensure_complex(entities, relations)

    def real(x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(x).flatten(-2).double()

    # Entities sharing a vector (NodePiece gives one to entities with the same tokens) must tie exactly, as in PyKEEN's
    # evaluator, but a matmul may round the same row differently at different columns: score each distinct row once
    # and spread the scores with `which`. Without shared rows (RotatE) that gather would only copy, so it is skipped.
    candidates = real(entities[:num_candidates])
    distinct, which = torch.unique(candidates, dim=0, return_inverse=True)
    if len(distinct) < len(candidates):
        candidates = distinct
    else:
        which = slice(None)
    candidates_sq = (candidates**2).sum(1)
    ranks: dict[str, list[torch.Tensor]] = {"tail": [], "head": []}
    for start in range(0, len(triples), batch_size):
        batch = triples[start : start + batch_size]
        h, r, t = (torch.as_tensor(batch[:, i], dtype=torch.long) for i in range(3))
        hr = model._prepare_batch(batch=torch.stack([h, r], 1), index_relation=1)  # 2r for inverse-triple models
        queries = {"tail": entities[hr[:, 0]] * relations[hr[:, 1]]}
        if model.use_inverse_triples:
            tr_inv = model._prepare_inverse_batch(batch=model._prepare_batch(torch.stack([r, t], 1), 0), index_relation=0)
            queries["head"] = entities[tr_inv[:, 0]] * relations[tr_inv[:, 1]]
        else:
            queries["head"] = entities[t] * torch.conj(relations[r])
        for predict, anchor, target in (("tail", batch[:, 0], t), ("head", batch[:, 2], h)):
            q = real(queries[predict])
            dist_sq = ((q**2).sum(1, keepdim=True) + candidates_sq[None, :] - 2 * q @ candidates.T)[:, which]
            filtered = torch.from_numpy(known.mask(anchor, batch[:, 1], side=predict, num_candidates=num_candidates))
            ranks[predict].append(realistic_ranks(dist_sq, target, filtered))
    return {k: (torch.cat(v).numpy() if v else np.zeros(0)) for k, v in ranks.items()}


class _BudgetSpent(Exception):
    """Raised from a callback to leave PyKEEN's loop mid-epoch (its own stop flag is read only between epochs)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def run_pykeen(ds: Dataset, kind: str, budget: Budget, out_dir: Path, *, dim: int = 0, width: int = 0,
               spec: NodePieceSpec | None = None, optim: Optim = Optim(), negatives_per_positive: int = 0,
               protocols: tuple[str, ...] = ("seen",), seed: int = 0, final_eval: bool = True) -> dict:
    """Train PyKEEN's RotatE (`kind="rotate"`, complex `dim`) or NodePiece+RotatE (`kind="nodepiece"`, real `width`).

    Same conditions as run_earl: sLCWA with the self-adversarial NSSA loss (margin, temperature), batch size,
    Adam and learning rate from `optim`, `negatives_per_positive` corruptions per positive (0: 2*optim.negatives,
    what run_earl draws; PyKEEN corrupts one side per negative; filtered against train), THREADS threads, the same wall-clock budget with validation counted in it,
    validation every `eval_every` steps on the same valid subset with filtered realistic MRR, early stopping with
    the same patience, best checkpoint tested. PyKEEN's own components are wired as its `pipeline()` would; the
    loop is driven directly so that a callback can stop it mid-epoch when the budget is spent.

    Resumable like run_earl: at every validation the callback checkpoints the model, Adam, the early-stopping state,
    the validation curve, the RNG and the training seconds spent (`PYKEEN_CHECKPOINT`, written atomically); a call on
    a directory holding one continues from it and the budget counts the training time of every attempt. PyKEEN's
    loop has no mid-epoch resume, so the resumed attempt starts a freshly shuffled epoch.
    """
    from pykeen.training import SLCWATrainingLoop
    from pykeen.training.callbacks import TrainingCallback

    warnings.filterwarnings("ignore", module=r"pykeen\..*")
    warnings.filterwarnings("ignore", message=r".*is not complex, but will be viewed as such")
    warnings.filterwarnings("ignore", message=r".*does not comply with the canonical complex tensor shape")
    logging.getLogger("pykeen").setLevel(logging.ERROR)
    torch.set_num_threads(THREADS)
    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    checkpoint_path = out_dir / PYKEEN_CHECKPOINT
    if not checkpoint_path.exists():
        shutil.rmtree(out_dir, ignore_errors=True)  # a leftover without a checkpoint is not this run's
    out_dir.mkdir(parents=True, exist_ok=True)
    wall0, machine = time.perf_counter(), Machine()

    model, factory, shape = build_pykeen_model(ds, kind, dim=dim, width=width, spec=spec, optim=optim, seed=seed)
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    setup_seconds = time.perf_counter() - wall0

    known = KnownAnswers(np.concatenate([x for x in (ds.train, ds.valid, ds.test) if x is not None and len(x)]),
                         ds.num_relations)

    def evaluate(triples: np.ndarray, restrict: bool) -> dict:
        """`restrict`: candidates are the training entities (the `seen` protocol), as run_earl ranks them."""
        ranks = pykeen_rotate_ranks(model, triples, known, ds.num_train_entities if restrict else ds.num_entities)
        return summarize(ranks)["both"]

    valid_triples = _seen_subset(ds, "valid", budget.eval_max_triples) if ds.valid is not None else None
    history: dict[str, list] = {"eval_steps": [], "eval_seconds": [], "eval_mrr": []}
    state = {"step": 0, "best_mrr": -1.0, "best_step": 0, "bad": 0, "best": None, "step_times": []}
    negatives = negatives_per_positive or 2 * optim.negatives
    optimizer = torch.optim.Adam(model.parameters(), lr=optim.lr)
    elapsed_before, resumed_from = 0.0, None
    if checkpoint_path.exists():
        saved = torch.load(checkpoint_path, weights_only=True)
        model.load_state_dict(saved["model"])  # NodePiece's token assignments are buffers: restored too
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        state.update(saved["state"])
        history = saved["history"]
        elapsed_before, resumed_from = saved["train_seconds"], state["step"]
    start = [0.0]

    def checkpoint() -> None:
        tmp = checkpoint_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                    "state": state, "history": history, "train_seconds": time.perf_counter() - start[0]}, tmp)
        os.replace(tmp, checkpoint_path)

    def validate(step: int) -> bool:
        """Validate the current weights, log them, keep them as the best if they are; True if they were."""
        mrr = evaluate(valid_triples, restrict=True)["mrr"]
        history["eval_steps"].append(step)
        history["eval_seconds"].append(time.perf_counter() - start[0])
        history["eval_mrr"].append(mrr)
        if mrr <= state["best_mrr"]:
            return False
        state.update(best_mrr=mrr, best_step=step, bad=0, best=copy.deepcopy(model.state_dict()))
        return True

    class BudgetCallback(TrainingCallback):
        def pre_batch(self, **kwargs: Any) -> None:
            self._t0 = time.perf_counter()

        def post_batch(self, epoch: int, batch, **kwargs: Any) -> None:
            state["step"] += 1
            state["step_times"].append(time.perf_counter() - self._t0)
            step = state["step"]
            if valid_triples is not None and budget.eval_every and step % budget.eval_every == 0:
                if not validate(step):
                    state["bad"] += 1
                self.model.train()  # PyKEEN re-enables training mode only at epoch start
                checkpoint()
                if state["bad"] >= budget.patience:
                    raise _BudgetSpent("early_stopping")
            if step >= budget.max_steps:
                raise _BudgetSpent("steps")
            if time.perf_counter() - start[0] > budget.minutes * 60:
                raise _BudgetSpent("time_limit")

    loop = SLCWATrainingLoop(model=model, triples_factory=factory, optimizer=optimizer, negative_sampler="basic",
                             negative_sampler_kwargs={"num_negs_per_pos": negatives, "filtered": True})
    start[0] = time.perf_counter() - elapsed_before  # the budget counts every attempt's training time
    # An attempt interrupted after its last checkpoint but before its record trains no further.
    stopped = ("early_stopping" if state["bad"] >= budget.patience else "steps" if state["step"] >= budget.max_steps
               else "time_limit" if elapsed_before > budget.minutes * 60 else None)
    if stopped is None:
        try:
            loop.train(triples_factory=factory, num_epochs=10**9, batch_size=optim.batch_size, use_tqdm=False,
                       use_tqdm_batch=False, callbacks=[BudgetCallback()])
            stopped = "steps"
        except _BudgetSpent as stop:
            stopped = stop.reason
    train_seconds = time.perf_counter() - start[0]
    # As in earl_service.train.loop: the steps since the last validation are validated once, outside the budget.
    last_validated = history["eval_steps"][-1] if history["eval_steps"] else 0
    if valid_triples is not None and budget.eval_every and state["step"] > last_validated:
        validate(state["step"])
    if state["best"] is not None:
        model.load_state_dict(state["best"])
    model.eval()
    valid = evaluate(_seen_subset(ds, "valid", 0), restrict=True) if final_eval and ds.valid is not None else {}
    test: dict[str, dict] = {}
    if final_eval and ds.test is not None:
        test["seen"] = evaluate(_seen_subset(ds, "test", 0), restrict=True)
        if "all" in protocols:
            test["all"] = (dict(test["seen"]) if ds.seen_mask(ds.test).all()
                           else evaluate(ds.test, restrict=False))
    path = out_dir / "pykeen_state.pt"
    torch.save(model.state_dict(), path)  # weights plus NodePiece's token assignment buffers
    times = state["step_times"][3:]
    return {
        "implementation": f"pykeen {_pykeen_version()}",
        "model": kind,
        **shape,
        "parameters": parameters,
        "steps": state["step"],
        "best_step": state["best_step"],
        **_stopped(budget, stopped, machine),
        "train_seconds": train_seconds,
        "setup_seconds": setup_seconds,
        "wall_seconds": time.perf_counter() - wall0,  # of the last attempt only, when resumed
        "resumed_from_step": resumed_from,
        "median_step_seconds": float(np.median(times)) if times else None,
        "step_seconds_total": float(sum(state["step_times"])),  # pre_batch to post_batch: no validation, no loading
        "valid": valid,
        "test": test,
        "artifact_bytes": path.stat().st_size,
        "artifact": "torch.save(model.state_dict()) (weights; NodePiece also its token assignments)",
        "history": history,
        "config": {"optim": optim.to_dict(), "negatives_per_positive": negatives, "seed": seed},
        "threads": THREADS,
    }


def _pykeen_version() -> str:
    from importlib.metadata import version

    return version("pykeen")


def effi(record: dict, protocol: str = "seen") -> float | None:
    """The paper's Effi: MRR per million parameters."""
    mrr = record.get("test", {}).get(protocol, {}).get("mrr")
    return None if mrr is None else mrr / (record["parameters"] / 1e6)
