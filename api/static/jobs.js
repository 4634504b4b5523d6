// Jobs: the list, and one job followed live over Server-Sent Events with its loss and validation-MRR curves.

import { followEvents, getJSON, request } from "./api.js";
import { LineChart } from "./chart.js";
import { h, metric, note, shortId, stateBadge, when } from "./ui.js";

const UNFINISHED = ["queued", "running"];

function percent(progress) {
  return progress?.total ? Math.round((100 * progress.step) / progress.total) : 0;
}

export async function renderJobs(main) {
  main.append(h("h2", {}, "Jobs"));
  const jobs = await getJSON("/jobs?limit=100");
  if (!jobs.length) {
    main.append(note("No jobs yet."), h("a", { href: "#/upload", class: "button primary" }, "Upload triples"));
    return;
  }
  main.append(h("div", { class: "scroll" }, h("table", { id: "jobs-table" },
    h("caption", {}, "Newest first"),
    h("thead", {}, h("tr", {}, ["job", "state", "progress", "kind", "created", "model"]
      .map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, jobs.map((j) => h("tr", { "data-job": j.id },
      h("td", {}, h("a", { href: `#/jobs/${j.id}`, title: j.id }, shortId(j.id))), h("td", {}, stateBadge(j.state)),
      h("td", {}, `${percent(j.progress)} %`), h("td", {}, j.params?.max_bytes ? "compress" : "train"),
      h("td", {}, when(j.created)),
      h("td", {}, j.model_id ? h("a", { href: `#/models/${j.model_id}` }, shortId(j.model_id)) : "–")))))));
}

export async function renderJob(main, { id }) {
  const state = h("span", { id: "job-state" });
  const bar = h("progress", { id: "job-progress", max: 100, value: 0, "aria-label": "training progress" });
  const facts = h("p", { id: "job-facts" });
  const live = h("span", { id: "job-live", class: "muted", role: "status" });
  const error = h("div", { id: "job-error" });
  const cancelError = h("div", { id: "cancel-error" }); // kept while events update the job (a 403's reason)
  const after = h("div", { id: "job-after" });
  const cancel = h("button", { type: "button", class: "danger", id: "cancel-job", hidden: true, onclick: async () => {
    cancel.disabled = true;
    cancelError.replaceChildren();
    try {
      await request(`/jobs/${id}/cancel`, { method: "POST" });
    } catch (e) {
      cancelError.replaceChildren(note(e.status ? `${e.status}: ${e.message}` : e.message, "error"));
      cancel.disabled = false;
    }
  } }, "Cancel job");
  const lossCanvas = h("canvas", { id: "loss-chart", class: "chart" });
  const mrrCanvas = h("canvas", { id: "mrr-chart", class: "chart" });
  main.append(h("h2", {}, `Job ${shortId(id)} `, state), h("p", {}, bar, " ", facts, " ", live), cancel, cancelError, error,
    h("div", { class: "charts" }, lossCanvas, mrrCanvas), after);
  const loss = new LineChart(lossCanvas, { label: "training loss", digits: 4 });
  const mrr = new LineChart(mrrCanvas, { label: "validation MRR", color: "#16a34a" });

  function update(job) {
    state.replaceChildren(stateBadge(job.state));
    const p = job.progress || {};
    bar.value = percent(p);
    const sized = p.stage === "size"; // a compress job over a registered model: one step per size tried
    facts.textContent = sized ? `size ${p.step} / ${p.total} (${p.precision}), ${Math.round(p.time_left)} s left`
      : p.step ? `step ${p.step} / ${p.total}, loss ${metric(p.loss, 4)}, valid MRR `
      + `${metric(p.valid_mrr)}, ${Math.round(p.elapsed || 0)} s` : job.state === "queued" ? "waiting for a worker" : "";
    if (p.step && !sized) loss.add(p.step, p.loss);
    if (p.step && typeof p.valid_mrr === "number") mrr.add(p.step, p.valid_mrr);
    cancel.hidden = !UNFINISHED.includes(job.state) || job.cancel_requested;
    error.replaceChildren(job.error ? note(job.error, "error") : "");
    if (job.model_id) {
      after.replaceChildren(h("p", {}, "Model ready: ", h("a", { href: `#/models/${job.model_id}`, id: "job-model" },
        shortId(job.model_id)), " · ", h("a", { href: `#/query?model=${job.model_id}` }, "query it")));
    }
  }

  update(await getJSON(`/jobs/${id}`));
  const stream = followEvents(`/jobs/${id}/events`, {
    onEvent(name, data) {
      if (name === "job") update(data);
      else if (name === "curve" && data) {
        loss.set(data.steps.map((s, i) => [s, data.losses[i]]));
        mrr.set(data.eval_steps.map((s, i) => [s, data.eval_mrr[i]]));
      }
    },
    onStatus(status) { live.textContent = status === "live" ? "● live" : status; },
  });
  return () => stream.close();
}
