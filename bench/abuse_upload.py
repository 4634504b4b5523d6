"""Peak RSS growth and time of the upload check (`check_triples`, what POST /jobs and extend run) on hostile triple
files (issue 34, item 2): a gzip of duplicate lines, plain files of distinct random triples up to the 100 MiB upload
limit, a gzip of distinct triples as large as EARL_MAX_UNPACKED_MB allows, and a gzip of distinct long names. Every
measurement runs in a fresh process.

    python bench/abuse_upload.py [--before 940aca6] [--streaming 20e8247] [--gzip-mib 16 64 128]
                                 [--plain-mib 4 16 64 100] [--distinct-gzip-mib 1024] [--long-names-mib 256]

"before" is the code at --before (main at the review), "streaming" the first streaming reader (--streaming), both
from `git show` of earl_service/data/dataset.py and api/uploads.py; "after" is this tree, with its default
EARL_MAX_UPLOAD_TRIPLES ("after, no limit": 10**9). The old readers are not run on the distinct-triples gzip.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, md_table, write_results

MB = 2**20

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so the child would report its parent's peak.
CHILD = """
import gc, json, sys, time
from pathlib import Path
old, path, max_bytes = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
limit = {"max_triples": int(sys.argv[4])} if sys.argv[4] else {}  # else check_triples' default
if old:
    sys.path.insert(0, old)
    from old_uploads import check_triples
else:
    from api.uploads import check_triples
from earl_service.errors import TripleFileError

def status_kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

gc.collect()
before = status_kib("VmRSS")
t0 = time.perf_counter()
try:
    size = {"max_bytes" if old else "max_unpacked_bytes": max_bytes}  # the old module's spelling
    result = check_triples(path, None, **size, **limit)
except TripleFileError as exc:
    result = exc.reason
