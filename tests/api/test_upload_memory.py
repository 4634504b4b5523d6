"""The upload check's memory grows with the distinct triples kept, not with the text (issue 34, item 2).

Each case runs `check_triples` in a fresh interpreter and reads its peak RSS, so the test process's own history
(and the other tests' allocations) cannot hide or fake a peak. The check keeps 8 bytes per distinct triple and no
names; a file with more than EARL_MAX_UPLOAD_TRIPLES of them is refused as soon as the count passes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MB = 2**20
BOUND_MIB = 256  # the per-request bound

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child spawned by a big pytest process would report
# its parent's peak; VmHWM is the peak of the child's own address space.
CHILD = """
import gc, json, sys
from pathlib import Path
from api.uploads import check_triples
from earl_service.data.dataset import load_dataset
from earl_service.errors import TripleFileError

def status_kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

gc.collect()
before = status_kib("VmRSS")
path, max_bytes, max_triples = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
try:
    if sys.argv[3] == "upload":  # what POST /jobs and extend run
        result = check_triples(path, None, max_unpacked_bytes=max_bytes, max_triples=max_triples)
    else:  # what the worker runs on the saved upload
        result = load_dataset(path.parent, max_bytes=max_bytes).stats["train"]["triples"]
except TripleFileError as exc:
    result = str(exc)
