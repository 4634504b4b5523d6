// Talking to the API: the token (in this tab's memory only), JSON requests, the service's errors, event streams.

let token = null;
let asking = null; // the open token prompt, shared by every request that met a 401

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : describe(detail));
    this.status = status;
    this.detail = detail; // FastAPI's `detail`: a string, a NotFound object or a list of field errors
  }
}

function describe(detail) {
  if (Array.isArray(detail)) return detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
  if (detail && typeof detail === "object") return detail.message || JSON.stringify(detail);
  return String(detail);
}

export function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export function hasToken() {
  return token !== null;
}

/** Show the token dialog; resolves true with a token set, false when the visitor cancels. */
export function askToken(message = "") {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  document.getElementById("token-error").textContent = message;
  input.value = "";
  asking = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      asking = null;
      if (dialog.returnValue === "ok" && input.value) {
        token = input.value;
        resolve(true);
      } else resolve(false);
    }, { once: true });
  });
  dialog.showModal();
  input.focus();
  return asking;
}

async function detailOf(response) {
  const text = await response.text();
  try {
    return JSON.parse(text).detail ?? text;
  } catch {
    return text || response.statusText;
  }
}

/** fetch with the token; a 401 asks for the token and tries again. Throws ApiError for an error status. */
export async function request(path, { method = "GET", body, signal } = {}) {
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(path, { method, body, signal, headers: authHeaders() });
    if (response.status === 401 && attempt < 3) {
      const detail = await detailOf(response);
      if (await askToken(attempt ? "That token was refused." : "")) continue;
      throw new ApiError(401, detail);
    }
    if (!response.ok) throw new ApiError(response.status, await detailOf(response));
    return response;
  }
}

export async function getJSON(path, options) {
  const response = await request(path, options);
  return response.status === 204 ? null : response.json();
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Follow a Server-Sent Event stream with one connection at a time, read through fetch so that the token travels
 * in a header (EventSource cannot send one). Reconnects with exponential backoff (1 s doubling to 30 s) after a
 * dropped connection or a server-closed stream, until `close()` or an `end` event. `onEvent(name, data)`,
 * `onStatus("live" | "reconnecting in N s" | "closed" | error message)`.
 */
export function followEvents(path, { onEvent, onStatus }) {
  let closed = false;
  let controller = null;
  let delay = 1000;
  (async () => {
    while (!closed) {
      controller = new AbortController();
      let ended = false;
      try {
        const response = await request(path, { signal: controller.signal });
        onStatus("live");
        delay = 1000;
        ended = await readEvents(response.body, (name, data) => {
          onEvent(name, data);
          return name === "end";
        });
      } catch (error) {
        if (closed) return;
        if (error instanceof ApiError && error.status < 500 && error.status !== 429) {
          onStatus(error.message);
          return;
        }
      }
      if (ended || closed) break;
      onStatus(`reconnecting in ${delay / 1000} s`);
      await sleep(delay);
      delay = Math.min(delay * 2, 30000);
    }
    onStatus("closed");
  })();
  return { close() { closed = true; controller?.abort(); } };
}

/** Parse an event stream; `handle(name, data)` returns true to stop. Returns whether it stopped that way. */
async function readEvents(body, handle) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length && handle(name, JSON.parse(data.join("\n")))) {
        reader.cancel();
        return true;
      }
    }
  }
}
