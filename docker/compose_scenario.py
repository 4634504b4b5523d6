"""make compose-test, second half: run the compose stack on 127.0.0.1 and check it end to end over HTTP.

docker/compose_test.sh prepares docker, the base image, the wheelhouse and the images, then runs this with the
compose command to use; this starts the stack, trains, predicts, kills and restarts the worker mid-job, restarts the
whole stack, and writes what it saw (with the setup's timings and image sizes) to bench/results/compose_test.*.
Standard library only: it runs on a machine without the project's venv. Every wait is bounded; the first failed
check raises, and the shell script's trap tears the stack down.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "earl_service" / "demo_data" / "codex-s"
WORKER = "worker-cpu"
# Tiny: the point is the path through the stack, not the model.
QUICK_JOB = {"dim": "16", "steps": "40", "batch_size": "256", "negatives": "16", "eval_every": "0"}
# Long enough to be killed mid-run after a few checkpoints.
LONG_JOB = {"dim": "32", "steps": "1500", "batch_size": "512", "negatives": "64", "eval_every": "0"}
CHECKPOINT_EVERY = 100  # TrainConfig's default: the API leaves it to the service
KILL_AFTER_STEP = 250  # past two checkpoints, so a resume has something to resume from


class CheckFailed(RuntimeError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def log(message: str) -> None:
    print(f"[compose-test {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Api:
    """The API over HTTP with the bearer token; JSON in and out."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    def request(self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
                timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={"Authorization": f"Bearer {self.token}", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        status, _, body = self.request(method, path, **kwargs)
        check(200 <= status < 300, f"{method} {path}: HTTP {status} {body[:300]!r}")
        return json.loads(body)

    def submit(self, params: dict[str, str]) -> str:
        files = {"train": DATA / "train.txt", "valid": DATA / "valid.txt"}
        body, content_type = multipart(params, files)
        return self.json("POST", "/jobs", body=body, headers={"Content-Type": content_type})["id"]


def multipart(fields: dict[str, str], files: dict[str, Path]) -> tuple[bytes, str]:
    """A multipart/form-data body (the job form: option fields and triple files)."""
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    for name, path in files.items():
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{path.name}"\r\n'
                "Content-Type: text/plain\r\n\r\n")
        parts.append(head.encode() + path.read_bytes() + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def wait_for(what: str, probe, *, timeout: float, every: float = 1.0) -> Any:
    """Call probe() until it returns something truthy; raise after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except (OSError, CheckFailed):  # not up yet: connection refused, reset, HTTP error
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class Stack:
    """docker-compose with the project's and the test's files, and docker for the containers it made."""

    def __init__(self, compose: list[str]) -> None:
        self.compose = compose

    def run(self, *args: str, timeout: float = 300.0) -> str:
        return sh([*self.compose, *args], timeout=timeout)

    def up(self) -> None:
        self.run("up", "-d", "--no-build", "api", WORKER)

    def container(self, service: str) -> str:
        ids = self.run("ps", "-q", service).split()
        check(len(ids) == 1, f"expected one {service} container, found {ids}")
        return ids[0]


def sh(argv: list[str], *, timeout: float = 300.0) -> str:
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    check(run.returncode == 0, f"{shlex.join(argv)} exited {run.returncode}: {run.stderr[-2000:]}")
    return run.stdout


def wait_job(api: Api, job_id: str, *, timeout: float, until=None) -> dict[str, Any]:
    """Poll a job until it succeeds (or `until(job)` holds); a failed or cancelled job fails the test."""

    def probe():
        job = api.json("GET", f"/jobs/{job_id}")
        check(job["state"] not in ("failed", "cancelled"), f"job {job_id} {job['state']}: {job.get('error')}")
        done = until(job) if until else job["state"] == "succeeded"
        return job if done else None

    return wait_for(f"job {job_id}", probe, timeout=timeout, every=0.5)


def bundle_digest(data: bytes) -> tuple[str, str]:
    """(sha256 of the payload after the safetensors header, the payload_sha256 the header records)."""
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    return hashlib.sha256(data[8 + header_len :]).hexdigest(), header["__metadata__"]["payload_sha256"]


def first_train_query() -> tuple[str, str]:
    head, relation, _ = (DATA / "train.txt").read_text().split("\n", 1)[0].split("\t")
    return head, relation


def check_model(api: Api, model_id: str) -> dict[str, Any]:
    """Predict from the model, download its bundle and check the checksum three ways."""
    head, relation = first_train_query()
    answers = api.json("GET", f"/predict?model={model_id}&head={head}&relation={relation}&k=5")
    check(len(answers["predictions"]) == 5, f"predict returned {answers}")
    model = api.json("GET", f"/models/{model_id}")
    status, headers, data = api.request("GET", f"/models/{model_id}/bundle", timeout=60)
    check(status == 200, f"bundle download: HTTP {status}")
    payload, recorded = bundle_digest(data)
    etag = headers.get("ETag", headers.get("etag", "")).strip('"')
    check(payload == recorded == etag == model["sha256"],
          f"bundle sha256 mismatch: payload {payload}, header {recorded}, ETag {etag}, model {model['sha256']}")
    return {"model": model_id, "bundle_bytes": len(data), "sha256": payload, "top1": answers["predictions"][0]}


def quick_job(api: Api) -> dict[str, Any]:
    started = time.monotonic()
    job_id = api.submit(QUICK_JOB)
    log(f"quick job {job_id} queued {QUICK_JOB}")
    job = wait_job(api, job_id, timeout=600)
    result = {"job": job_id, "seconds": round(time.monotonic() - started, 1), **check_model(api, job["model_id"])}
    log(f"quick job succeeded in {result['seconds']} s; predict and bundle sha256 {result['sha256'][:16]}... ok")
    return result


def kill_and_resume(api: Api, stack: Stack) -> dict[str, Any]:
    """docker kill the worker mid-job, start it again, and see the job resume from its checkpoint and succeed."""
    started = time.monotonic()
    job_id = api.submit(LONG_JOB)
    log(f"long job {job_id} queued {LONG_JOB}")
    running = wait_job(api, job_id, timeout=600,
                       until=lambda job: (job.get("progress") or {}).get("step", 0) >= KILL_AFTER_STEP)
    worker = stack.container(WORKER)
    sh(["docker", "kill", worker])
    step_at_kill = running["progress"]["step"]
    log(f"killed the worker ({worker[:12]}) at step >= {step_at_kill}")
    state = json.loads(sh(["docker", "inspect", "-f", "{{json .State}}", worker]))
    restarted_by_policy = state["Running"]
    if not restarted_by_policy:
        sh(["docker", "start", worker])
    job = wait_job(api, job_id, timeout=900)
    resumed_from = job["progress"].get("resumed_from")
    logs = subprocess.run(["docker", "logs", worker], capture_output=True, text=True, timeout=60, check=False)
    lines = [line for line in (logs.stdout + logs.stderr).splitlines() if job_id in line and "resum" in line]
    check(job["attempts"] == 2, f"job {job_id} took {job['attempts']} attempts, expected 2")
    check(bool(resumed_from) and resumed_from % CHECKPOINT_EVERY == 0,
          f"job {job_id} did not resume from a checkpoint: resumed_from={resumed_from}")
    check(bool(lines), "the restarted worker's log has no resume line for the job")
    result = {"job": job_id, "seconds": round(time.monotonic() - started, 1), "step_seen_before_kill": step_at_kill,
              "resumed_from": resumed_from, "attempts": job["attempts"], "restarted_by_policy": restarted_by_policy,
              "worker_log": lines, **check_model(api, job["model_id"])}
    log(f"resumed from step {resumed_from} (attempt 2) and succeeded: {lines[-1].strip()}")
    return result


def restart_stack(api: Api, stack: Stack, models: list[str]) -> dict[str, Any]:
    """docker-compose down (volumes kept) and up: the models are still listed, served and intact."""
    started = time.monotonic()
    stack.run("down")
    stack.up()
    wait_for("readyz after restart", lambda: api.request("GET", "/readyz")[0] == 200, timeout=180)
    listed = {m["id"] for m in api.json("GET", "/models")}
    check(set(models) <= listed, f"after down/up the models {models} are not all listed: {listed}")
    checks = [check_model(api, model_id) for model_id in models]
    log(f"down and up again: {len(models)} models still served, bundles intact")
    return {"seconds": round(time.monotonic() - started, 1), "models": checks}


def api_healthy(stack: Stack) -> dict[str, Any]:
    """The image's HEALTHCHECK, as docker runs it, reports healthy."""
    api = stack.container("api")

    def probe():
        return json.loads(sh(["docker", "inspect", "-f", "{{json .State.Health}}", api]))["Status"] == "healthy"

    wait_for("the API container's health check", probe, timeout=120, every=2)
    networks = {service: sorted(json.loads(sh(["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}",
                                               stack.container(service)])))
                for service in ("redis", "api", WORKER)}
    check(all(names == ["host"] for names in networks.values()), f"a container is off the host network: {networks}")
    log("the API container's health check reports healthy; every container is on the host network")
    return {"status": "healthy", "networks": networks}


def worker_image_checks(image: str) -> dict[str, Any]:
    """The worker image loads its prebuilt kernel without a compiler, and holds one FAISS build."""
    script = ("import importlib.metadata as m, os, time; t = time.monotonic(); from earl_service.model import kernels; "
              "kernels.configure(march=os.environ['EARL_KERNEL_MARCH']); ok = kernels.extension_available(); "
              "faiss = sorted(d.metadata['Name'] for d in m.distributions() if 'faiss' in d.metadata['Name']); "
              "import shutil; print(ok, round(time.monotonic() - t, 2), ','.join(faiss), "
              "[c for c in ('cc', 'gcc', 'g++', 'c++') if shutil.which(c)])")
    out = sh(["docker", "run", "--rm", "--network", "host", image, "python", "-c", script], timeout=120).split(" ", 3)
    loaded, seconds, faiss, compilers = out[0] == "True", float(out[1]), out[2].split(","), out[3].strip()
    check(loaded, f"the worker image's kernel does not load: {out}")
    check(faiss == ["faiss-cpu"], f"the CPU worker image holds {faiss}")
    check(compilers == "[]", f"the worker's runtime image has a compiler: {compilers}")
    log(f"worker image: kernel loads in {seconds} s without a compiler; FAISS: {faiss}")
    return {"kernel_loaded": loaded, "kernel_load_seconds": seconds, "faiss": faiss, "compilers": []}


def git_commit() -> str:
    run = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=False)
    return run.stdout.strip() or "unknown"


