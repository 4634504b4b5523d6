"""The front over real HTTP (issue 56), served as `earl serve` serves it (api/server.py): header bytes and count,
a deadline for the headers, idle keep-alive, and the same settings wherever the API is launched."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from live import live, read_response

from api.main import create_app
from api.settings import Settings

MB = 2**20


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return Settings(home=tmp_path_factory.mktemp("home"), header_timeout_seconds=1.0, keep_alive_seconds=1)


@pytest.fixture(scope="module")
def base(settings):
    with live(create_app(settings), settings=settings) as url:
        yield url


def connect(base: str) -> socket.socket:
    url = urlsplit(base)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def ask(base: str, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `head` (a request line and headers, unfinished) plus the blank line; the answer, however the server
    took the request (it may close while the rest is still being sent)."""
    with connect(base) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + b"\r\n")
        return read_response(sock)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closes `sock` within `seconds` (bounded reads), and what it sent before."""
    sock.settimeout(0.2)
    got, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def test_a_header_past_the_byte_limit_is_refused(base):
    """One 64 MiB header was accepted (four at once +386 MiB); h11 now stops buffering at 64 KiB."""
    status, _, _ = ask(base, GET + b"X-Big: " + b"a" * MB + b"\r\n")
    assert status == 400
    assert ask(base, GET + b"X-Fits: " + b"a" * 32_000 + b"\r\n")[0] == 200


def test_too_many_header_fields_are_431(base):
    """100,000 headers were accepted; past EARL_MAX_HEADERS (100) they are refused, within the byte limit too."""
    status, _, body = ask(base, GET + b"".join(b"X-%d: 1\r\n" % i for i in range(1_000)))
    assert status == 431 and b"EARL_MAX_HEADERS" in body
    assert ask(base, GET + b"".join(b"X-%d: 1\r\n" % i for i in range(90)))[0] == 200


@pytest.mark.parametrize("sent", [b"", GET[:10]], ids=["nothing", "part-of-a-request-line"])
def test_a_connection_without_its_headers_is_closed_at_the_deadline(base, sent):
    """1,000 slow-header sockets were held open 60 s, none closed; now each is closed after 1 s (the setting)."""
    with connect(base) as sock:
        sock.sendall(sent)
        closed, got = closed_within(sock, 5.0)
    assert closed and (got.startswith(b"HTTP/1.1 408") or got == b"")


def test_trickled_headers_do_not_move_the_deadline(base):
    with connect(base) as sock:
        start, closed = time.monotonic(), False
        for byte in GET:  # one byte every 0.1 s: the request line and headers would take 4 s
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - start > 4:
                break
        closed = closed or closed_within(sock, 2.0)[0]
    assert closed and time.monotonic() - start < 4


def test_a_kept_alive_connection_is_closed_when_idle_and_its_next_headers_have_a_deadline(base):
    with connect(base) as sock:
        sock.sendall(GET + b"\r\n")
        assert read_response(sock)[0] == 200
        assert closed_within(sock, 5.0)[0]  # idle: keep-alive of 1 s
    with connect(base) as sock:
        sock.sendall(GET + b"\r\n" + GET[:20])  # one request, then half of the next one's head
        assert read_response(sock)[0] == 200
        assert closed_within(sock, 5.0)[0]


def test_a_slow_body_is_not_cut_by_the_header_deadline(base):
    with connect(base) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2\r\n\r\n{")
        time.sleep(1.5)  # past the header deadline, inside the body
        sock.sendall(b"}")
        assert read_response(sock)[0] == 422


def test_earl_serve_uses_the_front_settings(monkeypatch, tmp_path):
    """`earl serve` (the Makefile's `serve`, the Docker image's command) builds its server from server_config."""
    import uvicorn

    from api.serve import serve
    from api.server import DeadlineH11

    seen = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: seen.append(self.config))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # serve() makes SIGINT/SIGTERM no-ops for uvicorn
    monkeypatch.setenv("EARL_MAX_HEADER_BYTES", "20000")
    monkeypatch.setenv("EARL_TRUSTED_PROXIES", "10.0.0.7, 10.0.1.0/24")
    args = type("Args", (), {"home": str(tmp_path), "store": "sqlite", "host": "127.0.0.1", "port": 1,
                             "no_worker": True, "worker_threads": 1, "log_level": "warning", "stop_timeout": 1})
    assert serve(args) == 0
    (config,) = seen
    assert issubclass(config.http, DeadlineH11) and config.http.header_seconds == 10.0
    assert config.h11_max_incomplete_event_size == 20000 and config.timeout_keep_alive == 5
    assert config.proxy_headers and config.forwarded_allow_ips == ["10.0.0.7", "10.0.1.0/24"]


# ---------------------------------------------------------------- Host, origins of writes, forwarded addresses

TRAIN = {"train": ("train.txt", b"a\tr\tb\nb\tr\tc\n")}


@pytest.mark.parametrize(("host", "status"), [("127.0.0.1", 200), ("localhost", 200), ("[::1]", 200),
                                              ("evil.example", 400), ("attacker.test", 400), ("127.0.0.1.nip.io", 400)])
def test_only_the_hosts_this_server_answers_to_are_answered(base, host, status):
    """Any Host was answered, so a page whose name was made to resolve to 127.0.0.1 could read (DNS rebinding)."""
    port = urlsplit(base).port
    r = httpx.get(f"{base}/jobs", headers={"Host": f"{host}:{port}"})
    assert r.status_code == status, r.text
    if status == 400:
        assert "EARL_ALLOWED_HOSTS" in r.json()["detail"]


def test_allowed_hosts_add_names_and_a_star_opens_them_all(tmp_path):
    for allowed, host, status in [("api.example.org", "api.example.org", 200), ("api.example.org", "x.org", 400),
                                  ("*", "anything.example", 200)]:
        settings = Settings(home=tmp_path, allowed_hosts=allowed)
        with live(create_app(settings), settings=settings) as url:
            assert httpx.get(f"{url}/healthz", headers={"Host": host}).status_code == status


def jobs_now(base: str) -> int:
    return len(httpx.get(f"{base}/jobs").json())


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}],
                         ids=["foreign-origin", "null-origin", "cross-site", "same-site"])
def test_a_write_from_another_origin_is_refused(base, headers):
    """Tokenless on loopback, a page on another origin created and cancelled jobs (fetch no-cors: 202, 200)."""
    before = jobs_now(base)
    created = httpx.post(f"{base}/jobs", files=TRAIN, headers=headers)
    assert created.status_code == 403 and jobs_now(base) == before
    job = httpx.post(f"{base}/jobs", files=TRAIN).json()["id"]  # curl and earl_client send no Origin: allowed
    assert httpx.post(f"{base}/jobs/{job}/cancel", headers=headers).status_code == 403
    assert httpx.get(f"{base}/jobs/{job}").json()["state"] == "queued"
    assert httpx.post(f"{base}/jobs/{job}/cancel").status_code == 200
    assert httpx.post(f"{base}/predict", json={"model": "m", "queries": []}, headers=headers).status_code == 422


def test_the_servers_own_pages_and_allowed_origins_may_write(base, tmp_path):
    own = {"Origin": base, "Sec-Fetch-Site": "same-origin"}
    assert httpx.post(f"{base}/jobs", files=TRAIN, headers=own).status_code == 202
    settings = Settings(home=tmp_path, allowed_origins="https://console.example.org")
    with live(create_app(settings), settings=settings) as url:
        other = {"Origin": "https://console.example.org", "Sec-Fetch-Site": "cross-site"}
        assert httpx.post(f"{url}/jobs", files=TRAIN, headers={"Origin": "https://console.example.org"}
                          ).status_code == 202
        assert httpx.post(f"{url}/jobs", files=TRAIN, headers=other).status_code == 202


@pytest.mark.parametrize("trusted", ["", "127.0.0.1"])
def test_x_forwarded_for_counts_only_from_a_trusted_proxy(tmp_path, trusted):
    """Per-address quotas were bypassed with X-Forwarded-For (26 'clients', 35 queued jobs): uvicorn believed it
    from 127.0.0.1 by default. Now only from EARL_TRUSTED_PROXIES."""
    settings = Settings(home=tmp_path, max_queued_jobs=1, trusted_proxies=trusted)
    with live(create_app(settings), settings=settings) as url:
        statuses = [httpx.post(f"{url}/jobs", files=TRAIN, headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code
                    for i in range(3)]
    assert statuses == ([202, 202, 202] if trusted else [202, 429, 429])


# ---------------------------------------------------------------- on every response

@pytest.mark.parametrize(("method", "path", "kwargs", "status"), [
    ("GET", "/healthz", {}, 200), ("GET", "/", {}, 200), ("GET", "/console/app.js", {}, 200),
    ("GET", "/models/" + "0" * 32, {}, 404), ("GET", "/openapi.json", {}, 200),
    ("GET", "/jobs", {"headers": {"Host": "evil.example"}}, 400),
    ("POST", "/jobs", {"headers": {"Origin": "http://evil.example"}}, 403),
    ("POST", "/predict", {"content": b"{}" * MB, "headers": {"Content-Type": "application/json"}}, 413),
    ("GET", "/predict", {"params": {"model": "m"}}, 422)])
def test_every_response_carries_the_security_headers(base, method, path, kwargs, status):
    """No Content-Security-Policy, X-Content-Type-Options or frame-ancestors anywhere: the model view with its
    Delete button loaded in a cross-origin iframe."""
    r = httpx.request(method, f"{base}{path}", **kwargs)
    assert r.status_code == status
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp and "script-src" not in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"


def test_the_docs_load_nothing_from_elsewhere(base):
    page = httpx.get(f"{base}/docs")
    assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "http" not in page.text.replace('href="/', "") and "<script>" not in page.text  # no CDN, no inline
    assert 'href="/openapi.json"' in page.text or "/console/swagger/swagger-ui-bundle.js" in page.text
    assert httpx.get(f"{base}/redoc", follow_redirects=True).url.path == "/docs"
    assert httpx.get(f"{base}/docs/oauth2-redirect").status_code == 404  # an inline script, and no OAuth here