print(json.dumps({"result": result, "grown_mib": (status_kib("VmHWM") - before) / 1024}))
"""


def check_in_child(path: Path, max_bytes: int, what: str = "upload", *, max_triples: int = 10**7) -> dict:
    """Run the upload check (or, with what="dataset", the worker's load_dataset) on `path` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", CHILD, str(path), str(max_bytes), what, str(max_triples)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def gzip_of(path: Path, block: bytes, repeats: int) -> Path:
    """`block` * `repeats`, gzipped to `path` without holding the unpacked text."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    with path.open("wb") as out:
        for _ in range(repeats):
            out.write(packer.compress(block))
        out.write(packer.flush())
    return path


def random_triples(path: Path, size: int, *, seed: int = 0) -> tuple[Path, int]:
    """About `size` bytes of random triples over 100k entities and 500 relations (almost all distinct)."""
    rng = np.random.default_rng(seed)
    n = size // 22  # "Q1234567\tP123\tQ7654321\n"
    h, t = rng.integers(1_000_000, 1_100_000, size=(2, n))
    r = rng.integers(100, 600, size=n)
    lines = [f"Q{a}\tP{b}\tQ{c}\n" for a, b, c in zip(h.tolist(), r.tolist(), t.tolist(), strict=True)]
    path.write_text("".join(lines))
    return path, len(set(lines))


LINE = np.dtype([("q", "S1"), ("h", "S7"), ("tab1", "S1"), ("p", "S1"), ("r", "S3"), ("tab2", "S1"), ("q2", "S1"),
                 ("t", "S7"), ("nl", "S1")])  # b"Q1234567\tP123\tQ7654321\n"


def fixed_width_triples(path: Path, size: int, *, seed: int = 0) -> tuple[Path, int]:
    """About `size` bytes of random 22-byte lines over 9M entities and 900 relations, written by numpy (fast)."""
    rng = np.random.default_rng(seed)
    lines = np.empty(size // LINE.itemsize, dtype=LINE)
    for name, value in (("q", b"Q"), ("tab1", b"\t"), ("p", b"P"), ("tab2", b"\t"), ("q2", b"Q"), ("nl", b"\n")):
        lines[name] = value
    h, t = rng.integers(1_000_000, 10_000_000, size=(2, len(lines)))
    r = rng.integers(100, 1000, size=len(lines))
    lines["h"], lines["r"], lines["t"] = h.astype("S7"), r.astype("S3"), t.astype("S7")
    lines.tofile(path)
    return path, len(np.unique((h * 1000 + r) * 10_000_000 + t))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_gzip_of_duplicate_lines(tmp_path):
    block = b"a\tr\tb\nb\tr\tc\n" * (MB // 12)
    path = gzip_of(tmp_path / "train.txt.gz", block, 64)  # 64 MiB unpacked, ~64 KiB packed
    out = check_in_child(path, 128 * MB)
    assert out["result"] == {"triples": 2, "duplicates_dropped": 64 * (MB // 12) * 2 - 2}
    assert out["grown_mib"] < BOUND_MIB, out
    out = check_in_child(path, 128 * MB, "dataset")  # the worker parses the saved file again, the same way
    assert out["result"] == 2 and out["grown_mib"] < BOUND_MIB, out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_plain_file_of_distinct_triples(tmp_path):
    path, distinct = random_triples(tmp_path / "train.txt", 16 * MB)
    out = check_in_child(path, 128 * MB)
    assert out["result"]["triples"] == distinct
    assert out["grown_mib"] < BOUND_MIB, out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_gzip_of_one_endless_line(tmp_path):
    path = gzip_of(tmp_path / "train.txt.gz", b"x" * MB, 192)  # one 192 MiB "line", no line break
    out = check_in_child(path, 256 * MB)
    assert "train.txt.gz, line 1: " in out["result"]
    assert out["grown_mib"] < BOUND_MIB, out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_cost_per_distinct_triple(tmp_path):
    """A scaled 100 MiB upload: the growth from 8 to 32 MiB of distinct triples is the cost of each one kept."""
    grown, distinct = [], []
    for mib in (8, 32):
        path, n = fixed_width_triples(tmp_path / f"train{mib}.txt", mib * MB, seed=mib)
        out = check_in_child(path, 128 * MB)
        assert out["result"] == {"triples": n, "duplicates_dropped": 0}
        grown.append(out["grown_mib"] * MB)
        distinct.append(n)
        path.unlink()
    per_triple = (grown[1] - grown[0]) / (distinct[1] - distinct[0])
    assert per_triple < 40, per_triple  # 8 bytes a fingerprint, 16 while two runs merge; it was ~130 with a set
    at_limit = grown[1] + per_triple * (100 * MB // LINE.itemsize - distinct[1])  # the most lines 100 MiB holds
    assert at_limit < BOUND_MIB * MB, (per_triple, grown)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_distinct_triples_past_the_limit_are_refused_early(tmp_path):
    block = "".join(f"e{i}\tr\te{i + 1}\n" for i in range(200_000)).encode()  # 200k distinct triples, ~3.5 MiB
    path = gzip_of(tmp_path / "train.txt.gz", block, 1)
    out = check_in_child(path, 64 * MB, max_triples=50_000)
    assert out["result"] == ("train.txt.gz: has more than 50,000 distinct triples; uploads are limited to 50,000 per "
                             "file (EARL_MAX_UPLOAD_TRIPLES)")
    assert out["grown_mib"] < BOUND_MIB, out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_gzip_of_long_distinct_names(tmp_path):
    """Names dominate when they are long: 256 MiB of distinct 1000-character names cost the check no more."""
    def block(i: int) -> bytes:  # 1 MiB of lines with three new 1000-character names each
        lines = (f"{'h' * 990}{n:010d}\t{'r' * 990}{n:010d}\t{'t' * 990}{n:010d}\n" for n in range(i * 349, (i + 1) * 349))
        return "".join(lines).encode()

    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    path = tmp_path / "train.txt.gz"
    with path.open("wb") as out:
        for i in range(256):
            out.write(packer.compress(block(i)))
        out.write(packer.flush())
    out = check_in_child(path, 512 * MB)
    assert out["result"] == {"triples": 256 * 349, "duplicates_dropped": 0}
    assert out["grown_mib"] < 64, out  # names are not kept: read_table would hold them all (256 MiB and more)


def test_both_upload_routes_apply_the_setting(tmp_path, monkeypatch, codex_bundle):
    """EARL_MAX_UPLOAD_TRIPLES reaches POST /jobs and POST /models/{id}/triples, and the 422 names it."""
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings

    monkeypatch.setenv("EARL_MAX_UPLOAD_TRIPLES", "2")
    three = b"a\tr\tb\nb\tr\tc\nc\tr\ta\n"
    expected = "more.txt: has more than 2 distinct triples; uploads are limited to 2 per file (EARL_MAX_UPLOAD_TRIPLES)"
    with TestClient(create_app(Settings(home=tmp_path))) as client:
        r = client.post("/jobs", files={"train": ("more.txt", three)})
        assert (r.status_code, r.json()["detail"]) == (422, expected)
        assert client.post("/jobs", files={"train": ("more.txt", three[:12])}).status_code == 202
        r = client.post("/models", files={"bundle": ("codex.safetensors", codex_bundle.read_bytes())})
        assert r.status_code == 201, r.text
        r = client.post(f"/models/{r.json()['id']}/triples", files={"triples": ("more.txt", three)})
        assert (r.status_code, r.json()["detail"]) == (422, expected)
