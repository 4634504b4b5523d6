"""A corpus of bad requests: each gets its exact status and a message that says what is wrong; the server lives on.

Every case runs through one app (tmp home, a token, a 16 MiB upload limit, 2 MiB unpacked limit for .gz) and is
followed by GET /healthz. Cases that are *accepted* (BOM, CRLF, duplicates, self-loops, a two-entity graph) are
here too: refusing good data is also a bug.
"""

from __future__ import annotations

import gzip
import json
import resource
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import REPO, api_operations
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.bundle.format import read_safetensors, write_safetensors
from earl_service.bundle.model_io import load_bundle

sys.path.insert(0, str(REPO / "bench"))
from harness import hostile  # noqa: E402 - the hostile bundles of issue 34 (bench/harness/hostile.py)

TOKEN = "bad-inputs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD = b"a\tr\tb\nb\tr\tc\n"
LIMIT_MB = 16
MB = 2**20


@dataclass
class Ctx:
    client: TestClient
    home: Path
    model_id: str
    bundle: bytes  # a valid bundle file
    head: str
    relation: str
    tail: str


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, codex_bundle) -> Ctx:
    home = tmp_path_factory.mktemp("home")
    settings = Settings(home=home, api_token=TOKEN, max_upload_mb=LIMIT_MB, max_unpacked_mb=2)
    with TestClient(create_app(settings)) as client:
        data = codex_bundle.read_bytes()
        r = client.post("/models", files={"bundle": ("codex.safetensors", data)}, headers=AUTH)
        assert r.status_code == 201, r.text
        bundle = load_bundle(codex_bundle)
        h, rel, t = bundle.triples[0]
        yield Ctx(client, home, r.json()["id"], data, bundle.entities.names[h], bundle.relations.names[rel],
                  bundle.entities.names[t])


# ---------------------------------------------------------------- request builders


def job(train: bytes, name: str = "train.txt", data: dict | None = None, **files: tuple[str, bytes]):
    return lambda c: c.client.post("/jobs", files={"train": (name, train), **files}, data=data or {}, headers=AUTH)


def param(**data):
    return job(GOOD, data={k: str(v) for k, v in data.items()})


def predict(**params):
    def send(c: Ctx):
        query = {"model": c.model_id, "relation": c.relation, "head": c.head}
        query.update({k: v(c) if callable(v) else v for k, v in params.items()})
        return c.client.get("/predict", params={k: v for k, v in query.items() if v is not None})
    return send


def upload_bundle(make: Callable[[bytes], bytes], name: str = "model.safetensors"):
    return lambda c: c.client.post("/models", files={"bundle": (name, make(c.bundle))}, headers=AUTH)


def extend(content: bytes, model: str | None = None):
    return lambda c: c.client.post(f"/models/{model or c.model_id}/triples", files={"triples": ("more.txt", content)},
                                   headers=AUTH)


def gzip_bomb(unpacked: int = 64 * MB) -> bytes:
    """A valid triple file repeated to `unpacked` bytes, gzipped (~1000:1) without holding it in memory."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    block = b"a\tr\tb\n" * (MB // 6)
    out = [packer.compress(block) for _ in range(unpacked // len(block))]
    return b"".join(out) + packer.flush()


def with_metadata(data: bytes, **changes) -> bytes:
    """The bundle with its safetensors header metadata edited (the payload checksum still matches)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header["__metadata__"]
    for key, value in changes.items():
        meta[key] = value(meta[key]) if callable(value) else value
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:]


def with_tensor(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[bytes], bytes]:
    """The bundle with one tensor replaced and its payload checksum recomputed (a well-formed, lying file)."""
    def make(data: bytes) -> bytes:
        meta, tensors, _ = read_safetensors(_scratch(data))
        tensors[name] = change(tensors[name])
        meta.pop("payload_sha256")
        return write_safetensors(_scratch(b""), tensors, meta).read_bytes()
    return make


def _scratch(data: bytes) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "bundle.safetensors"
    path.write_bytes(data)
    return path


def config(**changes):
    return lambda text: json.dumps({**json.loads(text), **changes})