seconds = time.perf_counter() - t0
print(json.dumps({"result": result, "seconds": seconds, "grown_mib": (status_kib("VmHWM") - before) / 1024}))
"""


def old_code(rev: str, folder: Path) -> Path:
    """earl_service/data/dataset.py and api/uploads.py at `rev` as modules old_data and old_uploads in `folder`."""
    folder.mkdir(parents=True)
    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout

    (folder / "old_data.py").write_text(show("earl_service/data/dataset.py"))
    uploads = show("api/uploads.py").replace("from earl_service.data.dataset import", "from old_data import")
    (folder / "old_uploads.py").write_text(uploads)
    return folder


def gzip_of_duplicates(path: Path, unpacked_mib: int) -> Path:
    block = b"a\tr\tb\nb\tr\tc\n" * (MB // 12)
    return gzip_of(path, (block for _ in range(unpacked_mib)), level=9)


def gzip_of(path: Path, blocks, *, level: int = 6) -> Path:
    packer = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31: gzip container
    with path.open("wb") as out:
        for block in blocks:
            out.write(packer.compress(block))
        out.write(packer.flush())
    return path


LINE = np.dtype([("q", "S1"), ("h", "S7"), ("tab1", "S1"), ("p", "S1"), ("r", "S3"), ("tab2", "S1"), ("q2", "S1"),
                 ("t", "S7"), ("nl", "S1")])  # b"Q1234567\tP123\tQ7654321\n"


def triple_lines(mib: int, *, entities: int, relations: int, seed: int = 0):
    """`mib` MiB of random 22-byte lines over `entities` entities and `relations` relations, a MiB at a time."""
    rng = np.random.default_rng(seed)
    for _ in range(mib):
        lines = np.empty(MB // LINE.itemsize, dtype=LINE)
        for name, value in (("q", b"Q"), ("tab1", b"\t"), ("p", b"P"), ("tab2", b"\t"), ("q2", b"Q"), ("nl", b"\n")):
            lines[name] = value
        h, t = rng.integers(1_000_000, 1_000_000 + entities, size=(2, len(lines)))
        lines["h"], lines["t"] = h.astype("S7"), t.astype("S7")
        lines["r"] = rng.integers(100, 100 + relations, size=len(lines)).astype("S3")
        yield lines.tobytes()


def distinct_triples(path: Path, mib: int) -> Path:
    """About `mib` MiB of random triples over 100k entities and 500 relations (almost all distinct)."""
    with path.open("wb") as out:
        for block in triple_lines(mib, entities=100_000, relations=500):
            out.write(block)
    return path


def counting_lines(i: int) -> bytes:
    """The i-th MiB of lines "n<TAB>n<TAB>n" for consecutive n: all distinct, and packed about 9:1 by gzip, so a
    100 MiB upload can hold close to the 1 GiB EARL_MAX_UNPACKED_MB of them."""
    per_block = MB // 27  # "10000000\t10000000\t10000000\n"
    return "".join(f"{n}\t{n}\t{n}\n" for n in range(10**7 + i * per_block, 10**7 + (i + 1) * per_block)).encode()


def long_names(i: int) -> bytes:
    """The i-th MiB of lines holding three new 1000-character names each."""
    lines = (f"{'h' * 990}{n:010d}\t{'r' * 990}{n:010d}\t{'t' * 990}{n:010d}\n" for n in range(i * 349, (i + 1) * 349))
    return "".join(lines).encode()


def measure(path: Path, max_bytes: int, old: Path | None, max_triples: int | None = None) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(old or ""), str(path), str(max_bytes),
                          str(max_triples or "")], cwd=REPO, capture_output=True, text=True, check=False)
    if run.returncode:
        return {"result": f"exit {run.returncode}: {run.stderr.strip()[-300:]}", "seconds": None, "grown_mib": None}
    return json.loads(run.stdout.strip().splitlines()[-1])


def cases(args: argparse.Namespace) -> list:
    """``(case, unpacked MiB, codes to measure, make(folder) -> path)`` for every file the bench builds."""
    every = ("before", "streaming", "after")
    out = [("gzip of duplicate lines", m, every, lambda p, m=m: gzip_of_duplicates(p / "train.txt.gz", m))
           for m in args.gzip_mib]
    out += [("plain, distinct triples", m, every, lambda p, m=m: distinct_triples(p / "train.txt", m))
            for m in args.plain_mib]
    out += [("gzip of distinct triples", m, ("after", "after, no limit"), lambda p, m=m: gzip_of(
        p / "train.txt.gz", map(counting_lines, range(m)))) for m in args.distinct_gzip_mib]
    out += [("gzip of distinct 1000-char names", m, every, lambda p, m=m: gzip_of(
        p / "train.txt.gz", map(long_names, range(m)))) for m in args.long_names_mib]
    return out


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old = {"before": old_code(args.before, tmp / "before"), "streaming": old_code(args.streaming, tmp / "streaming")}
        for case, mib, codes, make in cases(args):
            (tmp / "case").mkdir()
            path = make(tmp / "case")
            for code in codes:
                out = measure(path, 2 * mib * MB, old.get(code), 10**9 if code == "after, no limit" else None)
                rows.append({"case": case, "unpacked_mib": mib, "file_mib": round(path.stat().st_size / MB, 3),
                             "code": code, **out})
                print(json.dumps(rows[-1]), flush=True)
            path.unlink()
            (tmp / "case").rmdir()
    return rows


def markdown(args: argparse.Namespace, rows: list[dict]) -> str:
    table = md_table(
        ["case", "unpacked MiB", "file MiB", "code", "peak RSS growth MiB", "time s", "result"],
        [[r["case"], r["unpacked_mib"], r["file_mib"], r["code"], r["grown_mib"], r["seconds"],
          json.dumps(r["result"]) if isinstance(r["result"], dict) else r["result"]] for r in rows])
    load = os.getloadavg()[1]
    busy = (f" Times were taken at a load average of {load:.1f} on this shared 2-core machine (other work ran "
            "beside it): upper bounds, comparable only within one run." if load > 1.5 else "")
    return (f"# Upload check on hostile triple files (issue 34, item 2)\n\n`check_triples` in a fresh process; peak "
            f"RSS growth is VmHWM minus VmRSS after imports. 'before' is commit `{args.before}` (main at the review), "
            f"'streaming' commit `{args.streaming}` (the first streaming reader), 'after' this tree with its default "
            f"EARL_MAX_UPLOAD_TRIPLES (10,000,000), 'after, no limit' with it at 10**9 (what the limit saves); the "
            f"old readers are not run on the distinct-triples gzip (they would need ~5-20 GiB).{busy}\n\n" + table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="940aca6", help="the commit measured as 'before' (main at the review)")
    parser.add_argument("--streaming", default="20e8247", help="the commit measured as 'streaming'")
    parser.add_argument("--gzip-mib", type=int, nargs="+", default=[16, 64, 128], help="unpacked sizes")
    parser.add_argument("--plain-mib", type=int, nargs="+", default=[4, 16, 64, 100])
    parser.add_argument("--distinct-gzip-mib", type=int, nargs="+", default=[1024], help="unpacked sizes")
    parser.add_argument("--long-names-mib", type=int, nargs="+", default=[256], help="unpacked sizes")
    args = parser.parse_args()
    rows = run(args)
    write_results("abuse_upload", {"before": args.before, "streaming": args.streaming, "results": rows},
                  markdown(args, rows))


if __name__ == "__main__":
    main()
