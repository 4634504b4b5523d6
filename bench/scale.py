"""Scale: peak memory and seconds per step of sampled and full-graph training on synthetic power-law KGs.

Graphs come from earl_service.data.synthetic (Zipf popularity degrees, Zipf relation frequencies, typed relations;
10 train triples per entity, 200 relations, seed 0). Every configuration runs `train()` in a fresh process, so
its memory figures are its own:
- graph build: building the training structures (sampled: the neighbour index with the exact kNResEnt tables;
  full-graph: the CSR message/ConRel/kNN matrices) and the negative sampler, from a reset peak after the
  synthetic graph is drawn. Its peak and what stays resident afterwards are O(E).
- training steps: the peak RSS over the timed steps (peak counter reset after the build), and the step working
  set = that peak minus the RSS after the build. For sampled training it depends on the batch, the fan-out and
  the degree distribution, not on the number of entities; for full-graph training it grows with N.
Full-graph training runs where it fits (--full-sizes); beyond, its step working set is extrapolated linearly in
N from the largest measured size and marked as such.

    python bench/scale.py            # 100k, 300k, 1M entities; sampled (20 steps) everywhere, full-graph at 100k, 300k
    python bench/scale.py --quick    # 20k and 50k entities, 6 steps: a smoke run of the whole script
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, pyplot, write_results

CHILD = "--child"


def child(spec: dict) -> dict:
    """One configuration in this (fresh) process: draw the graph, then train() with the timed steps."""
    import gc
    import resource

    import torch

    from earl_service.config import ModelConfig, TrainConfig
    from earl_service.data.synthetic import SyntheticConfig, generate
    from earl_service.memory import current_rss_mb, reset_peak_rss
    from earl_service.train.loop import train

    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    kg = generate(SyntheticConfig(entities=spec["entities"], triples_per_entity=spec["triples_per_entity"],
                                  relations=spec["relations"], valid=1000, test=1000, seed=0))
    dataset = kg.to_dataset()
    degree = torch.bincount(torch.from_numpy(kg.train[:, [0, 2]].reshape(-1)), minlength=kg.num_entities)
    generate_seconds = time.perf_counter() - t0
    del kg
    gc.collect()
    data_rss = current_rss_mb()
    reset_peak_rss()
    sampled = spec["mode"] == "sampled"
    train_cfg = TrainConfig(steps=spec["steps"], batch_size=spec["batch_size"], negatives=spec["negatives"],
                            eval_every=0, checkpoint_every=0, progress=False, threads=spec["threads"], seed=0,
                            sampled=sampled, fanout=tuple(spec["fanout"]), negative_chunk=spec["negative_chunk"])
    with tempfile.TemporaryDirectory() as out:
        metrics = train(dataset, ModelConfig(dim=spec["dim"]), train_cfg, out, final_eval=False, write_bundle=False)
        history = json.loads((Path(out) / "history.json").read_text())
    mem = metrics["memory"]
    return {
        **spec,
        "train_triples": metrics["train_triples"],
        "max_degree": int(degree.max()),
        "median_degree": float(degree.float().median()),
        "trainable_parameters": metrics["trainable_parameters"],
        "generate_seconds": generate_seconds,
        "data_rss_mb": data_rss,
        "graph_build_seconds": mem["graph_build_seconds"],
        "build_peak_rss_mb": mem["build_peak_rss_mb"],
        "after_build_rss_mb": mem["after_build_rss_mb"],
        "index_mb": mem["index_mb"],
        "train_peak_rss_mb": mem["train_peak_rss_mb"],
        "step_working_set_mb": mem["train_peak_rss_mb"] - mem["after_build_rss_mb"],
        "median_step_seconds": metrics["median_step_seconds"],
        "step_seconds": history["step_times"],
        "median_encoded_entities": metrics["median_encoded_entities"],
        "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # includes generation
    }


# glibc malloc with a fixed 1 MiB mmap threshold: freed tensors leave the RSS at once. With the default dynamic
# threshold, per-thread arenas keep freed activations of up to 32 MiB resident, and the RSS then measures the
# allocator's history (a 20k-entity full-graph run showed a higher step peak than a 50k one).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={1 << 20}"}


def run_child(spec: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **MALLOC_ENV})
    if done.returncode != 0:
        raise RuntimeError(f"{spec} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - t0
    print(f"  {spec['mode']:8s} {spec['entities']:>9,d} entities: {result['median_step_seconds']:.3g} s/step, "
          f"build peak {result['build_peak_rss_mb']:.0f} MB, step peak {result['train_peak_rss_mb']:.0f} MB "
          f"({result['process_seconds']:.0f} s)", flush=True)
    return result


def plot(rows: list[dict], extrapolated: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, marker in (("sampled", "o"), ("full", "s")):
        part = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["entities"])
        if not part:
            continue
        n = [r["entities"] for r in part]
        mem_ax.plot(n, [r["step_working_set_mb"] / 1024 for r in part], marker=marker, label=f"{mode}: step working set")
        mem_ax.plot(n, [r["after_build_rss_mb"] / 1024 for r in part], marker=marker, ls="--",
                    label=f"{mode}: resident after graph build")
        time_ax.plot(n, [r["median_step_seconds"] for r in part], marker=marker, label=mode)
    for r in extrapolated:
        mem_ax.plot([r["entities"]], [r["step_working_set_mb"] / 1024], marker="x", ls="", color="k",
                    label="full: extrapolated (not run)")
    mem_ax.set(xscale="log", yscale="log", xlabel="entities (10 train triples each)", ylabel="GiB",
               title="memory")
    time_ax.set(xscale="log", yscale="log", xlabel="entities (10 train triples each)", ylabel="seconds per step",
                title="median seconds per training step")
    mem_ax.legend(fontsize=7)
    time_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--full-sizes", default="100000,300000", help="sizes where full-graph training also runs")
    parser.add_argument("--steps", type=int, default=20, help="sampled steps per size")
    parser.add_argument("--full-steps", type=int, default=6, help="full-graph steps per size")
    parser.add_argument("--dim", type=int, default=150)
    parser.add_argument("--fanout", default="10,10")
    parser.add_argument("--negative-chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch-sweep", default=None, metavar="B,B,...",
                        help="instead: sampled training at the first size only, one run per batch size "
                             "(negatives and chunk scaled alike), written to scale_batch.*")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.full_sizes, args.steps, args.full_steps = "20000,50000", "20000,50000", 6, 5
    sizes = [int(x) for x in args.sizes.split(",")]
    full_sizes = {int(x) for x in args.full_sizes.split(",") if x}
    base = {"triples_per_entity": 10.0, "relations": 200, "dim": args.dim, "batch_size": 1024, "negatives": 256,
            "fanout": [int(x) for x in args.fanout.split(",")], "negative_chunk": args.negative_chunk,
            "threads": args.threads}
    if args.batch_sweep:
        batch_sweep(base, sizes[0], [int(x) for x in args.batch_sweep.split(",")], args)
        return
    rows = []
    for n in sizes:
        rows.append(run_child({**base, "entities": n, "mode": "sampled", "steps": args.steps}, args.timeout))
        if n in full_sizes:
            rows.append(run_child({**base, "entities": n, "mode": "full", "steps": args.full_steps}, args.timeout))
    write_scale(rows, sizes, full_sizes, base, args)


def write_scale(rows: list[dict], sizes: list[int], full_sizes: set[int], base: dict,
                args: argparse.Namespace) -> None:
    """The table, figure and JSON of a scale run; full-graph memory extrapolated to the sizes it did not run."""
    full = sorted((r for r in rows if r["mode"] == "full"), key=lambda r: r["entities"])
    extrapolated = []
    if full:
        per_entity = full[-1]["step_working_set_mb"] / full[-1]["entities"]
        extrapolated = [{"entities": n, "mode": "full", "step_working_set_mb": per_entity * n, "extrapolated": True}
                        for n in sizes if n not in full_sizes]

    table = []
    for r in sorted(rows, key=lambda r: (r["entities"], r["mode"] != "sampled")):
        table.append([f"{r['entities']:,}", f"{r['train_triples']:,}", r["mode"], r["median_encoded_entities"],
                      r["graph_build_seconds"], r["build_peak_rss_mb"], r["after_build_rss_mb"],
                      r["train_peak_rss_mb"], r["step_working_set_mb"], r["median_step_seconds"], r["steps"]])
    for r in extrapolated:
        table.append([f"{r['entities']:,}", "", "full (extrapolated, not run)", None, None, None, None, None,
                      r["step_working_set_mb"], None, None])
    fanout = ",".join(map(str, base["fanout"]))
    md = [
        "# Scale: sampled vs full-graph training on synthetic power-law KGs",
        "",
        (f"EARL dim {args.dim}, batch 1024, 256 negatives per side, {args.threads} threads; sampled: fan-out {fanout}, "
         f"chunks of {args.negative_chunk} positives sharing their negatives. Memory in MB (RSS). 'step working set' "
         "= peak over the training steps minus the RSS after the graph build; 'encoded' = entities encoded per step."),
        "",
        md_table(["entities", "train triples", "mode", "encoded", "build s", "build peak", "after build",
                  "step peak", "step working set", "s/step (median)", "steps"], table),
        "",
        ("Graph degrees (max / median): " + ", ".join(
            f"{r['entities']:,}: {r['max_degree']:,} / {r['median_degree']:g}" for r in rows if r["mode"] == "sampled")),
    ]
    name = "scale_quick" if args.quick else "scale"
    write_results(name, {"results": rows, "extrapolated": extrapolated, "settings": base}, "\n".join(md))
    plot(rows, extrapolated, Path(__file__).resolve().parent / "results" / f"{name}.png")
    print((Path(__file__).resolve().parent / "results" / f"{name}.md").read_text())


def batch_sweep(base: dict, entities: int, batches: list[int], args: argparse.Namespace) -> None:
    """Per-step memory and time against the batch at a fixed graph: chunks keep 256 positives sharing 256
    negatives per side, so the entities to encode grow with the batch."""
    rows = [run_child({**base, "entities": entities, "mode": "sampled", "steps": args.steps, "batch_size": b},
                      args.timeout) for b in batches]
    table = [[r["batch_size"], r["median_encoded_entities"], r["after_build_rss_mb"], r["train_peak_rss_mb"],
              r["step_working_set_mb"], r["median_step_seconds"], r["steps"]] for r in rows]
    fanout = ",".join(map(str, base["fanout"]))
    title = f"# Sampled training: per-step memory against the batch ({entities:,} entities, {entities * 10:,} triples)"
    md = [title, "",
          (f"EARL dim {args.dim}, fan-out {fanout}, chunks of {args.negative_chunk} positives sharing 256 negatives "
           "per side. Memory in MB (RSS)."), "",
          md_table(["batch", "encoded", "after build", "step peak", "step working set", "s/step (median)", "steps"],
                   table)]
    write_results("scale_batch", {"results": rows, "settings": base}, "\n".join(md))
    print((Path(__file__).resolve().parent / "results" / "scale_batch.md").read_text())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CHILD:
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
