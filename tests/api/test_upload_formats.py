"""POST /jobs reads uploads by content, as `earl train` does: gzip under any name, sniffed delimiters, headers,
column orders from the form, RDF and Parquet; the worker then reads the saved files the same way."""

from __future__ import annotations

import gzip
import io

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.worker.loop import Worker, WorkerConfig

GOOD = b"a\tr\tb\nb\tr\tc\n"


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(Settings(home=tmp_path, max_queued_jobs=100))) as c:
        yield c


def post(client, train: bytes, name: str = "train.txt", **data):
    return client.post("/jobs", files={"train": (name, train)}, data={k: str(v) for k, v in data.items()})


def parquet_bytes() -> bytes:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    out = io.BytesIO()
    pq.write_table(pa.table({"subject": ["a", "b"], "predicate": ["r", "r"], "object": ["b", "c"]}), out)
    return out.getvalue()


@pytest.mark.parametrize("name,content,data,triples", [
    ("train.txt", gzip.compress(GOOD * 5, mtime=0), {}, 2),  # gzip under a plain name (mtime 0: one test id)
    ("train.txt.gz", GOOD, {}, 2),  # a plain file under a .gz name
    ("train.csv", GOOD, {}, 2),  # tabs in a .csv
    ("train.csv", b"head,relation,tail\na,r,b\n", {}, 1),  # a header, skipped
    ("train.csv", b"head,relation,tail\na,r,b\n", {"header": "false"}, 2),  # ... or read as a triple
    ("train.txt", b"a;b;r\nb;c;r\nc;a;r\n", {"columns": "h,t,r"}, 3),
    ("train.txt", b"a | r | b\n", {}, 1),
    ("train.nt", b"<http://e/a> <http://e/r> <http://e/b> .\n<http://e/a> <http://e/n> \"A\" .\n", {}, 1),
])
def test_uploads_are_read_by_content(client, name, content, data, triples):
    if name.endswith(".nt"):
        pytest.importorskip("rdflib")
    r = post(client, content, name, **data)
    assert r.status_code == 202, r.text
    assert r.json()["triples"]["train"]["triples"] == triples


def test_parquet_upload(client):
    r = post(client, parquet_bytes(), "train.parquet")
    assert r.status_code == 202, r.text
    assert r.json()["triples"]["train"]["triples"] == 2


def test_a_bad_row_names_the_client_file_and_row(client):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    out = io.BytesIO()
    pq.write_table(pa.table({"head": ["a", ""], "relation": ["r", "r"], "tail": ["b", "c"]}), out)
    r = post(client, out.getvalue(), "mine.parquet")
    assert r.status_code == 422 and r.json()["detail"] == "mine.parquet, row 2: empty head value"


def test_the_worker_reads_the_upload_with_the_jobs_options(client, tmp_path):
    """A header row and a column order given with the job hold when the worker trains: same triples as checked."""
    content = b"subject,object,predicate\n" + b"".join(f"e{i},e{(i + 1) % 6},r{i % 2}\n".encode() for i in range(6))
    r = post(client, content, "train.csv", steps=2, dim=4, eval_every=0, header="true", columns="h,t,r")
    assert r.status_code == 202, r.text
    job = Worker(WorkerConfig(home=tmp_path, worker_id="w", threads=1, heartbeat_seconds=0.05)).run_once()
    assert job is not None and job.state == "succeeded", job and job.error
    model = client.get(f"/models/{job.model_id}").json()
    assert (model["relations"], model["entities"]) == (2, 6)
