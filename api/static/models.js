// Models: the registered models (the first view), and one model: figures, report, download, extend, delete.

import { ApiError, getJSON, request } from "./api.js";
import { bytes, count, h, metric, note, shortId, when } from "./ui.js";

export async function renderModels(main) {
  main.append(h("h2", {}, "Models"));
  const models = await getJSON("/models");
  main.append(h("p", { class: "lead" },
    "Bring a graph (triple files), get a compact model: ", h("a", { href: "#/upload", class: "button primary" },
      "Upload triples"), " or follow the ", h("a", { href: "#/jobs" }, "jobs"), " under way."));
  if (!models.length) {
    main.append(note("No model is registered yet: upload a graph to train one."));
    return;
  }
  main.append(h("div", { class: "scroll" }, h("table", { id: "models-table" },
    h("caption", {}, `${models.length} registered model${models.length === 1 ? "" : "s"}`),
    h("thead", {}, h("tr", {}, ["model", "bytes", "parameters", "precision", "entities", "relations", "created", ""]
      .map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, models.map((m) => h("tr", { "data-model": m.id },
      h("td", {}, h("a", { href: `#/models/${m.id}`, title: m.id }, shortId(m.id))),
      h("td", { class: "num" }, bytes(m.bytes)), h("td", { class: "num" }, count(m.parameters)),
      h("td", {}, m.precision), h("td", { class: "num" }, count(m.entities)),
      h("td", { class: "num" }, count(m.relations)), h("td", {}, when(m.created)),
      h("td", {}, h("a", { href: `#/query?model=${m.id}` }, "query"))))))));
}

function figures(m) {
  const imported = m.metrics?.imported;
  const coded = m.metrics?.compress?.original; // a compress job over a registered model: what it was coded from
  const [split, scores] = ["test", "valid"].map((s) => [s, m.metrics?.[s]]).find(([, v]) => v) || ["test", {}];
  const rows = [
    ["id", h("code", {}, m.id)], ["version", m.version], ["bytes", `${bytes(m.bytes)} (${count(m.bytes)} B)`],
    ["parameters", count(m.parameters)], ["precision", m.precision], ["entities", count(m.entities)],
    ["relations", count(m.relations)], ["model", m.config?.model ?? "–"], ["dim", m.config?.dim ?? "–"],
    [`${split} MRR`, metric(scores.mrr)], [`${split} Hits@10`, metric(scores.hits_at_10)],
    ["sha256 (tensor payload)", h("code", { id: "model-sha256", class: "wrap" }, m.sha256)],
    ["trained by job", m.job_id ? h("a", { href: `#/jobs/${m.job_id}` }, shortId(m.job_id)) : "–"],
    ...(imported ? [["imported from", `${imported.library || imported.format}${imported["class"]
      ? ` ${imported["class"]}` : ""} (scorer ${imported.scorer})`]] : []),
    ...(coded ? [["compressed", `${m.metrics.compress.precision} of a ${coded.precision} model of ${bytes(coded.bytes)}: `
      + `valid MRR ${metric(m.metrics.compress.valid?.mrr)} against ${metric(coded.mrr)}`]] : []),
    ["created", when(m.created)],
  ];
  return h("dl", { class: "figures" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export async function renderModel(main, { id }) {
  const m = await getJSON(`/models/${id}`);
  main.append(h("h2", {}, `Model ${shortId(id)}`), figures(m),
    h("p", {}, h("a", { class: "button", href: `#/query?model=${id}` }, "Query this model")),
    downloadSection(m), m.config?.model === "earl" ? extendSection(m) : compressSection(m),
    await reportSection(id, m), deleteSection(m));
}

const GRAPH_FILES = ["train", "valid"]; // a compress job's optional graph: both or neither (the API says so)

/** A compress job over this model (POST /jobs with source_model): its sizes under a byte budget, no training. */
function compressSection(m) {
  const field = (name, label, attrs) => h("div", { class: "field" }, h("label", { for: `compress-${name}` }, label),
    h("input", { id: `compress-${name}`, name, "aria-describedby": "compress-error", ...attrs }));
  const error = h("p", { id: "compress-error", class: "field-error", role: "alert" });
  const form = h("form", { id: "compress-form", onsubmit: async (event) => {
    event.preventDefault();
    error.textContent = "";
    const body = new FormData(form);
    body.append("source_model", m.id);
    for (const name of ["time_limit", "retrain_minutes"]) if (!body.get(name)) body.delete(name);
    for (const split of GRAPH_FILES) if (!body.get(split)?.size) body.delete(split); // no file chosen
    try {
      const job = await getJSON("/jobs", { method: "POST", body });
      location.hash = `#/jobs/${job.id}`;
    } catch (e) {
      error.textContent = e.message;
    }
  } }, h("div", { class: "grid" }, field("max_bytes", "Max bytes (e.g. 2MB)", { type: "text", required: true }),
    field("time_limit", "Minutes (default 10)", { type: "number", min: 0, step: "any" }),
    ...GRAPH_FILES.map((split) => field(split, `${split} triples (optional)`, { type: "file" })),
    field("retrain_minutes", "Also train at the budget, minutes (with triples)", { type: "number", min: 0,
      step: "any" })), error,
  h("button", { type: "submit" }, "Compress"));
  return h("section", { "aria-labelledby": "compress-title" }, h("h3", { id: "compress-title" }, "Compress"),
    h("p", {}, `Searches this model's sizes (fp32, fp16, int8, pq) and publishes the pick as a new model with its `
      + "report; this one stays. Without triples the largest size that fits wins; with train and valid files over "
      + "the model's names each size is scored by filtered MRR on valid, pq codebooks are fine-tuned on train, and "
      + "the most accurate wins. With minutes to train as well, a model trained at the budget on those triples "
      + "(a new model over their entities) is one more candidate."), form);
}

/** The bytes of a safetensors file's tensor payload: what the model's sha256 covers (its header names it). */
async function payloadSha256(buffer) {
  if (!crypto.subtle) return null; // only in a secure context (https, localhost, 127.0.0.1)
  const headerLength = Number(new DataView(buffer).getBigUint64(0, true));
  const digest = await crypto.subtle.digest("SHA-256", buffer.slice(8 + headerLength));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function downloadSection(m) {
  const status = h("p", { id: "download-status", role: "status" });
  const button = h("button", { type: "button", class: "primary", onclick: async () => {
    button.disabled = true;
    status.textContent = "downloading…";
    try {
      const response = await request(`/models/${m.id}/bundle`);
      const etag = (response.headers.get("etag") || "").replaceAll('"', "");
      const buffer = await response.arrayBuffer();
      const digest = await payloadSha256(buffer);
      const link = h("a", { href: URL.createObjectURL(new Blob([buffer])), download: `${m.id}.safetensors` });
      document.body.append(link);
      link.click();
      link.remove();
      status.textContent = digest === null ? `downloaded ${bytes(buffer.byteLength)}; sha256 ${etag} (not checked: `
        + "the browser computes digests only on https or localhost)"
        : digest === m.sha256 ? `downloaded ${bytes(buffer.byteLength)}; sha256 verified: ${digest}`
          : `downloaded, but its sha256 ${digest} is not the model's ${m.sha256}`;
      status.className = digest === null || digest === m.sha256 ? "note ok" : "note error";
    } catch (error) {
      status.textContent = error.message;
      status.className = "note error";
    } finally {
      button.disabled = false;
    }
  } }, "Download bundle");
  return h("section", { "aria-labelledby": "download-title" }, h("h3", { id: "download-title" }, "Download"),
    h("p", {}, `One safetensors file (${bytes(m.bytes)}): weights, graph, vocabularies, config; `,
      h("code", {}, "earl_service.device.reader.load()"), " reads it on a device."), button, status);
}

function extendSection(m) {
  const input = h("input", { type: "file", id: "extend-file", name: "triples", required: true,
    "aria-describedby": "extend-error" });
  const error = h("p", { id: "extend-error", class: "field-error", role: "alert" });
  const done = h("p", { role: "status" });
  const form = h("form", { onsubmit: async (event) => {
    event.preventDefault();
    error.textContent = done.textContent = "";
    const body = new FormData();
    body.append("triples", input.files[0]);
    try {
      const next = await getJSON(`/models/${m.id}/triples`, { method: "POST", body });
      done.textContent = `version ${next.version}: ${count(next.entities)} entities, sha256 ${next.sha256}`;
    } catch (e) {
      error.textContent = e.message;
    }
  } }, h("label", { for: "extend-file" }, "Triple file (head, relation, tail; new entities allowed)"), input, error,
  h("button", { type: "submit" }, "Extend"), done);
  return h("section", { "aria-labelledby": "extend-title" }, h("h3", { id: "extend-title" }, "Extend with new triples"),
    h("p", {}, "Adds triples to the model's graph without retraining; the result is the model's next version."), form);
}

async function reportSection(id, m) {
  const section = h("section", { "aria-labelledby": "report-title" }, h("h3", { id: "report-title" }, "Compress report"));
  let report;
  try {
    report = await (await request(`/models/${id}/report?format=md`)).text();
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      section.append(h("p", {}, `None: this model was ${m.metrics?.imported ? "imported" : "trained directly"}, `
        + "not picked by a compress job (max_bytes)."));
      return section;
    }
    throw error;
  }
  const plot = h("img", { id: "frontier", alt: "Validation metric against bundle bytes for every candidate, with "
    + "the frontier, the budget and the pick", width: 640 });
  request(`/models/${id}/frontier.png`).then(async (r) => { plot.src = URL.createObjectURL(await r.blob()); })
    .catch(() => plot.replaceWith(note("No frontier plot.")));
  section.append(plot, h("details", {}, h("summary", {}, "Report (markdown)"), h("pre", { class: "report" }, report)));
  return section;
}

function deleteSection(m) {
  const status = h("p", { role: "status" });
  const button = h("button", { type: "button", class: "danger", onclick: async () => {
    if (!confirm(`Delete model ${m.id}, its versions, report, run and uploads? This cannot be undone.`)) return;
    try {
      await request(`/models/${m.id}`, { method: "DELETE" });
      location.hash = "#/";
    } catch (error) {
      status.textContent = error.message;
      status.className = "note error";
    }
  } }, "Delete model");
  return h("section", { "aria-labelledby": "delete-title" }, h("h3", { id: "delete-title" }, "Delete"), button, status);
}
