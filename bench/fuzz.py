"""Fuzz the live API with schemathesis: generated requests from its OpenAPI schema, and no answer may be a 5xx.

    python bench/fuzz.py BUNDLE [--examples 100] [--max-time 600] [--seed 0]   # writes bench/results/fuzz.{json,md}

`uvicorn api.main:app` runs on 127.0.0.1 with a throwaway EARL_HOME and a token (sent with every request, so the
writes are fuzzed past the auth check). Before fuzzing, BUNDLE is registered three times and a job is queued
(no worker runs), and schemathesis draws path/query values 9 times in 10 from those real ids and from the
bundle's entity and relation names, so generated requests reach the predictor and the registry instead of
stopping at 404. Checks: schemathesis's `not_a_server_error`, plus the server's own Prometheus counters
(`earl_http_requests_total` with a 5xx status must stay 0).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import api_server, md_table, write_results

TOKEN = "fuzz-token"
GOOD = b"a\tr\tb\nb\tr\tc\n"


def _config(ids: dict[str, list[str]], path: Path) -> Path:
    """schemathesis.toml: dictionaries of real values bound to the id and name parameters (probability 0.9)."""
    lines = []
    for name, values in ids.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}", ""]
    lines.append("[parameters]")
    bindings = {"path.model_id": "models", "query.model": "models", "path.job_id": "jobs",
                "query.head": "entities", "query.tail": "entities", "query.relation": "relations"}
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 0.9 }}' for key, name in bindings.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def server_errors(metrics: str) -> tuple[int, int]:
    """(requests, requests answered 5xx) from the server's earl_http_requests_total counters."""
    total = errors = 0
    for status, n in re.findall(r'^earl_http_requests_total\{.*status="(\d+)"\} (\d+)$', metrics, re.MULTILINE):
        total += int(n)
        errors += int(n) * (int(status) >= 500)
    return total, errors


def fuzz(bundle: Path, *, examples: int, max_time: int, seed: int, workdir: Path) -> dict:
    """One schemathesis run against a fresh server; the summary (test cases, failures, server-side 5xx)."""
    from earl_service.bundle.model_io import load_bundle

    b = load_bundle(bundle)
    home = workdir / "home"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with api_server(home, token=TOKEN, log=workdir / "server.log") as (base, _):
        with httpx.Client(base_url=base, headers=auth, timeout=60) as http:
            models = [http.post("/models", files={"bundle": (bundle.name, bundle.read_bytes())}).json()["id"]
                      for _ in range(3)]
            jobs = [http.post("/jobs", files={"train": ("train.txt", GOOD)}).json()["id"]]
        rng = __import__("random").Random(seed)
        ids = {"models": models, "jobs": jobs, "entities": rng.sample(b.entities.names, min(50, len(b.entities))),
               "relations": b.relations.names}
        config = _config(ids, workdir / "schemathesis.toml")
        report = workdir / "report.json"
        cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{base}/openapi.json",
               "--checks", "not_a_server_error", "--max-examples", str(examples), "--max-time", str(max_time),
               "--seed", str(seed), "--header", f"Authorization: Bearer {TOKEN}", "--workers", "1",
               "--generation-database", "none", "--no-color", "--report", "json", "--report-json-path",
               str(report), "--request-timeout", "60"]
        done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=max_time + 300, check=False)
        requests, errors_5xx = server_errors(httpx.get(f"{base}/metrics", headers=auth, timeout=30).text)
    summary = json.loads(report.read_text()) if report.exists() else {}
    cases = summary.get("test_cases", {})
    return {"examples_per_operation": examples, "max_time_s": max_time, "seed": seed,
            "exit_code": done.returncode, "operations": summary.get("operations", {}).get("tested"),
            "test_cases": cases.get("generated"), "test_cases_with_failures": cases.get("with_failures"),
            "failures": summary.get("failures", []), "errors": summary.get("errors", []),
            "phases": {k: v["status"] for k, v in summary.get("phases", {}).items()},
            "running_time_s": summary.get("running_time"), "server_requests": requests,
            "server_5xx": errors_5xx, "output_tail": done.stdout[-4000:] + done.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--examples", type=int, default=100, help="max examples per operation and phase")
    parser.add_argument("--max-time", type=int, default=600,
                        help="seconds of the whole schemathesis run: its fuzzing and stateful phases repeat until "
                             "it is spent")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = fuzz(args.bundle, examples=args.examples, max_time=args.max_time, seed=args.seed, workdir=Path(tmp))
    print(result.pop("output_tail"))
    md = (f"# Fuzzing the API with schemathesis\n\n{result['test_cases']} generated requests over "
          f"{result['operations']} operations ({args.examples} examples per operation and phase, seed {args.seed}, "
          f"{result['running_time_s']:.0f} s); phases: "
          + ", ".join(f"{k} {v}" for k, v in result["phases"].items()) + ".\n\n"
          + md_table(["check", "result"], [
              ["schemathesis not_a_server_error: test cases with failures", result["test_cases_with_failures"]],
              ["server: requests counted (earl_http_requests_total)", result["server_requests"]],
              ["server: answers with status >= 500", result["server_5xx"]],
              ["schemathesis exit code", result["exit_code"]]]) + "\n")
    write_results("fuzz", result, md)
    print(md)
    if result["exit_code"] != 0 or result["server_5xx"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
