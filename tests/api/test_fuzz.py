"""A short schemathesis run against a live uvicorn (bench/fuzz.py; `make fuzz` runs the long one): no 5xx."""

import sys

import pytest
from conftest import REPO

pytest.importorskip("schemathesis")
sys.path.insert(0, str(REPO / "bench"))
from fuzz import fuzz


def test_no_server_errors_under_fuzzing(codex_bundle, tmp_path):
    # schemathesis 4 repeats its fuzzing and stateful phases until --max-time is spent, so max_time is the test's
    # length: 120 s gave 11,343 cases (the coverage phase alone 7 s) on 2 cores, a seventh of the suite; 30 s gives
    # 3,442 (coverage 6 s, fuzzing 18 s, stateful 5 s), and a machine ten times slower still passes the count below.
    result = fuzz(codex_bundle, examples=5, max_time=30, seed=0, workdir=tmp_path)
    assert result["exit_code"] == 0, result["output_tail"]
    assert result["test_cases"] > 200 and result["test_cases_with_failures"] == 0, result["output_tail"]
    assert result["server_5xx"] == 0 and result["server_requests"] >= result["test_cases"]
