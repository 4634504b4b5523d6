"""Hostile requests against a live API server (issue 34): status, time and the server's peak RSS growth per case,
for the code at --before and for this tree. With --front, the attacks on the front of issue 56 instead
(bench/harness/front.py: bodies, headers, slow sockets, races, origins, hosts, forwarded addresses), each also
with the slowest /healthz answer while it ran, against `earl serve --no-worker` as deployed.

    python bench/abuse.py [--before 940aca6] [--before-tree /tmp/abuse-before] [--weights-mib 512] [--only TEXT]
    python bench/abuse.py --front [--before dbb86e9] [--before-tree /tmp/front-before] [--only TEXT]

"before" runs `uvicorn api.main:app` from the files of --before (a `git archive` into --before-tree when it does
not exist yet), "after" from this tree; each server gets a fresh EARL_HOME. Before every case
the server's peak RSS is reset (`echo 5 > /proc/PID/clear_refs`), so a case's growth is VmHWM after it minus VmRSS
before it, whatever earlier cases did. The bundles are made from an untrained CoDEx-S EARL model (dim 16): the
cases are about what a file can make the server do, not about what it learned.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, api_server, front, md_table, write_results
from harness.hostile import (
    NESTED,
    _nan_row,
    duplicate_edges,
    graph_bomb,
    source_bundle,
    weights_bomb,
    with_config,
    with_header,
    with_metadata,
    with_tensor,
)
from harness.processes import reset_peak, status_kib

MB = 2**20
GOOD_TRIPLES = b"a\tr\tb\nb\tr\tc\n"


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
                with HealthProbe(base) as probe:
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
                         "healthz_slowest_s": round(probe.slowest, 3),
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


class HealthProbe:
    """/healthz every 50 ms in a thread while a case runs; `slowest` is its longest answer (or wait) in seconds."""

    def __init__(self, base: str) -> None:
        self.base, self.slowest, self.running = base, 0.0, True
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while self.running:
                t0 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    client.get(f"{self.base}/healthz")
                self.slowest = max(self.slowest, time.perf_counter() - t0)
                time.sleep(0.05)

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join(timeout=120)


FRONT_TOKEN = "abuse-front-token"


def measure_front(tree: Path, only: str) -> list[dict]:
    """Every attack of harness/front.py against `earl serve --no-worker` of the code in `tree` ("token" and "open"
    servers, each over a fresh home)."""
    rows = []
    for kind, env in (("token", {"EARL_API_TOKEN": FRONT_TOKEN}), ("open", {"EARL_MAX_QUEUED_JOBS": "1"})):
        attacks = [a for a in front.ATTACKS if a[2] == kind and only in a[0]]
        with tempfile.TemporaryDirectory() as home, api_server(
                Path(home), tree=tree, serve=True, env={"PYTHONPATH": str(tree), **env}) as (base, server):
            for name, attack, _ in attacks:
                before, t0 = reset_peak(server.pid), time.perf_counter()
                with HealthProbe(base) as probe:
                    found = attack(base, FRONT_TOKEN)
                alive = server.poll() is None
                rows.append({"case": name, **found, "seconds": round(time.perf_counter() - t0, 2),
                             "healthz_slowest_s": round(probe.slowest, 3), "alive": alive,
                             "peak_rss_growth_mib": (status_kib(server.pid, "VmHWM") - before) / 1024 if alive else None})
                print(json.dumps(rows[-1])[:300], flush=True)
    return rows


def report_front(results: dict[str, list[dict]], before: str) -> str:
    def cells(row: dict) -> list:
        grown = row["peak_rss_growth_mib"]
        return [" ".join(map(str, row["statuses"])) + ("" if row["alive"] else " (server died)"), row["seconds"],
                None if grown is None else round(grown), round(row["healthz_slowest_s"] * 1000)]

    rows = [[b["case"], *cells(b), *cells(a)] for b, a in zip(results["before"], results["after"], strict=True)]
    table = md_table(["case", "before: result", "s", "peak RSS MiB", "slowest /healthz ms", "after: result", "s",
                      "peak RSS MiB", "slowest /healthz ms"], rows)
    return (f"# The front under attack (issue 56)\n\n`earl serve --no-worker` per code and server kind over a fresh "
            f"home: 'before' is commit `{before}`, 'after' this tree. Peak RSS growth: the server's VmHWM after the "
            f"case minus its VmRSS before. Slowest /healthz: the longest answer of a probe every 50 ms while the case "
            f"ran. The machine was shared with other work (load average {os.getloadavg()[1]:.1f}): times are upper "
            f"bounds.\n\n" + table)


def before_tree(rev: str, path: Path) -> Path:
    """The files of commit `rev` in `path` (a `git archive`, no worktree: the repository is left as it is)."""
    if not path.exists():
        path.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the commit measured as 'before' (main at the review: 940aca6; with "
                                         "--front dbb86e9)")
    parser.add_argument("--before-tree", type=Path, help="default /tmp/abuse-before (--front: /tmp/front-before)")
    parser.add_argument("--weights-mib", type=int, default=512, help="what the item-1 bomb's xz stream decodes to")
    parser.add_argument("--only", default="", help="run the cases whose name holds this text")
    parser.add_argument("--front", action="store_true", help="the front's attacks of issue 56 (results: abuse_front)")
    args = parser.parse_args()
    args.before = args.before or ("dbb86e9" if args.front else "940aca6")
    args.before_tree = args.before_tree or Path("/tmp/front-before" if args.front else "/tmp/abuse-before")
    if args.front:
        results = {code: measure_front(tree, args.only)
                   for code, tree in (("before", before_tree(args.before, args.before_tree)), ("after", REPO))}
        write_results("abuse_front", {"before": args.before, "results": results}, report_front(results, args.before))
        return
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
    table = md_table(["item", "case", "before: status", "s", "peak RSS MiB", "slowest /healthz ms", "models kept",
                      "after: status", "s", "peak RSS MiB", "slowest /healthz ms", "models kept"], rows)
    load = os.getloadavg()[1]
    return (f"# Hostile requests against a live API server (issue 34)\n\n"
            f"One `uvicorn api.main:app` per code over a fresh home; 'before' is commit `{args.before}`, 'after' "
            f"this tree. Peak RSS growth: the server's VmHWM after the case minus its VmRSS before (the peak is "
            f"reset before each case). Slowest /healthz: the longest answer of a probe every 50 ms while the case ran. "
            f"Status and seconds list every request of a case (upload, then the predict, "
            f"repeat or listings it names); 'models kept' counts the models the case left registered. The item-1 bomb decodes to {args.weights_mib} MiB. The machine was "
            f"shared with other work (load average {load:.1f}): times are upper bounds.\n\n" + table)


def _cells(row: dict) -> list:
    status = " ".join(map(str, row["statuses"])) or "no answer"
    if not row["alive"]:
        status += " (server died)"
    seconds = " ".join(f"{s:.2f}" for s in row["seconds"])
    grown = None if row["peak_rss_growth_mib"] is None else round(row["peak_rss_growth_mib"])
    slowest = row.get("healthz_slowest_s")
    return [status, seconds, grown, None if slowest is None else round(slowest * 1000), row["models_registered"]]


if __name__ == "__main__":
    main()