def foreign_safetensors(_: bytes) -> bytes:
    import numpy as np
    from safetensors.numpy import save

    return save({"weight": np.zeros((2, 2), dtype=np.float32)})


def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def counts(split: str, triples: int, duplicates: int = 0):
    def check(body: dict) -> None:
        assert body["state"] == "queued"
        assert body["triples"][split] == {"triples": triples, "duplicates_dropped": duplicates}
    return check


# ---------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Case:
    name: str
    send: Callable[[Ctx], httpx.Response]
    status: int
    fragment: str  # must appear in the response's detail
    check: Callable[[dict], None] | None = None


TEN_MB_LINE = b"x" * (10 * MB) + b"\n"
CASES = [
    # triple files
    Case("empty file", job(b""), 422, "train.txt: is empty"),
    Case("only blank lines", job(b"\n \n\t\n"), 422, "train.txt: is empty"),
    Case("binary with NUL bytes", job(bytes(range(256)) * 8), 422, "contains a NUL byte; looks like a binary file"),
    Case("binary without NUL", job(bytes(range(1, 256)) * 8), 422, "not valid UTF-8"),
    Case("two columns", job(b"a\tr\tb\nc\td\n"), 422,
         "train.txt, line 2: expected 3 columns (head, relation, tail) separated by tabs, found 2"),
    Case("four columns", job(b"a\tr\tb\tx\n"), 422, "line 1: expected 3 columns"),
    Case("spaces in a tab file", job(b"a\tr\tb\n" * 70 + b"c r d\n"), 422,
         "line 71: expected 3 columns (head, relation, tail) separated by tabs, found 1 (the fields seem to be "
         "separated by spaces)"),
    Case("semicolons, 2 fields", job(b"a;r;b\nc;d\n", name="train.csv"), 422,
         "train.csv, line 2: expected 3 columns (head, relation, tail) separated by semicolons, found 2"),
    Case("empty field", job(b"a\t\tb\n"), 422, "line 1: empty relation field"),
    Case("csv with two columns", job(b"a,r,b\nc,d\n", name="train.csv"), 422, "train.csv, line 2: expected 3 "
         "columns (head, relation, tail) separated by commas, found 2"),
    Case("10 MB single line", job(TEN_MB_LINE), 422, "train.txt, line 1: expected 3 columns"),
    Case("10 MB name", job(b"a\tr\t" + TEN_MB_LINE), 422, "names are limited to 1,000"),
    Case("latin-1", job("a\tr\tb\nJosé\tr\tb\n".encode("latin-1")), 422, "line 2: not valid UTF-8 (byte 0xe9"),
    Case("UTF-16", job("a\tr\tb\n".encode("utf-16")), 422, "is encoded as UTF-16; save it as UTF-8"),
    Case("gzip bomb", job(gzip_bomb(), name="train.txt.gz"), 422, "possible gzip bomb"),
    Case("gzip magic, then garbage", job(b"\x1f\x8b" + GOOD, name="train.txt"), 422, "not a valid gzip file"),
    Case("truncated gzip", job(gzip.compress(GOOD * 100)[:-12], name="train.txt.gz"), 422,
         "not a valid gzip file"),
    Case("upload over the limit", job(b"a\tr\tb\n" * (3 * LIMIT_MB * MB // 18)), 413,
         f"upload limit of {LIMIT_MB} MiB (EARL_MAX_UPLOAD_MB)"),
    Case("bad valid file", job(GOOD, valid=("valid.txt", b"x\ty\n")), 422, "valid.txt, line 1: expected 3"),
    Case("relation labels not JSON", job(GOOD, relation_labels=("labels.json", b"{oops")), 422,
         "labels.json, line 1: not a JSON object of labels"),
    Case("entity labels with a short line", job(GOOD, entity_labels=("ents.tsv", b"a\tA\nb\n")), 422,
         "ents.tsv, line 2: expected 2 or 3 tab-separated fields"),
    Case("no train file", lambda c: c.client.post("/jobs", data={"steps": "5"}, headers=AUTH), 422, "train"),
    # accepted as they are
    Case("UTF-8 BOM accepted", job(b"\xef\xbb\xbf" + GOOD), 202, "", counts("train", 2)),
    Case("CRLF accepted", job(b"a\tr\tb\r\nb\tr\tc\r\n"), 202, "", counts("train", 2)),
    Case("duplicates accepted and counted", job(GOOD * 3), 202, "", counts("train", 2, duplicates=4)),
    Case("self-loops accepted", job(b"a\tr\ta\nb\tr\tb\na\tr\tb\n"), 202, "", counts("train", 3)),
    Case("one relation, two entities accepted", job(b"a\tr\tb\n"), 202, "", counts("train", 1)),
    Case("gzip accepted", job(gzip.compress(GOOD), name="train.tsv.gz"), 202, "", counts("train", 2)),
    # formats told by content, not by name (more in test_upload_formats.py)
    Case("gzip bytes named .txt accepted", job(gzip.compress(GOOD * 50)), 202, "", counts("train", 2, 98)),
    Case("columns not an order of h,r,t", job(GOOD, data={"columns": "h,h,t"}), 422, "columns"),
    # training options
    Case("unknown option", param(stepz=3), 422, "unknown form field(s): stepz"),
    Case("dim 0", param(dim=0), 422, "greater than or equal to 1"),
    Case("dim not a number", param(dim="abc"), 422, "valid integer"),
    Case("dim a float", param(dim=1.5), 422, "valid integer"),
    Case("lr nan", param(lr="nan"), 422, "lr"),
    Case("gamma inf", param(gamma="inf"), 422, "gamma"),
    Case("reserved_ratio above 1", param(reserved_ratio=1.5), 422, "less than or equal to 1"),
    Case("k 0", param(k=0), 422, "greater than or equal to 1"),
    Case("steps 10**12", param(steps=10**12), 422, "less than or equal to 10000000"),
    Case("unknown model kind", param(model="transe"), 422, "'earl' or 'rotate'"),
    Case("unknown precision", param(precision="fp8"), 422, "'fp32', 'fp16' or 'int8'"),
    Case("boolean not a boolean", param(no_knn="maybe"), 422, "valid boolean"),
    # predictions
    Case("unknown model", predict(model=lambda c: c.model_id[:-1] + "x"), 404, "did you mean"),
    Case("unknown entity", predict(head=lambda c: c.head + "Z"), 404, "unknown entity"),
    Case("unknown relation", predict(relation=lambda c: c.relation + "9"), 404, "unknown relation"),
    Case("head and tail", predict(tail=lambda c: c.tail), 422, "give exactly one of 'head'"),
    Case("neither head nor tail", predict(head=None), 422, "give exactly one of 'head'"),
    Case("k 0 in predict", predict(k=0), 422, "greater than or equal to 1"),
    Case("k not a number", predict(k="ten"), 422, "valid integer"),
    Case("k too large", predict(k=5000), 422, "less than or equal to 1000"),
    Case("exclude_known not boolean", predict(exclude_known="perhaps"), 422, "valid boolean"),
    Case("empty relation", predict(relation=""), 422, "at least 1 character"),
    Case("1001-character head", predict(head="h" * 1001), 422, "at most 1000 characters"),
    Case("path traversal model", predict(model="../etc/passwd"), 422, "should match pattern"),
    # models
    Case("unknown model detail", lambda c: c.client.get(f"/models/{c.model_id[:-1]}x"), 404, "did you mean"),
    Case("extend with unknown relation", extend(b"NEW\tP_NONE\tX\n"), 422, "more.txt, line 1: unknown relation"),
    Case("extend with binary", extend(b"\x00\x01\x02"), 422, "NUL byte"),
    Case("extend unknown model", extend(GOOD, model="0" * 32), 404, "not found"),
    Case("empty bundle", upload_bundle(lambda d: b""), 422, "too short for a safetensors header"),
    Case("random bytes bundle", upload_bundle(lambda d: bytes(range(256)) * 40), 422, "is not an EARL bundle"),
    Case("text as bundle", upload_bundle(lambda d: GOOD * 10), 422, "is not an EARL bundle"),
    Case("bundle cut inside its header", upload_bundle(lambda d: d[:100]), 422, "is not an EARL bundle (truncated"),
    Case("bundle cut in half", upload_bundle(lambda d: d[: len(d) // 2]), 422, "is corrupted or truncated"),
    Case("bundle missing its last byte", upload_bundle(lambda d: d[:-1]), 422, "corrupted or truncated"),
    Case("corrupted bundle payload", upload_bundle(flip_last_byte), 422, "does not match its SHA-256"),
    Case("foreign safetensors", upload_bundle(foreign_safetensors), 422, "safetensors file but not an EARL bundle"),
    Case("bundle from the future", upload_bundle(lambda d: with_metadata(d, format_version="99")), 422,
         "newer than this library's"),
    Case("bundle config claims dim 10**6", upload_bundle(lambda d: with_metadata(d, config=config(dim=10**6)))
         , 422, "the config implies"),
    Case("bundle config claims 10**9 layers",
         upload_bundle(lambda d: with_metadata(d, config=config(layers=10**9))), 422, "GNN layers"),
    Case("bundle config not JSON", upload_bundle(lambda d: with_metadata(d, config="{nope")), 422,
         "missing or malformed content"),
    Case("bundle config with a bad model", upload_bundle(lambda d: with_metadata(d, config=config(model="x"))),
         422, "malformed content"),
    Case("bundle with NaN weights", upload_bundle(with_tensor("param.relations", lambda t: t * np.nan)), 422,
         "the rebuilt embeddings hold NaN or infinite values"),
    Case("bundle with a negative reserved id",
         upload_bundle(with_tensor("buffer.reserved", lambda t: -t.astype(np.int64) - 1)), 422,
         "reserved entity ids outside the vocabulary"),
    # issue 34: memory bombs (the corpus test bounds the memory of each), unservable bundles, malformed metadata
    Case("bundle weights declaring a 512 MiB tensor", upload_bundle(lambda d: hostile.weights_bomb(d, decoded_mib=512)),
         422, "in its coded weights, the config implies"),
    Case("bundle graph of 2**27 edges for one entity", upload_bundle(hostile.graph_bomb), 422,
         "graph counts 134217728 edges"),
    Case("bundle graph of 5.5M repeated edges", upload_bundle(hostile.duplicate_edges), 422, "repeated edge"),
    Case("RotatE bundle with a NaN relation row",
         upload_bundle(lambda d: hostile.with_tensor("param.relations", hostile._nan_row)(hostile.source_bundle("rotate"))),
         422, "'relations' is not finite"),
    Case("RotatE bundle with entity values of 1e30",
         upload_bundle(lambda d: hostile.with_tensor("param.entities", lambda x: x * 0 + 1e30)(
             hostile.source_bundle("rotate"))), 422, "scores stay finite in float32"),
    Case("bundle with gamma = -epsilon", upload_bundle(hostile.with_config(gamma=-2.0, epsilon=2.0)), 422,
         "gamma must be > 0"),
    Case("bundle config gamma Infinity", upload_bundle(hostile.with_config(gamma=float("inf"))), 422,
         "config holds Infinity"),
    Case("bundle __metadata__ a JSON list", upload_bundle(hostile.with_header(lambda h: {**h, "__metadata__": [1]})),
         422, "__metadata__ must be a JSON object of strings"),
    Case("bundle config a JSON string", upload_bundle(hostile.with_metadata(config='"earl"')), 422,
         "config must be a JSON object"),
    Case("bundle config nested 100k deep", upload_bundle(hostile.with_metadata(config=hostile.NESTED)), 422,
         "METADATA_LIMITS"),
    Case("bundle config nested 5000 deep", upload_bundle(hostile.with_metadata(config="[" * 5000 + "]" * 5000)), 422,
         "config is nested more than 32 deep"),
    Case("bundle relation labels nested 100k deep", upload_bundle(hostile.with_metadata(relation_labels=hostile.NESTED)),
         422, "relation_labels is nested more than 32 deep"),
    Case("bundle header nested 100k deep", upload_bundle(hostile.with_header(lambda h: hostile.NESTED.encode())), 422,
         "nested more than 32 deep"),
    Case("bundle metrics a JSON string", upload_bundle(hostile.with_metadata(metrics='"good"')), 422,
         "metrics must be a JSON object"),
    Case("bundle metrics of 1 MB", upload_bundle(hostile.with_metadata(metrics=json.dumps({"x": "x" * 2**20}))), 422,
         "'metrics' may (65,536, bundle_format.METADATA_LIMITS)"),
    Case("relation labels nested 100k deep",
         job(GOOD, relation_labels=("labels.json", f'{{"r": {hostile.NESTED}}}'.encode())), 422,
         "labels.json: not a JSON object of labels: the label file is nested more than 32 deep"),
    Case("relation label too large for a bundle",
         job(GOOD, relation_labels=("labels.json", json.dumps({"r": "x" * 3 * MB}).encode())), 422,
         "labels.json, line 1: a label of 3,145,728 characters; labels are limited to 1,000"),
    Case("streamed bundle over the limit (no Content-Length)",
         lambda c: c.client.post("/models", content=(b"\0" * MB for _ in range(LIMIT_MB + 2)), headers={
             **AUTH, "Content-Type": "multipart/form-data; boundary=xyz"}), 413, "EARL_MAX_UPLOAD_MB"),
]


def detail_text(response: httpx.Response) -> str:
    detail = response.json().get("detail", "")
    return detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_request(ctx, case):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = case.send(ctx)
    assert r.status_code == case.status, r.text[:500]
    assert case.fragment in detail_text(r), r.text[:500]
    if case.check is not None:
        case.check(r.json())
    # Bounded memory: the 10 MB line and the 64 MB gzip bomb never cost more than a few copies of the upload.
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024 < 256
    assert ctx.client.get("/healthz").json() == {"status": "ok"}


def test_a_refused_bundle_is_never_registered(ctx):
    """Registration is all or nothing: a client retrying a refused bundle never makes duplicates."""
    listed = len(ctx.client.get("/models").json())
    bad = hostile.with_metadata(metrics='"good"')(ctx.bundle)
    for _ in range(2):
        r = ctx.client.post("/models", files={"bundle": ("m.safetensors", bad)}, headers=AUTH)
        assert r.status_code == 422, r.text
    assert len(ctx.client.get("/models").json()) == listed


def test_a_failed_load_is_remembered_until_the_file_changes(ctx, monkeypatch):
    """A registered model whose file went bad answers 500 with the reason at once: the file is read once, not
    once per request. A changed file (restored from a backup) is read again."""
    import earl_service.bundle.model_io

    model = ctx.client.post("/models", files={"bundle": ("m.safetensors", ctx.bundle)}, headers=AUTH).json()["id"]
    path = ctx.home / "models" / model / "v1.safetensors"  # ServiceHome.version_path
    assert path.is_file()
    path.write_bytes(ctx.bundle[: len(ctx.bundle) // 2])
    loads = []
    real_load = earl_service.bundle.model_io.load_bundle
    monkeypatch.setattr(earl_service.bundle.model_io, "load_bundle",
                        lambda p, **kw: loads.append(p) or real_load(p, **kw))
    query = {"model": model, "relation": ctx.relation, "head": ctx.head}
    for _ in range(3):
        r = ctx.client.get("/predict", params=query)
        assert r.status_code == 500 and "corrupted or truncated" in r.json()["detail"], r.text
    assert len(loads) == 1
    path.write_bytes(ctx.bundle)
    assert ctx.client.get("/predict", params=query).status_code == 200 and len(loads) == 2
    assert ctx.client.delete(f"/models/{model}", headers=AUTH).status_code == 204


def test_listings_do_not_decode_config_or_metrics(ctx):
    """/models, /metrics and a 404's suggestions list every model: the store leaves out what they never show."""
    from earl_service.service.records import ModelRecord
    from earl_service.service.sqlite_store import SqliteStore

    store = SqliteStore(ctx.home / "earl.sqlite3")
    try:
        store.add_model(ModelRecord(id="listed", path="models/listed.safetensors", sha256="0" * 64, bytes=1,
                                    config={"dim": 8}, metrics={"pad": "x" * 60_000}))
        assert [(m.config, m.metrics) for m in store.list_models() if m.id == "listed"] == [({}, {})]
        assert store.get_model("listed").metrics == {"pad": "x" * 60_000}
        store.delete_model("listed")
    finally:
        store.close()


def test_refused_uploads_leave_nothing_behind(ctx):
    """After the corpus: models/ holds only complete bundles, and no staging file lingers in uploads/."""
    for path in (ctx.home / "models").rglob("*.safetensors"):
        load_bundle(path)
    assert not [p for p in (ctx.home / "uploads").iterdir() if p.name.startswith(".")]
    listed = {m["id"] for m in ctx.client.get("/models").json()}
    assert {p.name for p in (ctx.home / "models").iterdir()} == listed  # models/<id>/v<N>.safetensors


# ---------------------------------------------------------------- malicious ids, on every route with an id

BAD_IDS = {  # as sent in the URL -> status
    "%2e%2e": 422,  # '..' once decoded: refused by the id pattern
    "..%2f..%2fetc%2fpasswd": 404,  # the %2f splits the path: no route matches
    "x" * 65: 422,
    "%C3%A9": 422,  # 'é'
    "%E6%A8%A1%E5%9E%8B": 422,  # a CJK id
    "%00": 422,
    "a%20b": 422,
    "a;rm%20-rf": 422,
}


def id_routes() -> list[tuple[str, str]]:
    return [(method, path) for method, path in api_operations() if "{" in path]


def test_every_id_route_is_covered():
    assert len(id_routes()) >= 6  # GET/cancel jobs; GET/DELETE/bundle/triples models


@pytest.mark.parametrize("method,path", id_routes())
@pytest.mark.parametrize("bad_id,status", BAD_IDS.items(), ids=list(BAD_IDS))
def test_malicious_ids(ctx, method, path, bad_id, status):
    url = path.replace("{job_id}", bad_id).replace("{model_id}", bad_id).replace("{key_id}", bad_id)
    files = {"triples": ("t.txt", GOOD)} if url.endswith("/triples") else None
    r = ctx.client.request(method, url, headers=AUTH, files=files)
    assert r.status_code == status, r.text
    assert ("should match pattern" if status == 422 else "Not Found") in detail_text(r)
    assert ctx.client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize("method,path", id_routes())
def test_unknown_well_formed_id_is_404(ctx, method, path):
    url = path.replace("{job_id}", "0" * 32).replace("{model_id}", "0" * 32).replace("{key_id}", "0" * 32)
    files = {"triples": ("t.txt", GOOD)} if url.endswith("/triples") else None
    params = {"q": "x"} if url.endswith("/entities") else None  # a valid query: the unknown id is what is wrong
    r = ctx.client.request(method, url, headers=AUTH, files=files, params=params)
    assert r.status_code == 404 and r.json()["detail"]["name"] == "0" * 32


@pytest.mark.parametrize(("limit", "needle"), [({"max_bundle_entities": 1000}, "names"),
                                               ({"max_bundle_triples": 1000}, "triples")])
def test_a_bundle_larger_than_the_server_takes_is_refused(tmp_path, codex_bundle, limit, needle):
    """EARL_MAX_BUNDLE_ENTITIES / _TRIPLES: the CoDEx-S bundle (2,034 entities, 32,888 triples) over a server that
    takes 1,000 is a 422 naming the setting, and nothing is registered."""
    settings = Settings(home=tmp_path, api_token=TOKEN, **limit)
    with TestClient(create_app(settings)) as client:
        r = client.post("/models", files={"bundle": ("big.safetensors", codex_bundle.read_bytes())}, headers=AUTH)
        assert r.status_code == 422 and needle in r.text and "EARL_MAX_BUNDLE_ENTITIES" in r.text, r.text
        assert client.get("/models").json() == []
