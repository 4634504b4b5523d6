"""Peak RSS growth of reading a bundle vocabulary of many short names, without and with BundleLimits (issue 34:
the 64x xz cap alone lets a small upload unpack to GiBs of names). Each measurement runs in a fresh process.

    python bench/bundle_vocab.py [--names 10000000] [--max-names 2000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, md_table, write_results

# VmHWM after clear_refs: the child's own peak, from after the vocabulary was packed.
CHILD = """
import json, lzma, sys, time
import numpy as np
from earl_service.bundle.format import BundleLimits, unpack_strings
def hwm():
    return int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) / 1024
n, most = int(sys.argv[1]), int(sys.argv[2])
blob = np.frombuffer(lzma.compress("\\0".join(f"Q{i}" for i in range(n)).encode(), preset=1), dtype=np.uint8)
open("/proc/self/clear_refs", "w").write("5")
base, start = hwm(), time.perf_counter()
try:
    unpack_strings(blob, BundleLimits(max_names=most) if most else None)
    result = "read"
except Exception:
    result = "refused"
print(json.dumps({"packed_mib": blob.size / 2**20, "result": result, "peak_growth_mib": hwm() - base,
                  "seconds": time.perf_counter() - start}))
"""


def measure(names: int, max_names: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(names), str(max_names)], check=True, text=True,
                         capture_output=True, cwd=REPO, env={"PYTHONPATH": str(REPO)}).stdout
    return {"names": names, "max_names": max_names or None, **json.loads(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=10_000_000)
    parser.add_argument("--max-names", type=int, default=2_000_000, help="EARL_MAX_BUNDLE_ENTITIES' default")
    args = parser.parse_args()
    rows = [measure(args.names, 0), measure(args.names, args.max_names)]
    table = md_table(["names", "packed MiB", "limit", "result", "peak RSS growth MiB", "seconds"],
                     [[f"{r['names']:,}", f"{r['packed_mib']:.1f}", f"{r['max_names']:,}" if r["max_names"] else "none",
                       r["result"], f"{r['peak_growth_mib']:.0f}", f"{r['seconds']:.2f}"] for r in rows])
    write_results("bundle_vocab", {"rows": rows}, "# Reading a bundle vocabulary of short names\n\n" + table)


if __name__ == "__main__":
    main()
