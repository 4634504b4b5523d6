"""Peak RSS growth and time of the upload check (`check_triples`, what POST /jobs and extend run) on hostile triple
files, before and after the streaming reader (issue 34, item 2): a gzip of duplicate lines and a plain file of
distinct random triples, at three sizes each. Every measurement runs in a fresh process.

    python bench/abuse_upload.py [--before 940aca6] [--gzip-mib 16 64 128] [--plain-mib 4 16 64]

"before" is the code at --before (earl_service/data.py and api/uploads.py from `git show`), "after" this tree.
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
from common import REPO, md_table, write_results

MB = 2**20

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so the child would report its parent's peak.
CHILD = """
import gc, json, sys, time
from pathlib import Path
old, path, max_bytes = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
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
    result = check_triples(path, None, max_bytes=max_bytes)
except TripleFileError as exc:
    result = exc.reason
seconds = time.perf_counter() - t0
print(json.dumps({"result": result, "seconds": seconds, "grown_mib": (status_kib("VmHWM") - before) / 1024}))
"""


def old_code(rev: str, folder: Path) -> Path:
    """earl_service/data.py and api/uploads.py at `rev` as modules old_data and old_uploads in `folder`."""
    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout

    (folder / "old_data.py").write_text(show("earl_service/data.py"))
    uploads = show("api/uploads.py").replace("from earl_service.data import", "from old_data import")
    (folder / "old_uploads.py").write_text(uploads)
    return folder


def gzip_of_duplicates(path: Path, unpacked_mib: int) -> Path:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    block = b"a\tr\tb\nb\tr\tc\n" * (MB // 12)
    with path.open("wb") as out:
        for _ in range(unpacked_mib):
            out.write(packer.compress(block))
        out.write(packer.flush())
    return path


def distinct_triples(path: Path, mib: int, *, seed: int = 0) -> Path:
    """About `mib` MiB of random triples over 100k entities and 500 relations (almost all distinct)."""
    rng = np.random.default_rng(seed)
    with path.open("w") as out:
        for _ in range(mib):
            n = MB // 22  # "Q1234567\tP123\tQ7654321\n"
            h, t = rng.integers(1_000_000, 1_100_000, size=(2, n)).tolist()
            r = rng.integers(100, 600, size=n).tolist()
            out.write("".join(f"Q{a}\tP{b}\tQ{c}\n" for a, b, c in zip(h, r, t, strict=True)))
    return path


def measure(path: Path, max_bytes: int, old: Path | None) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(old or ""), str(path), str(max_bytes)], cwd=REPO,
                         capture_output=True, text=True, check=False)
    if run.returncode:
        return {"result": f"exit {run.returncode}: {run.stderr.strip()[-300:]}", "seconds": None, "grown_mib": None}
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="940aca6", help="the commit measured as 'before' (main at the review)")
    parser.add_argument("--gzip-mib", type=int, nargs="+", default=[16, 64, 128], help="unpacked sizes")
    parser.add_argument("--plain-mib", type=int, nargs="+", default=[4, 16, 64])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old = old_code(args.before, tmp)
        cases = [("gzip of duplicate lines", m, lambda p, m=m: gzip_of_duplicates(p / "train.txt.gz", m))
                 for m in args.gzip_mib]
        cases += [("plain, distinct triples", m, lambda p, m=m: distinct_triples(p / "train.txt", m))
                  for m in args.plain_mib]
        for case, mib, make in cases:
            (tmp / "case").mkdir()
            path = make(tmp / "case")
            for code, where in (("before", old), ("after", None)):
                out = measure(path, 2 * mib * MB, where)
                rows.append({"case": case, "unpacked_mib": mib, "file_mib": round(path.stat().st_size / MB, 3),
                             "code": code, **out})
                print(json.dumps(rows[-1]), flush=True)
            path.unlink()
            (tmp / "case").rmdir()
    table = md_table(
        ["case", "unpacked MiB", "file MiB", "code", "peak RSS growth MiB", "time s", "result"],
        [[r["case"], r["unpacked_mib"], r["file_mib"], r["code"], r["grown_mib"], r["seconds"],
          json.dumps(r["result"]) if isinstance(r["result"], dict) else r["result"]] for r in rows])
    load = os.getloadavg()[1]
    busy = f" Times were taken at a load average of {load:.1f} on this machine: upper bounds." if load > 1.5 else ""
    md = (f"# Upload check on hostile triple files (issue 34, item 2)\n\n`check_triples` in a fresh process; peak "
          f"RSS growth is VmHWM minus VmRSS after imports. 'before' is commit `{args.before}`, 'after' this tree."
          f"{busy}\n\n" + table)
    write_results("abuse_upload", {"before": args.before, "results": rows}, md)


if __name__ == "__main__":
    main()
