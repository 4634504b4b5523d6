"""Hostile requests against a live API server (issue 34): status, time and the server's peak RSS growth per case,
for the code at --before and for this tree.

    python bench/abuse.py [--before 940aca6] [--before-tree /tmp/abuse-before] [--weights-mib 512] [--only TEXT]

"before" runs `uvicorn api.main:app` from a git worktree of --before (made with `git worktree add --detach` when
--before-tree does not exist yet), "after" from this tree; each server gets a fresh EARL_HOME. Before every case
the server's peak RSS is reset (`echo 5 > /proc/PID/clear_refs`), so a case's growth is VmHWM after it minus VmRSS
before it, whatever earlier cases did. The bundles are made from an untrained CoDEx-S EARL model (dim 16): the
cases are about what a file can make the server do, not about what it learned.
"""

from __future__ import annotations

import argparse
import functools
import json
import lzma
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, api_server, md_table, write_results

MB = 2**20
NESTED = "[" * 100_000 + "]" * 100_000  # deeper than any JSON parser's recursion limit
GOOD_TRIPLES = b"a\tr\tb\nb\tr\tc\n"


# ---------------------------------------------------------------- the server's memory


def status_kib(pid: int, key: str) -> int:
    """VmRSS, VmHWM, ... of process `pid` in KiB, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def reset_peak(pid: int) -> int:
    """Reset the process's peak RSS (VmHWM) to its current RSS; returns that RSS in KiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kib(pid, "VmRSS")


# ---------------------------------------------------------------- hostile bundles, made from a good one


def good_bundle(path: Path, *, model: str = "earl") -> Path:
    """An untrained CoDEx-S bundle (dim 16, fp32, plain tensors): its vocabularies and graph are real."""
    import torch

    from earl_service.bundle.model_io import bundle_from_model
    from earl_service.config import ModelConfig
    from earl_service.data.dataset import load_dataset
    from earl_service.model.graph import choose_reserved
    from earl_service.model.modules import build_model

    ds = load_dataset(REPO / "earl_service" / "demo_data" / "codex-s")
    config = ModelConfig(model=model, dim=16)
    reserved = choose_reserved(ds.num_entities, config.reserved_ratio, 0) if model == "earl" else torch.zeros(
        0, dtype=torch.long)
    built = build_model(config, ds.num_entities, ds.num_relations, reserved)
    return bundle_from_model(built, config, ds.entities, ds.relations, ds.train).save(path)


@functools.cache
def source_bundle(model: str = "earl") -> bytes:
    """good_bundle's bytes, made once per process."""
    with tempfile.TemporaryDirectory() as tmp:
        return good_bundle(Path(tmp) / "bundle.safetensors", model=model).read_bytes()


def _parts(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors (coded weights left coded) and metadata of a bundle file's bytes, checksum dropped."""
    from earl_service.bundle.format import read_safetensors

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "b").write_bytes(data)
        meta, tensors, _ = read_safetensors(Path(tmp) / "b")
    meta.pop("payload_sha256")
    return dict(tensors), meta


