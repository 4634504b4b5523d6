"""Hostile bundles cost a live API server less than 256 MiB of peak memory each (issue 34, items 1, 3 and 4).

The server is a real `uvicorn api.main:app` subprocess; its peak RSS (VmHWM) is reset before each upload and read
after it, so each case is measured alone, and the test process's own allocations cannot hide or fake a peak.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import abuse  # noqa: E402 - the hostile bundles, shared with bench/abuse.py
from harness import api_server  # noqa: E402

BOUND_MIB = 256  # the bound on what one request may add to the server's peak memory

BOMBS = {  # name: (bundle maker, a fragment of the 422)
    "item 1: coded weights declaring a 512 MiB tensor": (lambda d: abuse.weights_bomb(d, decoded_mib=512),
                                                          "the config implies"),
    "item 3: graph header claiming 2**27 edges for one entity": (abuse.graph_bomb, "graph counts 134217728 edges"),
    "item 4: graph of 5.5M repeated edges": (abuse.duplicate_edges, "repeated edge"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The API over a fresh home, with one good bundle registered and queried (imports and first load done)."""
    home = tmp_path_factory.mktemp("home")
    with api_server(home, timeout=300) as (base, proc), httpx.Client(base_url=base, timeout=300) as http:
        good = http.post("/models", files={"bundle": ("good.safetensors", abuse.source_bundle("earl"))})
        assert good.status_code == 201, good.text
        query = {"model": good.json()["id"], "head": "Q7604", "relation": "P1412"}
        assert http.get("/predict", params=query).status_code == 200
        yield http, proc


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="resets and reads the peak RSS in /proc")
@pytest.mark.parametrize("case", BOMBS)
def test_a_bomb_costs_the_server_less_than_the_bound(server, case):
    http, proc = server
    make, fragment = BOMBS[case]
    body = make(abuse.source_bundle("earl"))
    before = abuse.reset_peak(proc.pid)
    r = http.post("/models", files={"bundle": ("bomb.safetensors", body)})
    grown_mib = (abuse.status_kib(proc.pid, "VmHWM") - before) / 1024
    assert grown_mib < BOUND_MIB, f"{case}: the server's peak RSS grew by {grown_mib:.0f} MiB ({r.status_code})"
    assert r.status_code == 422 and fragment in r.json()["detail"], r.text[:500]
    assert http.get("/healthz").json() == {"status": "ok"}
