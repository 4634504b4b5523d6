"""A short schemathesis run against a live uvicorn (bench/fuzz.py; `make fuzz` runs the long one): no 5xx."""

import sys

import pytest
from conftest import REPO

pytest.importorskip("schemathesis")
sys.path.insert(0, str(REPO / "bench"))
from fuzz import fuzz


def test_no_server_errors_under_fuzzing(codex_bundle, tmp_path):
    # 5 examples an operation end the run (about 10 s here); max_time only bounds it on a slow or loaded machine,
    # where stopping at 25 s could leave fewer cases than asserted below.
    result = fuzz(codex_bundle, examples=5, max_time=120, seed=0, workdir=tmp_path)
    assert result["exit_code"] == 0, result["output_tail"]
    assert result["test_cases"] > 200 and result["test_cases_with_failures"] == 0, result["output_tail"]
    assert result["server_5xx"] == 0 and result["server_requests"] >= result["test_cases"]
