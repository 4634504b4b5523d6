"""Speed table: seconds per training step, peak RSS and full filtered evaluation time, fast vs naive.

Each configuration trains in its own process (so peak RSS is its own) with the library's `earl train`:
EARL (float32 and bf16 autocast), EARL encoding every entity's input rows (no grouping of repeated ones,
`graph.CompactInputs`), the matched-budget RotatE, and EARL with the paper's GNN computed edge by edge plus
unfused RotatE negative scoring (the reference code's approach) so the speed-up is one ratio measured in one
run. Then the full filtered test evaluation (both directions) is timed.

    python bench/speed.py                 # FB15k-237 (dim 150) and WN18RR (dim 200), 30 steps each
    python bench/speed.py --quick         # FB15k-237 only, 10 steps, naive reference 4 steps
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument, md_table, write_results

DATASETS = {"fb15k-237": 150, "wn18rr": 200}


def matched_rotate_dim(params: int, entities: int, relations: int) -> int:
    """The RotatE dim whose parameter count (2*dim per entity + dim per relation) is closest to `params`."""
    return max(1, round(params / (2 * entities + relations)))


# Trainers with parts of the library replaced, run as `python -c <code> train ...`.
EVERY_ROW = """
import sys
from earl_service.model import graph as graph
from earl_service.cli.main import main
# Every entity's initial embedding and first-layer transforms computed, repeated input rows included.
graph.compact_inputs = lambda *args, **kwargs: None
sys.exit(main(sys.argv[1:]))
"""
NAIVE = """
import sys
from earl_service.model import graph as graph
from earl_service.model import kernels as kernels
from earl_service.model import modules as model
from earl_service.train import loop as train
from earl_service.cli.main import main
# The reference code's approach: every entity's inputs encoded, h^0 and each layer map by map with per-edge
# linear maps, and a materialised (B, K, 2d) gather for the negatives.
graph.compact_inputs = lambda *args, **kwargs: None
def naive_forward(self, graph, layers=None):
    h, rel = self.initial(graph), self.relations
    for layer in self.gnn:
        h, rel = layer.forward_naive(h, rel, graph.triples)
    return h, rel
model.EARL.forward = naive_forward
train.rotate_distance = kernels.rotate_distance_torch
sys.exit(main(sys.argv[1:]))
"""


def run_train(data: Path, dim: int, steps: int, extra: list[str], code: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as out:
        args = ["train", str(data), "--out", out, "--dim", str(dim), "--steps", str(steps), "--eval-every", "0",
                "--no-final-eval", "--no-progress", "--threads", "2", "--recipe", "paper", *extra]
        cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "earl_service.cli.main", *args]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    return {"median_step_seconds": metrics["median_step_seconds"], "peak_rss_mb": metrics["peak_rss_mb"],
            "trainable_parameters": metrics["trainable_parameters"], "steps": steps, "process_seconds": wall}


def time_evaluation(data: Path, dim: int) -> dict:
    """Full filtered test evaluation (seen protocol, tail + head) of an untrained model: ranking cost only."""
    code = f"""
import json, time, torch
torch.set_num_threads(2)
from earl_service.config import ModelConfig
from earl_service.data.dataset import load_dataset
from earl_service.train.run import Run
ds = load_dataset({str(data)!r})
run = Run.build(ds, ModelConfig(dim={dim}), torch.device("cpu"))
t0 = time.perf_counter()
m = run.evaluate("test", "seen")
print(json.dumps({{"seconds": time.perf_counter() - t0, "rankings": m["count"]}}))
"""
    return run_json(code)


def run_json(code: str, *argv: str) -> dict:
    """Run `python -c code argv...` in its own process and parse the JSON object on its last stdout line."""
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_datasets_argument(parser)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--naive-steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bf16", action="store_true",
                        help="time bf16 autocast also on a CPU without native bfloat16 (emulated: slow)")
    args = parser.parse_args()
    names = ["fb15k-237"] if args.quick else list(DATASETS)
    steps, naive_steps = (10, 4) if args.quick else (args.steps, args.naive_steps)

    from earl_service.data.dataset import load_dataset
    from earl_service.train.run import cpu_has_native_bf16

    rows, results = [], {}
    for name in names:
        data, dim = args.datasets / name, DATASETS[name]
        ds = load_dataset(data)
        res: dict = {}
        res["earl_fp32"] = run_train(data, dim, steps, [])
        if args.bf16 or cpu_has_native_bf16():
            res["earl_bf16"] = run_train(data, dim, steps, ["--compute", "bf16"])
        rdim = matched_rotate_dim(res["earl_fp32"]["trainable_parameters"], ds.num_train_entities, ds.num_relations)
        res["rotate_matched"] = {**run_train(data, rdim, steps, ["--model", "rotate"]), "dim": rdim}
        res["earl_every_row"] = run_train(data, dim, steps, [], code=EVERY_ROW)
        res["earl_naive_reference"] = run_train(data, dim, naive_steps, [], code=NAIVE)
        res["evaluation"] = time_evaluation(data, dim)
        results[name] = res
        naive = res["earl_naive_reference"]["median_step_seconds"]
        for key, label in (("earl_fp32", f"EARL dim {dim} (fp32)"), ("earl_bf16", f"EARL dim {dim} (bf16 autocast)"),
                           ("earl_every_row", f"EARL dim {dim} (fp32, repeated input rows not grouped)"),
                           ("rotate_matched", f"RotatE dim {rdim} (matched #P)"),
                           ("earl_naive_reference", f"EARL dim {dim}, naive per-edge (reference approach)")):
            if key not in res:
                continue
            r = res[key]
            rows.append([name, label, r["trainable_parameters"], r["median_step_seconds"], naive / r["median_step_seconds"],
                         r["peak_rss_mb"], r["steps"]])
    bf16_note = ([] if any("earl_bf16" in r for r in results.values()) else
                 [("bf16 autocast not timed: this CPU has no native bfloat16 matmul (AVX512-BF16 / AMX), so autocast "
                   "is emulated and several times slower than float32 (`--bf16` times it anyway)."), ""])
    md = ["# Training speed (paper settings: batch 1024, 256 negatives per side, full-graph encoding every step)", "",
          *bf16_note,
          md_table(["dataset", "configuration", "#P", "median s/step", "speed-up vs naive", "peak RSS MB", "steps timed"],
                   rows), "", "## Full filtered test evaluation (seen protocol, tail + head, realistic ranks)", "",
          md_table(["dataset", "rankings", "seconds"],
                   [[n, r["evaluation"]["rankings"], r["evaluation"]["seconds"]] for n, r in results.items()])]
    js, mdp = write_results("speed_quick" if args.quick else "speed", {"results": results}, "\n".join(md))
    print(mdp.read_text())


if __name__ == "__main__":
    main()
