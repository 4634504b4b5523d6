// Query: top-k tails of (head, relation, ?) or heads of (?, relation, tail), with entity autocomplete, relation
// labels, known answers marked and the same query as a curl line.

import { ApiError, getJSON, keyName } from "./api.js";
import { h, metric, note, shortId } from "./ui.js";

const SUGGESTIONS = 8;

/** An input with a listbox of entities matching what is typed (GET /models/{id}/entities?q=). */
function entityCombobox(getModel) {
  const list = h("ul", { id: "entity-options", role: "listbox", class: "options", hidden: true,
    "aria-label": "matching entities" });
  const input = h("input", { id: "entity", name: "entity", type: "text", autocomplete: "off", required: true,
    role: "combobox", "aria-autocomplete": "list", "aria-expanded": "false", "aria-controls": "entity-options",
    "aria-describedby": "entity-help" });
  const help = h("small", { id: "entity-help" }, "an id or a label; suggestions as you type (arrow keys, Enter)");
  let items = [];
  let active = -1;
  let pending = 0;

  const close = () => {
    list.hidden = true;
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
    active = -1;
  };
  const choose = (item) => {
    input.value = item.id;
    help.textContent = item.label ? `${item.label} (${item.id})` : item.id;
    close();
  };
  const highlight = (index) => {
    active = index;
    [...list.children].forEach((li, i) => li.setAttribute("aria-selected", String(i === index)));
    if (index >= 0) input.setAttribute("aria-activedescendant", `entity-option-${index}`);
  };

  input.addEventListener("input", async () => {
    const q = input.value.trim();
    const model = getModel();
    const ticket = ++pending;
    if (!q || !model) return close();
    try {
      const page = await getJSON(`/models/${model}/entities?` + new URLSearchParams({ q, limit: SUGGESTIONS }));
      if (ticket !== pending) return;
      items = page.items;
      help.textContent = `${page.total.toLocaleString("en")} matching; arrow keys and Enter to pick`;
    } catch (error) {
      if (ticket !== pending) return;
      items = [];
      help.textContent = error instanceof ApiError && error.status === 404 && typeof error.detail === "string"
        ? "this server has no entity search; type an id" : error.message;
    }
    list.replaceChildren(...items.map((item, i) => h("li", { id: `entity-option-${i}`, role: "option",
      "aria-selected": "false", "data-id": item.id, onmousedown: (e) => { e.preventDefault(); choose(item); } },
    h("span", { class: "label" }, item.label || item.id), item.label ? h("code", {}, item.id) : null)));
    list.hidden = !items.length;
    input.setAttribute("aria-expanded", String(!list.hidden));
    highlight(-1);
  });
  input.addEventListener("keydown", (e) => {
    if (list.hidden) return;
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      highlight((active + (e.key === "ArrowDown" ? 1 : -1) + items.length) % items.length);
    } else if (e.key === "Enter" && active >= 0) {
      e.preventDefault();
      choose(items[active]);
    } else if (e.key === "Escape") close();
  });
  input.addEventListener("blur", () => setTimeout(close, 100));
  return h("div", { class: "field combo" }, h("label", { for: "entity", id: "entity-label" }, "Head entity"),
    input, list, help);
}

function curlLine(params) {
  const sent = keyName(); // the key itself never goes into the page's text: a variable stands for it
  const auth = sent ? ` -H "Authorization: Bearer $${sent === "token" ? "EARL_API_TOKEN" : "EARL_KEY"}"` : "";
  const url = `${location.origin}/predict?${params}`;
  return `curl -s${auth} '${url.replaceAll("'", "'\\''")}'`;
}

