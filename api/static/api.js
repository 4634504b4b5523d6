// Talking to the API: the key or token (in this tab's memory only), JSON requests, the service's errors, event
// streams.

let token = null;
let asking = null; // the open key prompt, shared by every request that met a 401
const keyListeners = [];

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

/** What the tab sends, as it may be shown: null (nothing), "key earl_<id>" (a key's public id), or "token". */
export function keyName() {
  if (token === null) return null;
  const key = /^earl_([0-9a-f]{12})_/.exec(token);
  return key ? `key earl_${key[1]}` : "token";
}

/** Call `listener()` whenever the key or token is set or forgotten. */
export function onKeyChange(listener) {
  keyListeners.push(listener);
}

function setToken(value) {
  token = value;
  for (const listener of keyListeners) listener();
}

/**
 * Show the key dialog; resolves true with a key set, false when the visitor cancels or forgets the key ("Forget
 * key" sends nothing from then on).
 */
export function askToken(message = "") {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  document.getElementById("token-error").textContent = message;
  input.value = "";
  dialog.returnValue = ""; // Escape closes without setting it: the last close's value must not count again
  asking = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      asking = null;
      if (dialog.returnValue === "ok" && input.value) {
        setToken(input.value.trim());
        resolve(true);
      } else {
        if (dialog.returnValue === "forget") setToken(null);
        resolve(false);
      }
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

/**
 * fetch with the key; a 401 asks for one and tries again. Throws ApiError for an error status; a 403 for a scope
 * the key lacks keeps the server's reason and says where to use another key.
 */
export async function request(path, { method = "GET", body, signal } = {}) {
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(path, { method, body, signal, headers: authHeaders() });
    if (response.status === 401 && attempt < 3) {
      const detail = await detailOf(response);
      if (await askToken(attempt ? "That key was refused." : "")) continue;
      throw new ApiError(401, detail);
    }
    if (response.status === 403 && token !== null) throw new ApiError(403, scopeHint(await detailOf(response)));
    if (!response.ok) throw new ApiError(response.status, await detailOf(response));
    return response;
  }
}

/** A 403 for a key without a scope says which scope is missing; the console adds where to use another key. */
function scopeHint(detail) {
  return typeof detail === "string" && detail.includes("scope")
    ? `${detail} (or use such a key: the "API key" button at the top)` : detail;
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
