// Small DOM helpers shared by the views: element builder, number formats, messages.

/** h("p", {class: "x", onclick: f}, "text", child): an element; null/false children are skipped. */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${i ? n.toFixed(n < 10 ? 2 : 1) : n} ${units[i]}`;
}

export function count(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en");
}

export function metric(x, digits = 3) {
  return typeof x === "number" && Number.isFinite(x) ? x.toFixed(digits) : "–";
}

export function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "–";
}

export function shortId(id) {
  return id ? id.slice(0, 8) : "–";
}

/** A message box; kind "error" is announced to screen readers at once. */
export function note(text, kind = "info") {
  return h("p", { class: `note ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

export function stateBadge(state) {
  return h("span", { class: `badge state-${state}`, "data-state": state }, state);
}
