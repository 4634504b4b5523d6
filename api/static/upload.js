// Upload: triple files (drag and drop or pick), optional label files, the job's options with the API's defaults.
// Fields come from the API's own schema (/openapi.json), so a new option or file field shows up here unchanged;
// the precisions offered come from GET /precisions, so a newly registered one does too.

import { ApiError, getJSON } from "./api.js";
import { h, note } from "./ui.js";

const MAIN_OPTIONS = ["model", "dim", "max_bytes", "time_limit", "steps", "precision"];
const HELP = {
  model: "earl: entity-agnostic (small, extendable); rotate: one vector per entity",
  dim: "embedding dimension",
  max_bytes: "compress job: the most bytes the bundle may take, e.g. 2MB or 1.5MiB; needs a time limit and a valid file",
  time_limit: "minutes; 0 for none",
  steps: "training steps",
};
const PRECISION_FIELDS = {
  precision: "of the exported bundle", precisions: "compress job: comma-separated, each from",
};
const FILE_HELP = {
  train: "required: one head, relation, tail per line (.txt/.tsv/.csv, optionally .gz)",
  valid: "optional: picks the best checkpoint; needed for a compress job",
  test: "optional: final test metrics",
  entity_labels: "optional: id<TAB>label lines (entities.tsv) or a JSON object",
  relation_labels: "optional: id<TAB>label lines or JSON {\"P27\": \"country of citizenship\"}",
};

let schemaCache = null;
let precisionsCache = null;

async function jobSchema() {
  schemaCache ??= getJSON("/openapi.json").then((api) => {
    const bodyRef = api.paths["/jobs"].post.requestBody.content["multipart/form-data"].schema.$ref;
    const body = api.components.schemas[bodyRef.split("/").pop()];
    const options = api.components.schemas.JobForm.properties;
    // source_model (a job over a registered model, without files) and its retrain_minutes are offered by the
    // model view, not here: a graph's upload needs its train file, though the API lets that other job go without one.
    const modelJobOnly = ["source_model", "retrain_minutes"];
    for (const name of modelJobOnly) delete options[name];
    return { files: Object.keys(body.properties).filter((k) => !(k in options) && !modelJobOnly.includes(k)),
      required: [...new Set(["train", ...(body.required || [])])], options };
  });
  return schemaCache;
}

/** The registered precisions ([{name, syntax, summary, codes_tables}]); none when the list cannot be read. */
async function precisionList() {
  precisionsCache ??= getJSON("/precisions").catch(() => []);
  return precisionsCache;
}

/** Help for a precision field from the registered precisions: "of the exported bundle: fp32, fp16, int8, pq[:M]". */
function precisionHelp(name, known) {
  return known.length ? `${PRECISION_FIELDS[name]}: ${known.map((p) => p.syntax).join(", ")}` : PRECISION_FIELDS[name];
}

/** Which file field a dropped file belongs to, by its name. */
function fieldFor(name, files) {
  const lower = name.toLowerCase();
  const guesses = [[/entit/, "entity_labels"], [/relation.*\.(json|tsv)/, "relation_labels"], [/valid/, "valid"],
    [/test/, "test"], [/train/, "train"]];
  for (const [pattern, field] of guesses) if (pattern.test(lower) && files.includes(field)) return field;
  return files[0];
}

function enumOf(spec) {
  return spec.enum || spec.anyOf?.find((s) => s.enum)?.enum;
}

function optionInput(name, spec, known) {
  const id = `opt-${name}`;
  const type = spec.type || spec.anyOf?.find((s) => s.type !== "null")?.type;
  const common = { id, name, "aria-describedby": `${id}-help ${id}-error` };
  let input;
  const choices = enumOf(spec);
  if (choices) {
    input = h("select", common, spec.default === undefined || spec.default === null ? h("option", { value: "" }, "default") : null,
      choices.map((c) => h("option", { value: c, selected: c === spec.default }, c)));
  } else if (type === "boolean") {
    input = h("input", { ...common, type: "checkbox", checked: spec.default === true });
  } else if (type === "integer" || type === "number") {
    input = h("input", { ...common, type: "number", value: spec.default ?? "", step: type === "integer" ? 1 : "any",
      min: spec.minimum ?? null, max: spec.maximum ?? null });
  } else {
    input = h("input", { ...common, type: "text", value: spec.default ?? "", placeholder: spec.default ?? "",
      list: name in PRECISION_FIELDS && known.length ? "precision-names" : null });
  }
  input.dataset.default = spec.default === undefined || spec.default === null ? "" : String(spec.default);
  return h("div", { class: `field ${type === "boolean" ? "check" : ""}` },
    h("label", { for: id }, name.replaceAll("_", " ")), input,
    h("small", { id: `${id}-help` },
      name in PRECISION_FIELDS ? precisionHelp(name, known) : HELP[name] || spec.description || ""),
    h("p", { class: "field-error", id: `${id}-error`, role: "alert" }));
}

function valueOf(input) {
  return input.type === "checkbox" ? String(input.checked) : input.value.trim();
}