export async function renderQuery(main, { query }) {
  const models = await getJSON("/models");
  main.append(h("h2", {}, "Query"));
  if (!models.length) {
    main.append(note("No model to query yet."), h("a", { href: "#/upload", class: "button primary" }, "Upload triples"));
    return;
  }
  const modelSelect = h("select", { id: "model", name: "model" }, models.map((m) => h("option",
    { value: m.id, selected: m.id === query.get("model") }, `${shortId(m.id)} · ${m.entities} entities · ${m.precision}`)));
  const relationSelect = h("select", { id: "relation", name: "relation", required: true });
  const relationError = h("p", { class: "field-error", role: "alert" });
  const direction = (value, text, checked) => h("label", { class: "radio" }, h("input", { type: "radio",
    name: "direction", value, checked, onchange: () => {
      document.getElementById("entity-label").textContent = value === "tail" ? "Head entity" : "Tail entity";
    } }), text);
  const k = h("input", { id: "k", name: "k", type: "number", min: 1, max: 1000, value: 10 });
  const results = h("div", { id: "results", "aria-live": "polite" });
  const form = h("form", { id: "query-form", onsubmit: (e) => run(e) },
    h("div", { class: "grid" },
      h("div", { class: "field" }, h("label", { for: "model" }, "Model"), modelSelect),
      h("fieldset", { class: "field" }, h("legend", {}, "Predict"),
        direction("tail", "tails of (head, relation, ?)", true), direction("head", "heads of (?, relation, tail)")),
      entityCombobox(() => modelSelect.value),
      h("div", { class: "field" }, h("label", { for: "relation" }, "Relation"), relationSelect, relationError),
      h("div", { class: "field" }, h("label", { for: "k" }, "Answers (k)"), k)),
    h("button", { type: "submit", class: "primary", id: "run-query" }, "Predict"));
  main.append(form, results);

  async function loadRelations() {
    relationSelect.replaceChildren(h("option", { value: "" }, "loading…"));
    relationError.textContent = "";
    try {
      const page = await getJSON(`/models/${modelSelect.value}/relations`);
      relationSelect.replaceChildren(...page.items.map((r) => h("option", { value: r.id },
        r.label ? `${r.label} (${r.id})` : r.id)));
    } catch (error) {
      relationSelect.replaceChildren();
      relationError.textContent = error.message;
    }
  }
  modelSelect.addEventListener("change", loadRelations);
  await loadRelations();

  async function run(event) {
    event.preventDefault();
    const side = form.elements.direction.value === "tail" ? "head" : "tail";
    const entity = document.getElementById("entity").value.trim();
    if (!entity) return void results.replaceChildren(note("Type an entity.", "error"));
    const params = new URLSearchParams({ model: modelSelect.value, [side]: entity, relation: relationSelect.value,
      k: k.value || 10 });
    try {
      // Known answers are left out by default; asking both ways tells which of the top k are known: every answer
      // in the unfiltered top k that the filtered top k lacks is one.
      const [all, unknown] = await Promise.all([getJSON(`/predict?${params}&exclude_known=false`),
        getJSON(`/predict?${params}`)]);
      const fresh = new Set(unknown.predictions.map((p) => p.entity));
      results.replaceChildren(answerTable(all, fresh, side), curlBox(curlLine(params)));
    } catch (error) {
      results.replaceChildren(note(`${error.status ?? ""} ${error.message}`.trim(), "error"));
      const suggestions = error.detail?.suggestions;
      if (suggestions?.length) results.append(h("p", {}, "Did you mean: ", suggestions.join(", "), "?"));
    }
  }
}

function answerTable(body, fresh, side) {
  const relation = body.relation_label || body.relation;
  const asked = side === "head" ? `(${body.head_label || body.head}, ${relation}, ?)`
    : `(?, ${relation}, ${body.tail_label || body.tail})`;
  return h("div", { class: "scroll" }, h("table", { id: "predictions" },
    h("caption", {}, `Top ${body.predictions.length} for ${asked}`),
    h("thead", {}, h("tr", {}, ["#", "entity", "label", "score", "known"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, body.predictions.map((p, i) => {
      const known = p.known ?? !fresh.has(p.entity);
      return h("tr", { class: known ? "known" : "", "data-entity": p.entity },
        h("td", { class: "num" }, i + 1), h("td", {}, h("code", {}, p.entity)), h("td", {}, p.label || ""),
        h("td", { class: "num" }, metric(p.score, 3)),
        h("td", {}, known ? h("span", { class: "badge known", title: "already in the graph" }, "known") : ""));
    }))));
}

function curlBox(line) {
  const code = h("code", { id: "curl-line" }, line);
  const status = h("span", { role: "status", class: "muted" });
  return h("div", { class: "curl" }, h("p", {}, "The same query from a shell (without known answers):"),
    h("pre", {}, code), h("button", { type: "button", onclick: async () => {
      try {
        await navigator.clipboard.writeText(line);
        status.textContent = "copied";
      } catch {
        getSelection().selectAllChildren(code);
        status.textContent = "selected: press Ctrl+C";
      }
    } }, "Copy"), " ", status);
}
