"""What a web page on another origin can do to a tokenless server on loopback through a visitor's real headless
Chromium (issue 56): send writes (a no-cors fetch needs no CORS answer), frame the console."""

from __future__ import annotations

import shutil

import httpx
import pytest
from live import live
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from api.main import create_app
from api.settings import Settings

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[dev]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium (apt-get install chromium)")

ATTACK = """<!doctype html><script>
window.attack = async (api) => {
  const form = new FormData();
  form.append("train", new Blob(["a\\tr\\tb\\nb\\tr\\tc\\n"]), "train.txt");
  await fetch(api + "/jobs", {method: "POST", mode: "no-cors", body: form});
  const jobs = await fetch(api + "/jobs?state=queued", {mode: "no-cors"});
  return jobs.type;  // opaque: the page cannot read the answer
};
window.cancel = (api, id) => fetch(api + "/jobs/" + id + "/cancel", {method: "POST", mode: "no-cors"});
</script>"""


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    settings = Settings(home=tmp_path_factory.mktemp("home"))  # tokenless, loopback: the default
    with live(create_app(settings), settings=settings) as url:
        yield url


@pytest.fixture(scope="module")
def attacker():
    """A page on another origin (another port of this machine), as any site the visitor opened."""
    app = Starlette(routes=[Route("/", lambda request: HTMLResponse(ATTACK))])
    with live(app) as url:
        yield url


@pytest.fixture(scope="module")
def page(attacker):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        page.goto(attacker)
        yield page
        browser.close()


def test_a_page_on_another_origin_cannot_queue_or_cancel_jobs(page, api):
    assert page.evaluate("(api) => window.attack(api)", api) == "opaque"
    assert httpx.get(f"{api}/jobs").json() == []  # was: the job queued (202)
    job = httpx.post(f"{api}/jobs", files={"train": ("train.txt", b"a\tr\tb\n")}).json()["id"]
    page.evaluate("([api, id]) => window.cancel(api, id)", [api, job])
    assert httpx.get(f"{api}/jobs/{job}").json()["state"] == "queued"  # was: cancelled (200)


FRAMER = """<!doctype html><iframe id="victim" src="{src}" width="800" height="600"></iframe>"""


def csp_violations(page) -> list[str]:
    return [m for m in page.messages if "Content Security Policy" in m or "frame-ancestors" in m]


@pytest.fixture
def watched(page):
    """The page, with the console messages it logs from now on in page.messages (CSP violations are logged)."""
    page.messages = []

    def keep(message):
        page.messages.append(message.text)

    page.on("console", keep)
    yield page
    page.remove_listener("console", keep)


def test_the_console_cannot_be_framed_by_another_origin(watched, api, attacker):
    """The model view with its Delete button loaded in a cross-origin iframe (no frame-ancestors anywhere)."""
    watched.set_content(FRAMER.format(src=f"{api}/#/"))
    watched.wait_for_timeout(1000)
    frame = watched.frame_locator("#victim")
    assert frame.locator("main").count() == 0  # the console never rendered inside the frame
    assert any("frame-ancestors" in m for m in watched.messages), watched.messages


def test_the_console_and_docs_run_under_their_policy(watched, api):
    """No inline script in the console: its views render with script-src 'self' and break no directive."""
    watched.goto(f"{api}/")
    watched.wait_for_selector("main h2:has-text('Models')")
    watched.goto(f"{api}/#/upload")
    watched.wait_for_selector("#upload-form")
    watched.goto(f"{api}/docs")
    watched.wait_for_selector(".swagger-ui .info, a[href='/openapi.json']")
    assert csp_violations(watched) == []