export async function renderUpload(main) {
  const [schema, known] = await Promise.all([jobSchema(), precisionList()]);
  const chosen = {};
  const fileRows = schema.files.map((field) => {
    const id = `file-${field}`;
    const input = h("input", { type: "file", id, name: field, "aria-describedby": `${id}-help ${id}-error`,
      accept: field.includes("labels") ? ".json,.tsv,.txt" : null,
      onchange: () => { chosen[field] = input.files[0]; shown(); } });
    return h("div", { class: "field file" },
      h("label", { for: id }, field.replaceAll("_", " "), schema.required.includes(field) ? " (required)" : ""),
      input, h("small", { id: `${id}-help` }, FILE_HELP[field] || "optional"),
      h("span", { class: "chosen", id: `${id}-name` }),
      h("p", { class: "field-error", id: `${id}-error`, role: "alert" }));
  });
  const shown = () => {
    for (const field of schema.files) document.getElementById(`file-${field}-name`).textContent =
      chosen[field] ? `${chosen[field].name} (${chosen[field].size.toLocaleString("en")} bytes)` : "";
  };
  const drop = h("div", { class: "drop", id: "drop-zone", tabindex: "0", role: "group",
    "aria-label": "Drop triple and label files here; each goes to the field its name suggests",
    ondragover: (e) => { e.preventDefault(); drop.classList.add("over"); },
    ondragleave: () => drop.classList.remove("over"),
    ondrop: (e) => {
      e.preventDefault();
      drop.classList.remove("over");
      for (const file of e.dataTransfer.files) chosen[fieldFor(file.name, schema.files)] = file;
      shown();
    } }, h("p", {}, "Drop files here (train.txt, valid.txt, test.txt, relations.en.json, …) or choose each below."));
  const uploadError = h("p", { class: "field-error", id: "upload-error", role: "alert" });
  const formError = h("div", { id: "form-error" });
  const options = Object.entries(schema.options);
  const form = h("form", { id: "upload-form", novalidate: true, onsubmit: (e) => submit(e) },
    h("fieldset", {}, h("legend", {}, "Files"), drop, uploadError, fileRows),
    h("fieldset", {}, h("legend", {}, "Options"), h("div", { class: "grid" },
      options.filter(([n]) => MAIN_OPTIONS.includes(n)).map(([n, s]) => optionInput(n, s, known)))),
    h("details", {}, h("summary", {}, "More options"), h("div", { class: "grid" },
      options.filter(([n]) => !MAIN_OPTIONS.includes(n)).map(([n, s]) => optionInput(n, s, known)))),
    h("datalist", { id: "precision-names" }, known.map((p) => h("option", { value: p.name }, p.summary))),
    formError, h("button", { type: "submit", class: "primary", id: "submit-job" }, "Start job"));
  main.append(h("h2", {}, "Upload a graph"), h("p", {}, "Train a model on your triples, or give a byte budget "
    + "(max bytes) and minutes to search for the most accurate bundle that fits."), form);

  function clearErrors() {
    for (const slot of form.querySelectorAll(".field-error")) slot.textContent = "";
    formError.replaceChildren();
  }

  /** Put the server's reason next to the field or file it names; elsewhere at the form's foot. */
  function showError(error) {
    const slot = (id) => document.getElementById(id);
    if (error.status === 413) return void (uploadError.textContent = error.message);
    if (Array.isArray(error.detail)) {
      for (const d of error.detail) {
        const field = d.loc?.[d.loc.length - 1];
        const target = slot(`opt-${field}-error`) || slot(`file-${field}-error`);
        if (target) target.textContent = d.msg;
        else formError.append(note(`${field}: ${d.msg}`, "error"));
      }
      return;
    }
    const message = error.message;
    const file = schema.files.find((f) => chosen[f] && message.startsWith(chosen[f].name))
      || schema.files.find((f) => message.startsWith(`${f}:`) || message.startsWith(`${f} `));
    const option = options.map(([n]) => n).find((n) => message.startsWith(n) || message.includes(` ${n} `));
    const target = file ? slot(`file-${file}-error`) : option ? slot(`opt-${option}-error`) : null;
    if (target) target.textContent = message;
    else formError.append(note(`${error.status}: ${message}`, "error"));
  }

  async function submit(event) {
    event.preventDefault();
    clearErrors();
    if (!chosen.train) {
      document.getElementById("file-train-error").textContent = "choose or drop a train file";
      document.getElementById("file-train").focus();
      return;
    }
    const body = new FormData();
    for (const [field, file] of Object.entries(chosen)) if (file) body.append(field, file, file.name);
    for (const [name] of options) {
      const input = document.getElementById(`opt-${name}`);
      const value = valueOf(input);
      if (value !== "" && value !== input.dataset.default) body.append(name, value);
    }
    const button = document.getElementById("submit-job");
    button.disabled = true;
    button.textContent = "Uploading…";
    try {
      const job = await getJSON("/jobs", { method: "POST", body });
      location.hash = `#/jobs/${job.id}`;
    } catch (error) {
      if (error instanceof ApiError) showError(error);
      else formError.append(note(String(error), "error"));
    } finally {
      button.disabled = false;
      button.textContent = "Start job";
    }
  }
}
