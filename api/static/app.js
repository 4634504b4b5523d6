// The console's router: #/ (models), #/models/ID, #/upload, #/jobs, #/jobs/ID, #/query?model=ID.

import { ApiError, askToken, keyName, onKeyChange } from "./api.js";
import { renderJob, renderJobs } from "./jobs.js";
import { renderModel, renderModels } from "./models.js";
import { renderQuery } from "./query.js";
import { h, note } from "./ui.js";
import { renderUpload } from "./upload.js";

const routes = [
  [/^\/?$/, "models", renderModels],
  [/^\/models\/([\w-]+)$/, "models", renderModel],
  [/^\/upload$/, "upload", renderUpload],
  [/^\/jobs$/, "jobs", renderJobs],
  [/^\/jobs\/([\w-]+)$/, "jobs", renderJob],
  [/^\/query$/, "query", renderQuery],
];

let cleanup = null;

async function show() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const main = document.getElementById("main");
  delete main.dataset.rendered;
  cleanup?.();
  cleanup = null;
  const found = routes.find(([pattern]) => pattern.test(path));
  for (const link of document.querySelectorAll("nav a[data-view]")) {
    link.toggleAttribute("aria-current", found?.[1] === link.dataset.view);
  }
  main.replaceChildren();
  if (!found) {
    main.append(h("h2", {}, "Not found"), note(`No view at #${path}.`, "error"));
    return;
  }
  const [pattern, , render] = found;
  try {
    cleanup = (await render(main, { id: pattern.exec(path)[1], query: new URLSearchParams(query) })) || null;
  } catch (error) {
    const message = error instanceof ApiError ? `${error.status}: ${error.message}` : String(error);
    main.append(note(message, "error"));
  }
  main.dataset.rendered = location.hash; // for tests and scripts: the view is complete
}

window.addEventListener("hashchange", () => {
  show();
  document.getElementById("main").focus({ preventScroll: true });
});

// The header's key button: says what the tab sends (a key's public id, never the key) and changes or forgets it;
// the view is shown again with the new key (another key may be of another tenant, or have other scopes).
const keyButton = document.getElementById("key-button");
let keyChanged = false;
onKeyChange(() => {
  keyChanged = true;
  keyButton.textContent = `API key: ${keyName() ?? "none"}`;
});
keyButton.addEventListener("click", async () => {
  keyChanged = false;
  await askToken();
  if (keyChanged) show();
});
show();