def _write(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> bytes:
    from earl_service.bundle.format import write_safetensors

    with tempfile.TemporaryDirectory() as tmp:
        return write_safetensors(Path(tmp) / "b", tensors, meta).read_bytes()


def weights_bomb(data: bytes, *, decoded_mib: int = 512) -> bytes:
    """Item 1: the weights coded as byte planes + xz, whose manifest declares its first tensor `decoded_mib` MiB
    large and whose xz stream does decode to that many zero bytes (about 80 KB per 512 MiB)."""
    from earl_service.bundle.model_io import load_bundle

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "b").write_bytes(data)
        tensors, meta = load_bundle(Path(tmp) / "b").to_tensors("fp16", "planes-xz")
    manifest = json.loads(meta["weights_manifest"])
    cols = manifest[0][2][-1]
    manifest[0][2] = [decoded_mib * MB // (2 * cols), cols]  # float16: 2 bytes a value
    total = sum(np.dtype(d).itemsize * int(np.prod(shape)) for _, d, shape in manifest)
    packer = lzma.LZMACompressor(preset=0)
    chunk = bytes(64 * MB)
    blob = b"".join(packer.compress(chunk[: min(len(chunk), total - at)]) for at in range(0, total, len(chunk)))
    blob += packer.flush()
    tensors = {**tensors, "weights.packed": np.frombuffer(blob, dtype=np.uint8)}
    return _write(tensors, {**meta, "weights_manifest": json.dumps(manifest)})


def _graph(data: bytes, make: Callable[[int, int, int], bytes]) -> bytes:
    """The bundle with its graph replaced by xz(make(entities, relations, edges)), the raw CSR bytes."""
    from earl_service.bundle.format import unpack_graph, unpack_strings

    tensors, meta = _parts(data)
    n, num_rel = len(unpack_strings(tensors["vocab.entities"])), len(unpack_strings(tensors["vocab.relations"]))
    raw = make(n, num_rel, len(unpack_graph(tensors["graph.packed"])))
    tensors["graph.packed"] = np.frombuffer(lzma.compress(raw, preset=1), dtype=np.uint8)  # ~10 MB to pack
    return _write(tensors, meta)


def graph_bomb(data: bytes) -> bytes:
    """Item 3: a graph whose per-entity counts give entity 0 2**27 edges while its header (and arrays) hold E."""
    def make(n: int, num_rel: int, edges: int) -> bytes:
        counts = np.zeros(n, dtype=np.uint32)
        counts[0] = 2**27
        rel, tail = np.zeros(edges, dtype=np.uint8), np.zeros(edges, dtype=np.uint16)
        header = np.array([n, num_rel, edges, 4], dtype=np.uint64)
        return header.tobytes() + counts.tobytes() + rel.tobytes() + tail.tobytes()
    return _graph(data, make)


def duplicate_edges(data: bytes, edges: int = 5_500_000) -> bytes:
    """Item 4: one edge repeated `edges` times (16.5 MB raw: inside the 16 MiB floor of the xz ratio cap)."""
    def make(n: int, num_rel: int, _: int) -> bytes:
        counts = np.zeros(n, dtype=np.uint32)
        counts[0] = edges
        tail = np.ones(edges, dtype=np.uint16)
        header = np.array([n, num_rel, edges, 4], dtype=np.uint64)
        return header.tobytes() + counts.tobytes() + np.zeros(edges, dtype=np.uint8).tobytes() + tail.tobytes()
    return _graph(data, make)


def with_tensor(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[bytes], bytes]:
    def make(data: bytes) -> bytes:
        tensors, meta = _parts(data)
        return _write({**tensors, name: change(tensors[name].copy())}, meta)
    return make


def with_header(change: Callable[[dict], object]) -> Callable[[bytes], bytes]:
    """The bundle with its safetensors header replaced by change(header) (JSON, or bytes as they are); the
    payload and its checksum stay as they were."""
    def make(data: bytes) -> bytes:
        (n,) = struct.unpack("<Q", data[:8])
        header = change(json.loads(data[8 : 8 + n]))
        raw = header if isinstance(header, bytes) else json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + data[8 + n :]
    return make


def with_metadata(**values: str) -> Callable[[bytes], bytes]:
    return with_header(lambda h: {**h, "__metadata__": {**h["__metadata__"], **values}})


def with_config(**values: object) -> Callable[[bytes], bytes]:
    def change(header: dict) -> dict:
        meta = header["__metadata__"]
        return {**header, "__metadata__": {**meta, "config": json.dumps({**json.loads(meta["config"]), **values})}}
    return with_header(change)


def _nan_row(values: np.ndarray) -> np.ndarray:
    values[0] = np.nan
    return values


# ---------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Sources:
    earl: bytes
    rotate: bytes
    weights_mib: int


@dataclass(frozen=True)
class Case:
    item: int
    name: str
    make: Callable[[Sources], bytes] | None  # the bundle to upload (None: `send` does everything)
    then: str = ""  # after a 201: "predict" (one query), or "list" (GET /models, /metrics, an unknown model)
    send: Callable[[httpx.Client], list[httpx.Response]] | None = None


def job(files: dict[str, tuple[str, bytes]]) -> Callable[[httpx.Client], list[httpx.Response]]:
    return lambda http: [http.post("/jobs", files={"train": ("train.txt", GOOD_TRIPLES), **files})]


def gzip_of_duplicates(unpacked_mib: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    block = GOOD_TRIPLES * (MB // len(GOOD_TRIPLES))
    return b"".join(packer.compress(block) for _ in range(unpacked_mib)) + packer.flush()


def distinct_triples(mib: int) -> bytes:
    rng = np.random.default_rng(0)
    n = mib * MB // 22  # "Q1234567\tP123\tQ7654321\n"
    h, t = rng.integers(1_000_000, 1_100_000, size=(2, n)).tolist()
    r = rng.integers(100, 600, size=n).tolist()
    return "".join(f"Q{a}\tP{b}\tQ{c}\n" for a, b, c in zip(h, r, t, strict=True)).encode()


CASES = [
    Case(1, "coded weights whose manifest declares huge tensors", lambda s: weights_bomb(s.earl,
                                                                                         decoded_mib=s.weights_mib)),
    Case(3, "graph header: 2**27 edges for one entity", lambda s: graph_bomb(s.earl)),
    Case(4, "graph of 5.5M duplicate edges, then one predict", lambda s: duplicate_edges(s.earl), then="predict"),
    Case(5, "RotatE with a NaN relation row, then one predict",
         lambda s: with_tensor("param.relations", _nan_row)(s.rotate), then="predict"),
    Case(5, "RotatE entity values of 1e30, then one predict",
         lambda s: with_tensor("param.entities", lambda v: np.sign(v) * np.float32(1e30))(s.rotate), then="predict"),
    Case(5, "EARL with gamma = -epsilon, then one predict", lambda s: with_config(gamma=-2.0, epsilon=2.0)(s.earl),
         then="predict"),
    Case(6, "__metadata__ a JSON list", lambda s: with_header(lambda h: {**h, "__metadata__": [1, 2]})(s.earl)),
    Case(6, "config a JSON string", lambda s: with_metadata(config='"earl"')(s.earl)),
    Case(6, "config nested 100k deep", lambda s: with_metadata(config=NESTED)(s.earl)),
    Case(6, "relation labels nested 100k deep", lambda s: with_metadata(relation_labels=NESTED)(s.earl)),
    Case(6, "safetensors header nested 100k deep", lambda s: with_header(lambda h: NESTED.encode())(s.earl)),
    Case(6, "POST /jobs, relation_labels nested 100k deep", None,
         send=job({"relation_labels": ("labels.json", NESTED.encode())})),
    Case(6, "metrics a JSON string, sent twice", lambda s: with_metadata(metrics='"good"')(s.earl), then="again"),
    Case(7, "35 MB of metrics, then GET /models, /metrics, an unknown model",
         lambda s: with_metadata(metrics=json.dumps({"pad": "x" * 35_000_000}))(s.earl), then="list"),
    Case(2, "POST /jobs, gzip of duplicate lines (31 MiB unpacked)", None,
         send=job({"train": ("train.txt.gz", gzip_of_duplicates(31))})),
    Case(2, "POST /jobs, 16 MiB plain, distinct triples", None,
         send=job({"train": ("train.txt", distinct_triples(16))})),
]


def run_case(http: httpx.Client, case: Case, sources: Sources) -> tuple[list[httpx.Response], list[float]]:
    """Send the case; returns every response and the seconds of each."""
    def timed(request: Callable[[], httpx.Response]) -> None:
        t0 = time.perf_counter()
        answers.append(request())
        seconds.append(time.perf_counter() - t0)

    answers: list[httpx.Response] = []
    seconds: list[float] = []
    if case.send is not None:
        t0 = time.perf_counter()
        answers += case.send(http)
        return answers, [time.perf_counter() - t0]
    assert case.make is not None
    body = case.make(sources)
    timed(lambda: http.post("/models", files={"bundle": ("hostile.safetensors", body)}))
    model = answers[0].json().get("id") if answers[0].status_code == 201 else None
    if case.then == "predict" and model:
        timed(lambda: http.get("/predict", params={"model": model, "head": "Q7604", "relation": "P1412"}))
    elif case.then == "again":
        timed(lambda: http.post("/models", files={"bundle": ("hostile.safetensors", body)}))
    elif case.then == "list":
        for path in ("/models", "/metrics", "/models/" + "0" * 32):
            timed(lambda path=path: http.get(path))
    return answers, seconds


def measure(tree: Path, sources: Sources, cases: list[Case]) -> list[dict]:
    """Every case against one server of the code in `tree` over a fresh home."""
    rows = []
    # A fresh connection per request: after an unhandled error (a 500) the server closes the connection, and a
    # pooled one would fail the next request with a reset.
    with tempfile.TemporaryDirectory() as home, \
            api_server(Path(home), tree=tree, env={"PYTHONPATH": str(tree)}, timeout=600) as (base, server), \
            httpx.Client(base_url=base, timeout=600, headers={"Connection": "close"}) as http:
        warm = http.post("/models", files={"bundle": ("good.safetensors", sources.earl)})  # imports, first load
        assert warm.status_code == 201, warm.text
        for case in cases:
            before = reset_peak(server.pid)
            try:
                answers, seconds = run_case(http, case, sources)
            except httpx.HTTPError as exc:  # the server died or hung: that is a result too
                answers, seconds = [], []
                print(f"{case.name}: {type(exc).__name__}: {exc}", flush=True)
            alive = server.poll() is None
            grown = (status_kib(server.pid, "VmHWM") - before) / 1024 if alive else None
            models = len(http.get("/models").json()) - 1 if alive else None
            rows.append({"item": case.item, "case": case.name, "statuses": [a.status_code for a in answers],
                         "seconds": [round(s, 3) for s in seconds], "peak_rss_growth_mib": grown,
                         "models_registered": models, "alive": alive,
                         "detail": [_detail(a) for a in answers]})
            print(json.dumps(rows[-1])[:300], flush=True)
            for model in http.get("/models").json() if alive else []:  # the next case starts from the good one
                if model["id"] != warm.json()["id"]:
                    http.delete(f"/models/{model['id']}")
    return rows


def _detail(answer: httpx.Response) -> str:
    """The error message of an answer ('' for a success)."""
    if answer.status_code < 400:
        return ""
    try:
        detail = answer.json().get("detail", "")
    except (ValueError, AttributeError):
        detail = answer.text
    return (detail if isinstance(detail, str) else json.dumps(detail))[:160]


def before_tree(rev: str, path: Path) -> Path:
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO, check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="940aca6", help="the commit measured as 'before' (main at the review)")
    parser.add_argument("--before-tree", type=Path, default=Path("/tmp/abuse-before"))
    parser.add_argument("--weights-mib", type=int, default=512, help="what the item-1 bomb's xz stream decodes to")
    parser.add_argument("--only", default="", help="run the cases whose name holds this text")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in c.name]
    sources = Sources(source_bundle("earl"), source_bundle("rotate"), args.weights_mib)
    results = {}
    for code, tree in (("before", before_tree(args.before, args.before_tree)), ("after", REPO)):
        results[code] = measure(tree, sources, cases)
    write_results("abuse", {"before": args.before, "weights_mib": args.weights_mib, "results": results},
                  report(results, args))


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    rows = []
    for before, after in zip(results["before"], results["after"], strict=True):
        rows.append([before["item"], before["case"], *_cells(before), *_cells(after)])
    table = md_table(["item", "case", "before: status", "s", "peak RSS MiB", "models kept", "after: status", "s",
                      "peak RSS MiB", "models kept"], rows)
    load = os.getloadavg()[1]
    return (f"# Hostile requests against a live API server (issue 34)\n\n"
            f"One `uvicorn api.main:app` per code over a fresh home; 'before' is commit `{args.before}`, 'after' "
            f"this tree. Peak RSS growth: the server's VmHWM after the case minus its VmRSS before (the peak is "
            f"reset before each case). Status and seconds list every request of a case (upload, then the predict, "
            f"repeat or listings it names); 'models kept' counts the models the case left registered. The item-1 bomb decodes to {args.weights_mib} MiB. The machine was "
            f"shared with other work (load average {load:.1f}): times are upper bounds.\n\n" + table)


def _cells(row: dict) -> list:
    status = " ".join(map(str, row["statuses"])) or "no answer"
    if not row["alive"]:
        status += " (server died)"
    seconds = " ".join(f"{s:.2f}" for s in row["seconds"])
    grown = None if row["peak_rss_growth_mib"] is None else round(row["peak_rss_growth_mib"])
    return [status, seconds, grown, row["models_registered"]]


if __name__ == "__main__":
    main()