def write_results(results: dict[str, Any], out: Path) -> None:
    """JSON and a short markdown table of what ran, how long, and how big."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    setup, s = results["setup"], results["scenario"]
    rows = [f"| {name} | {seconds:.0f} s |" for name, seconds in setup["seconds"].items()]
    sizes = [f"| `{name}` | {size / 1e6:.0f} MB |" for name, size in setup["image_bytes"].items()]
    resume = s["kill_and_resume"]
    text = "\n".join([
        "# make compose-test", "",
        f"Commit {results['commit']} on {results['machine']}, CPU affinity {results['cpus']} "
        f"({len(results['cpus'])} core(s)); `{results['command']}`; passed in {results['total_seconds']:.0f} s.", "",
        "| step | time |", "|---|---|", *rows,
        *[f"| scenario: {name} | {s[name]['seconds']:.0f} s |" for name in ("quick_job", "kill_and_resume", "restart")],
        "", "| image | size |", "|---|---|", *sizes, "",
        f"Kill and resume: the worker was killed (`docker kill`) once the job reported step {resume['step_seen_before_kill']};"
        f" started again ({'by its restart policy' if resume['restarted_by_policy'] else 'docker start'}), it resumed"
        f" from the checkpoint at step {resume['resumed_from']} (attempt "
        f"{resume['attempts']}) and the job succeeded. Worker log:", "",
        *[f"    {line.strip()}" for line in resume["worker_log"]], "",
        f"Worker image: kernel prebuilt, loads in {s['worker_image']['kernel_load_seconds']} s with no compiler; "
        f"FAISS {', '.join(s['worker_image']['faiss'])}. API health check: {s['health']['status']}.", ""])
    out.with_suffix(".md").write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose", required=True, help="the compose command, e.g. 'docker-compose -p x -f a -f b'")
    parser.add_argument("--api", required=True, help="the API's URL on 127.0.0.1")
    parser.add_argument("--worker-image", required=True)
    parser.add_argument("--setup", type=Path, required=True, help="JSON from compose_test.sh: timings, image sizes")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "compose_test")
    a = parser.parse_args()
    started = time.monotonic()
    api, stack = Api(a.api, os.environ["EARL_API_TOKEN"]), Stack(shlex.split(a.compose))
    scenario: dict[str, Any] = {"worker_image": worker_image_checks(a.worker_image)}
    t = time.monotonic()
    stack.up()
    wait_for("readyz", lambda: api.request("GET", "/readyz")[0] == 200, timeout=180)
    scenario["up"] = {"seconds": round(time.monotonic() - t, 1)}
    log(f"stack up, /readyz 200 after {scenario['up']['seconds']} s")
    scenario["quick_job"] = quick_job(api)
    scenario["kill_and_resume"] = kill_and_resume(api, stack)
    scenario["restart"] = restart_stack(api, stack, [scenario["quick_job"]["model"],
                                                     scenario["kill_and_resume"]["model"]])
    scenario["health"] = api_healthy(stack)
    setup = json.loads(a.setup.read_text())
    setup["seconds"]["scenario"] = round(time.monotonic() - started, 1)
    results = {"commit": git_commit(), "machine": f"{platform.node()} {platform.machine()}",
               "cpus": sorted(os.sched_getaffinity(0)), "command": "make compose-test",
               "total_seconds": sum(setup["seconds"].values()), "setup": setup, "scenario": scenario}
    write_results(results, a.out)
    log(f"passed; results in {a.out.relative_to(REPO)}.md")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as exc:
        log(f"FAILED: {exc}")
        sys.exit(1)
