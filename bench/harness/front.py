"""The front's attacks of issue 56 against a live API server, each a function of the base URL (and token) that
returns what it found: the bodies, headers, sockets and concurrent requests that stalled, overfilled or tricked
the server. bench/abuse.py --front runs them on the code before and after."""

from __future__ import annotations

import hashlib
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import anyio
import httpx

MB = 2**20
TRAIN = {"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")}
# 50,000 triples (0.8 MB): checking them takes long enough that concurrent requests all pass the early count.
LARGER = {"train": ("train.txt", b"".join(b"e%d\tr\te%d\n" % (i, i + 1) for i in range(50_000)))}
HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def connect(base: str, timeout: float = 60.0) -> socket.socket:
    url = urlsplit(base)
    return socket.create_connection((url.hostname, url.port), timeout=timeout)


def raw_status(sock: socket.socket) -> str:
    """The status code of the answer on `sock`, or what happened instead."""
    try:
        data = sock.recv(4096)
    except (ConnectionResetError, TimeoutError) as exc:
        return type(exc).__name__
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"


def send_head(base: str, head: bytes, *, chunk: int = MB) -> str:
    """Send a request head of any size (in chunks, as far as the server reads it) and its blank line."""
    with connect(base) as sock:
        try:
            for at in range(0, len(head), chunk):
                sock.sendall(head[at:at + chunk])
            sock.sendall(b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        return raw_status(sock)


def predict_flood(base: str, token: str) -> dict:
    """POST /predict with 10 MiB of empty queries."""
    body = b'{"model": "m", "queries": [' + b",".join([b"{}"] * (5 * MB)) + b"]}"
    r = httpx.post(f"{base}/predict", content=body, headers={"Content-Type": "application/json"}, timeout=300)
    return {"statuses": [r.status_code], "answer_bytes": len(r.content)}


def big_headers(base: str, token: str) -> dict:
    """Four requests at once, each with one 64 MiB header."""
    head = HEAD + b"X-Big: " + b"a" * (64 * MB) + b"\r\n"
    with ThreadPoolExecutor(4) as pool:
        return {"statuses": list(pool.map(lambda _: send_head(base, head), range(4)))}


def many_headers(base: str, token: str) -> dict:
    """One request with 100,000 header fields."""
    return {"statuses": [send_head(base, HEAD + b"".join(b"X-%d: 1\r\n" % i for i in range(100_000)))]}


def slow_headers(base: str, token: str, sockets: int = 1000, hold: float = 15.0) -> dict:
    """`sockets` connections that send part of a request head and then nothing: how many the server closed after
    `hold` seconds."""
    held = []
    for _ in range(sockets):
        sock = connect(base)
        sock.sendall(HEAD[:20])
        held.append(sock)
    time.sleep(hold)
    readable, _, _ = select.select(held, [], [], 0)
    closed = sum(1 for sock in readable if raw_status(sock) in ("408", "closed", "ConnectionResetError"))
    for sock in held:
        sock.close()
    return {"statuses": [f"{closed} of {sockets} closed after {hold:g} s"], "closed": closed}


def quiet(base: str, token: str, seconds: float = 5.0) -> dict:
    """No attack: the /healthz probe alone for `seconds`, what the machine's load alone makes of it (a baseline)."""
    time.sleep(seconds)
    return {"statuses": [f"nothing for {seconds:g} s"]}


def race_jobs(base: str, token: str, clients: int = 60, files: dict | None = None) -> dict:
    """`clients` concurrent POST /jobs with one token (quota EARL_MAX_QUEUED_JOBS=10), then the client name shown."""
    auth = {"Authorization": f"Bearer {token}"}
    with ThreadPoolExecutor(clients) as pool:
        statuses = list(pool.map(lambda _: httpx.post(f"{base}/jobs", files=files or LARGER, headers=auth, timeout=300)
                                 .status_code, range(clients)))
    jobs = httpx.get(f"{base}/jobs", headers=auth).json()
    shown = jobs[0]["params"]["client"] if jobs else None
    for job in jobs:
        httpx.post(f"{base}/jobs/{job['id']}/cancel", headers=auth)
    guessable = shown == hashlib.sha256(b"token:" + token.encode()).hexdigest()[:16]
    shown_as = "sha256 of the token: guessable offline" if guessable else "an HMAC"
    return {"statuses": [f"{statuses.count(202)} accepted; client shown as {shown_as}"], "accepted": statuses.count(202),
            "client_guessable_offline": guessable, "job": jobs[0]["id"] if jobs else None}


def race_small_jobs(base: str, token: str) -> dict:
    """race_jobs with a 2-triple file: what 60 concurrent requests cost apart from their bodies' size."""
    return race_jobs(base, token, files=TRAIN)


def race_probes(base: str, token: str, clients: int = 60) -> dict:
    """`clients` concurrent GET /healthz, the cheapest route: what 60 requests at once cost the probe by themselves."""
    with ThreadPoolExecutor(clients) as pool:
        statuses = list(pool.map(lambda _: httpx.get(f"{base}/healthz", timeout=300).status_code, range(clients)))
    return {"statuses": [f"{statuses.count(200)} x 200"]}


def race_streams(base: str, token: str, clients: int = 300) -> dict:
    """`clients` concurrent event streams of one job (cap 64 per process), each one that opens held until every
    client has its answer: the 200s were all open at once."""
    auth = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{base}/jobs", files=TRAIN, headers=auth).json()["id"]

    async def run() -> list[int]:
        found: list[int] = []
        everyone = anyio.Event()
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as client:
            async def one() -> None:
                async with client.stream("GET", f"{base}/jobs/{job}/events") as response:
                    found.append(response.status_code)
                    if len(found) == clients:
                        everyone.set()
                    if response.status_code == 200:
                        with anyio.move_on_after(60):
                            await everyone.wait()
            async with anyio.create_task_group() as group:
                for _ in range(clients):
                    group.start_soon(one)
        return found

    statuses = anyio.run(run)
    httpx.post(f"{base}/jobs/{job}/cancel", headers=auth)
    return {"statuses": [f"{statuses.count(200)} open at once"], "open": statuses.count(200)}


def long_fanout(base: str, token: str) -> dict:
    r = httpx.post(f"{base}/jobs", files=TRAIN, data={"fanout": "9" * 5000},
                   headers={"Authorization": f"Bearer {token}"})
    if r.status_code == 202:
        httpx.post(f"{base}/jobs/{r.json()['id']}/cancel", headers={"Authorization": f"Bearer {token}"})
    return {"statuses": [r.status_code]}


def response_headers(base: str, token: str) -> dict:
    r = httpx.get(f"{base}/models/{'0' * 32}")
    docs = httpx.get(f"{base}/docs").text
    names = ("content-security-policy", "x-content-type-options", "x-frame-options")
    cdn = "cdn." in docs or "unpkg" in docs
    return {"statuses": [" ".join(n for n in names if n in r.headers) or "none,", "/docs from a CDN" if cdn else
                         "/docs local"], "docs_cdn": cdn}


def cross_origin_writes(base: str, token: str) -> dict:
    """A page on another origin: a no-cors POST /jobs, then a cancel of someone's job (tokenless server)."""
    page = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    created = httpx.post(f"{base}/jobs", files=TRAIN, headers=page).status_code
    victim = httpx.post(f"{base}/jobs", files=TRAIN, headers={"X-Forwarded-For": "10.9.9.9"}).json().get("id")
    cancelled = httpx.post(f"{base}/jobs/{victim}/cancel", headers=page).status_code if victim else None
    for job in httpx.get(f"{base}/jobs").json():  # the next case starts with no unfinished job
        httpx.post(f"{base}/jobs/{job['id']}/cancel")
    return {"statuses": [created, cancelled]}


def dns_rebinding(base: str, token: str) -> dict:
    return {"statuses": [httpx.get(f"{base}/jobs", headers={"Host": "rebind.evil.example"}).status_code]}


def forwarded_for(base: str, token: str, clients: int = 30) -> dict:
    """`clients` POST /jobs, each claiming another address in X-Forwarded-For (quota 1 per address here)."""
    statuses = [httpx.post(f"{base}/jobs", files=TRAIN, headers={"X-Forwarded-For": f"10.0.{i}.1"}).status_code
                for i in range(clients)]
    return {"statuses": [f"{statuses.count(202)} accepted"], "accepted": statuses.count(202)}


# (name, function, server): "token" servers have EARL_API_TOKEN, "open" ones none and a quota of 1 job.
ATTACKS = [("none: the /healthz probe alone for 5 s (baseline)", quiet, "token"),
           ("POST /predict, 10 MiB of empty queries", predict_flood, "token"),
           ("4 requests, one 64 MiB header each", big_headers, "token"),
           ("100,000 header fields", many_headers, "token"),
           ("1,000 slow-header sockets", slow_headers, "token"),
           ("60 concurrent POST /jobs, one token (quota 10)", race_jobs, "token"),
           ("60 concurrent POST /jobs of 2 triples, one token (quota 10)", race_small_jobs, "token"),
           ("60 concurrent GET /healthz (a control)", race_probes, "token"),
           ("300 concurrent event streams (cap 64)", race_streams, "token"),
           ("fanout of 5,000 digits", long_fanout, "token"),
           ("security headers on a 404; /docs from a CDN", response_headers, "token"),
           ("another origin's no-cors POST /jobs, cancel", cross_origin_writes, "open"),
           ("Host: rebind.evil.example (DNS rebinding)", dns_rebinding, "open"),
           ("30 POST /jobs, each its own X-Forwarded-For", forwarded_for, "open")]
