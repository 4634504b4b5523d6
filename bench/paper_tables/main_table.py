"""Tables 2 and 3: EARL, RotatE, PyKEEN RotatE and PyKEEN NodePiece+RotatE at matched parameters, same budget."""

from __future__ import annotations

import argparse
from functools import partial

from harness import md_table, pyplot
from trainers import (
    Budget,
    dim_for_parameters,
    earl_parameters,
    nodepiece_width_for,
    pykeen_rotate_dim_for,
    run_earl,
    run_pykeen,
)

from earl_service.config import ModelConfig
from earl_service.train.loop import WARMUP_STEPS
from paper_tables.cache import Bench
from paper_tables.report import budget_line, fmt_bytes, quick_note, row_metrics, status
from paper_tables.settings import FULL_MINUTES, PAPER_MAIN, PROTOCOLS, SETTINGS

PROTOCOLS_NOTE = (
    "Protocols: `seen` drops test triples with an entity absent from train (the paper's); `all` ranks every "
    "test triple (entities first seen in test get an empty-neighbourhood embedding in EARL, an untrained "
    "vector drawn from the initial distribution in this repository's RotatE as in RotatE's own code, an "
    "untrained random vector in PyKEEN RotatE, padding tokens in NodePiece). "
    "Where no test triple has an unseen entity the two coincide. Filtered ranking against every entity, both "
    "directions, realistic ranks (ties count half). Effi = MRR per million trainable parameters.")
CONVERGED_NOTE = (
    "`converged?`: yes when early stopping ended training (patience exhausted) within the budget; otherwise "
    "the budget (time_limit) or the step cap ended it and the best validation checkpoint so far was tested.")


def _pykeen_note(negatives: int) -> str:
    return (f"PyKEEN rows: PyKEEN 1.11.1 components (sLCWA loop, NSSA loss with the same margin 10 and temperature "
            f"1, Adam lr 1e-3, batch 1024), {negatives or 512} negatives per positive (filtered against "
            "train), validation on the same triples at the same step cadence with the same early stopping, 2 threads; "
            "parameter counts matched to EARL's. PyKEEN models are ranked by the harness from PyKEEN's own score "
            "(-||h o r - t||, in a matmul form checked against PyKEEN's `RankBasedEvaluator` in the tests): PyKEEN's "
            "evaluator took 100 s per FB15k-237 validation, which would have spent most of the budget. PyKEEN "
            "materialises every negative's embedding, so its steps cost more than this repository's fused kernel: "
            "`s/step` above, and the probe below at the paper's 256+256 negatives. Saved bytes: EARL/RotatE the fp32 "
            "safetensors bundle (weights + graph + vocabularies); PyKEEN `torch.save(state_dict)`.")


def _matched_dims(b: Bench, name: str, earl: dict) -> tuple[int, int, int]:
    """(EARL's #P, this repository's RotatE dim: the paper's small dim, else #P matched; PyKEEN RotatE's dim)."""
    ds, st = b.dataset(name), SETTINGS[name]
    target = earl.get("parameters") or earl_parameters(ds, ModelConfig(dim=st.earl_dim))
    rdim = st.rotate_dim or dim_for_parameters(ds, ModelConfig(model="rotate"), target)
    return target, rdim, pykeen_rotate_dim_for(ds, target)


def _train_dataset(b: Bench, args: argparse.Namespace, name: str, minutes: float) -> None:
    """The table's rows for one dataset: EARL at the paper's dim, then its peers at the same parameter count."""
    ds, st = b.dataset(name), SETTINGS[name]
    budget = b.budget(name, minutes)
    earl = b.run(f"EARL+RotatE dim {st.earl_dim}", name,
                 partial(run_earl, ds, ModelConfig(dim=st.earl_dim, seed=args.seed), budget,
                         protocols=PROTOCOLS, seed=args.seed), row="earl")
    target, rdim, pdim = _matched_dims(b, name, earl)
    why = "paper's small dim" if st.rotate_dim else "#P matched to EARL"
    b.run(f"RotatE dim {rdim} ({why})", name,
          partial(run_earl, ds, ModelConfig(model="rotate", dim=rdim, seed=args.seed), budget,
                  protocols=PROTOCOLS, seed=args.seed), row="rotate")
    if args.no_pykeen:
        return
    b.run(f"PyKEEN RotatE dim {pdim} (#P matched)", name,
          partial(run_pykeen, ds, "rotate", budget, dim=pdim, protocols=PROTOCOLS, seed=args.seed,
                  negatives_per_positive=args.pykeen_negatives), row="pykeen_rotate")
    width = nodepiece_width_for(ds, target, st.nodepiece)
    b.run(f"PyKEEN NodePiece+RotatE dim {width // 2} (#P matched)", name,
          partial(run_pykeen, ds, "nodepiece", budget, width=width, spec=st.nodepiece, protocols=PROTOCOLS,
                  seed=args.seed, negatives_per_positive=args.pykeen_negatives), row="pykeen_nodepiece")


def _probe(b: Bench, name: str, steps: int) -> list[str]:
    """What a step costs PyKEEN at the paper's negatives (256 per side = 512 per positive), beside this repo's."""
    ds = b.dataset(name)
    probe = Budget(minutes=60, max_steps=steps, eval_every=0)
    earl_rec = next(r for r in b.records if r["dataset"] == name and r["row"] == "earl")
    _, rdim, pdim = _matched_dims(b, name, earl_rec)
    b.run(f"probe: RotatE dim {rdim}, 256+256 negatives", name,
          partial(run_earl, ds, ModelConfig(model="rotate", dim=rdim), probe, final_eval=False), row="probe")
    b.run(f"probe: PyKEEN RotatE dim {pdim}, 512 negatives per positive", name,
          partial(run_pykeen, ds, "rotate", probe, dim=pdim, negatives_per_positive=512, final_eval=False),
          row="probe")
    probe_rows = [[r["label"], r.get("steps"), r.get("median_step_seconds")]
                  for r in b.records if r.get("row") == "probe"]
    return ["", f"Step-cost probe on {name} at the paper's negatives ({steps} steps each, median over "
            f"steps {WARMUP_STEPS + 1}+):", "", md_table(["run", "steps", "median s/step"], probe_rows)]


def _dataset_markdown(b: Bench, name: str) -> list[str]:
    recs = [r for r in b.records if r["dataset"] == name]
    rows = []
    for protocol in PROTOCOLS:
        for r in recs:
            if r.get("row") == "probe":
                continue
            mrr, h10, eff = row_metrics(r, protocol)
            rows.append([protocol, r["label"], r.get("implementation", ""), r.get("dim"), r.get("parameters"), mrr,
                         h10, eff, r.get("train_seconds"), r.get("steps"), r.get("median_step_seconds"),
                         fmt_bytes(r.get("artifact_bytes")), status(r)])
    md = [f"## {name} (test split)", "",
          md_table(["protocol", "model", "implementation", "dim", "#P", "MRR", "Hits@10", "Effi (MRR/M#P)",
                    "train s", "steps", "s/step", "saved bytes", "converged?"], rows), "", budget_line(recs), ""]
    if name in PAPER_MAIN:
        md += [f"Paper, {name} (reported, seen protocol, GPU, up to 100k steps):", "",
               md_table(["model", "dim", "#P (M)", "MRR", "Hits@10"], [list(x) for x in PAPER_MAIN[name]]), ""]
    return md


def cmd_main(args: argparse.Namespace) -> None:
    b = Bench("main", args)
    names = args.data or (["codex-s"] if args.quick else ["fb15k-237", "wn18rr"])
    minutes = args.minutes or (4.0 if args.quick else FULL_MINUTES)
    for name in names:
        _train_dataset(b, args, name, minutes)
    probe_md = _probe(b, names[0], args.probe_steps) if not args.no_pykeen and args.probe_steps else []
    md = ["# Main table (paper Tables 2 and 3): link prediction at a small parameter budget, same time budget",
          quick_note(args), f"![test MRR against parameters]({main_png(b, names)})", ""]
    for name in names:
        md += _dataset_markdown(b, name)
    md += [PROTOCOLS_NOTE, "", _pykeen_note(args.pykeen_negatives), *probe_md, "", CONVERGED_NOTE]
    b.write({"datasets": names, "minutes_per_run": minutes, "pykeen_negatives_per_positive": args.pykeen_negatives},
            "\n".join(md))


def _label_below(x: float, y: float, points: list[tuple], ax) -> bool:
    """Whether a run's label goes below its point: when a higher run sits close to its right, under where the label
    (about 45% of the axes wide) would run (WN18RR's PyKEEN RotatE 3.77M / 0.472 beside RotatE dim 50 4.06M / 0.474)."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return any(0 < px - x < 0.45 * (x1 - x0) and 0 <= py - y < 0.04 * (y1 - y0) for px, py, _ in points)


def main_png(b: Bench, names: list[str]) -> str:
    """Test MRR (seen) against #P per dataset: the finished runs here, filled, beside the paper's, hollow."""
    plt = pyplot()
    colour = {"earl": "C0", "rotate": "C1", "pykeen_rotate": "C2", "pykeen_nodepiece": "C3"}
    paper_colour = {"EARL+RotatE": "C0", "RotatE": "C1", "NodePiece+RotatE": "C3"}
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        points = [(r["parameters"] / 1e6, mrr, r) for r in b.records
                  if r["dataset"] == name and r.get("row") in colour and (mrr := row_metrics(r)[0]) is not None]
        for x, y, r in points:
            ax.scatter(x, y, c=colour[r["row"]], zorder=3)
        for model, dim, params, mrr, _ in (x for x in PAPER_MAIN.get(name, []) if x[2] < 10):  # large dims: off-scale
            ax.scatter(params, mrr, facecolors="none", edgecolors=paper_colour[model], zorder=2)
            ax.annotate(f"paper: {model} {dim}", (params, mrr), fontsize=7, color="grey", xytext=(4, -9),
                        textcoords="offset points")
        ax.margins(x=0.3, y=0.15)
        for x, y, r in points:  # after the margins: label placement reads the axes' limits
            ax.annotate(r["label"], (x, y), fontsize=7, xytext=(4, -9 if _label_below(x, y, points, ax) else 3),
                        textcoords="offset points")
        ax.scatter([], [], c="grey", label="filled: this table's runs (CPU budget)")
        ax.scatter([], [], facecolors="none", edgecolors="grey", label="hollow: paper (GPU, to convergence)")
        ax.legend(fontsize=7, loc="best")
        ax.set(xlabel="trainable parameters (M)", ylabel="test MRR (filtered, seen)", title=name)
        ax.grid(alpha=0.3)
    return b.png(fig)

