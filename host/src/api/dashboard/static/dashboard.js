// weft dashboard. No framework: the pages are rendered on the server; this script makes
// them live. Job data is only ever put in the page with textContent or as attribute
// values, never as HTML.
"use strict";

const api = () => document.body.dataset.api || "/api/v2";

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return Math.floor(s / 3600) + " h";
  return Math.floor(s / 86400) + " d";
}

function seconds(ms) {
  return ms === null || ms === undefined || ms === "" ? "" : (Number(ms) / 1000).toFixed(1) + " s";
}

async function apiCall(method, path, body, headers) {
  const init = { method, credentials: "same-origin", headers: headers || {} };
  if (body !== undefined) {
    if (body instanceof FormData) init.body = body;
    else {
      init.body = JSON.stringify(body);
      init.headers["content-type"] = "application/json";
    }
  }
  const r = await fetch(api() + path, init);
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  return { ok: r.ok, status: r.status, data };
}

function errorText(data, status) {
  const e = data && data.error;
  if (!e) return "request failed (" + status + ")";
  let text = e.code + ": " + e.message;
  const nodes = e.details && e.details.node_errors;
  if (nodes) {
    for (const [node, errs] of Object.entries(nodes)) {
      for (const err of errs) text += "\nnode " + node + ": " + (err.message || JSON.stringify(err));
    }
  }
  return text;
}

function setStatus(container, status) {
  container.textContent = "";
  container.appendChild(el("span", { class: "status status-" + status, "data-status": status }, status));
}

// ---- jobs list ----------------------------------------------------------------------

function jobsPage() {
  const table = document.getElementById("jobs");
  const tbody = table.querySelector("tbody");
  const wantStatus = table.dataset.filterStatus;
  let wantLabels = {};
  try { wantLabels = JSON.parse(table.dataset.filterLabels || "{}"); } catch (_) { wantLabels = {}; }
  const matches = (job) => {
    if (wantStatus && job.status !== wantStatus) return false;
    for (const [k, v] of Object.entries(wantLabels)) if (!job.metadata || job.metadata[k] !== v) return false;
    return true;
  };
  const tick = () => {
    for (const row of tbody.rows) {
      row.querySelector(".col-age").textContent = ago(row.dataset.created);
      if (row.dataset.started && !row.dataset.completed) {
        row.querySelector(".col-duration").textContent = seconds(Date.now() - Date.parse(row.dataset.started));
      }
    }
  };
  const newRow = (job) => {
    const row = el("tr", { "data-job": job.id, "data-created": job.created_at || "" });
    const link = el("a", { href: "/ui/jobs/" + encodeURIComponent(job.id) }, job.id);
    const cells = ["", "col-status", "", "col-node", "col-age", "col-duration", "col-labels"].map((c) => el("td", c ? { class: c } : {}));
    cells[0].appendChild(link);
    cells[2].appendChild(el("progress", { max: "1", value: "0" }));
    cells.forEach((c) => row.appendChild(c));
    const labels = Object.entries(job.metadata || {}).map(([k, v]) => k + "=" + v).join(", ");
    cells[6].textContent = labels;
    const none = document.getElementById("no-jobs");
    if (none) none.remove();
    tbody.insertBefore(row, tbody.firstChild);
    while (tbody.rows.length > 50) tbody.deleteRow(tbody.rows.length - 1);
    return row;
  };
  const update = (row, job) => {
    setStatus(row.querySelector(".col-status"), job.status);
    row.dataset.started = job.started_at || "";
    row.dataset.completed = job.completed_at || "";
    if (job.started_at && job.completed_at) {
      row.querySelector(".col-duration").textContent = seconds(Date.parse(job.completed_at) - Date.parse(job.started_at));
    }
    if (job.progress) progress(row, job.progress);
    if (["succeeded", "failed", "canceled", "expired"].includes(job.status)) row.querySelector(".col-node").textContent = "";
  };
  const progress = (row, p) => {
    row.querySelector("progress").value = p.value || 0;
    row.querySelector(".col-node").textContent = p.current_node_class || "";
  };
  const findRow = (id) => tbody.querySelector('tr[data-job="' + CSS.escape(id) + '"]');
  setInterval(tick, 1000);
  tick();
  const feed = new EventSource("/ui/feed");
  feed.addEventListener("job", (e) => {
    const job = JSON.parse(e.data);
    let row = findRow(job.id);
    if (!row) {
      if (table.dataset.live !== "true" || !matches(job)) return;
      row = newRow(job);
    }
    update(row, job);
  });
  feed.addEventListener("progress", (e) => {
    const item = JSON.parse(e.data);
    const row = findRow(item.id);
    if (row) progress(row, item.progress);
  });
  feed.addEventListener("resync", () => window.location.reload());
}

// ---- a job ----------------------------------------------------------------------------

function renderOutputs(outputs) {
  const box = document.getElementById("outputs");
  box.textContent = "";
  if (!outputs || outputs.length === 0) {
    box.appendChild(el("p", { class: "hint" }, "No outputs yet."));
    return;
  }
  for (const out of outputs) {
    const fig = el("figure", { class: "output", "data-output": out.id });
    const type = out.content_type || "";
    if (type.startsWith("image/") && type !== "image/svg+xml") {
      fig.appendChild(el("img", { src: out.url, alt: out.name }));
    } else if (type.startsWith("audio/")) {
      fig.appendChild(el("audio", { src: out.url, controls: "" }));
    } else if (type.startsWith("video/")) {
      fig.appendChild(el("video", { src: out.url, controls: "" }));
    } else if (type.startsWith("text/") || type === "application/json") {
      const pre = el("pre", { class: "output-text" });
      fig.appendChild(pre);
      if (out.size_bytes <= 256 * 1024) {
        fetch(out.url, { credentials: "same-origin" }).then((r) => r.text()).then((t) => { pre.textContent = t; });
      } else {
        pre.textContent = "(" + out.size_bytes + " bytes: download it)";
      }
    }
    const caption = el("figcaption");
    caption.appendChild(el("span", {}, out.name + " · " + type + " · " + out.size_bytes + " bytes "));
    caption.appendChild(el("a", { href: out.url, download: out.name.split("/").pop() || "output" }, "Download"));
    fig.appendChild(caption);
    box.appendChild(fig);
  }
}

function renderError(error) {
  const box = document.getElementById("error");
  box.textContent = "";
  if (!error) {
    box.appendChild(el("p", { class: "hint" }, "None."));
    return;
  }
  let where = "";
  if (error.node_id) where = " (node " + error.node_id + (error.class_type ? ", " + error.class_type : "") + ")";
  box.appendChild(el("p", { class: "error", id: "error-message" }, error.code + ": " + error.message + where));
  if (error.traceback) box.appendChild(el("pre", { id: "traceback" }, error.traceback));
}

function renderTimings(metrics) {
  const p = document.getElementById("timings");
  const q = metrics ? metrics.queue_ms : p.dataset.queueMs;
  const x = metrics ? metrics.execution_ms : p.dataset.executionMs;
  p.textContent = "Queued " + (seconds(q) || "—") + " · ran " + (seconds(x) || "—");
}

function jobPage() {
  const box = document.getElementById("job");
  const data = document.getElementById("job-data");
  let job = {};
  try { job = JSON.parse(data.dataset.job); } catch (_) { job = {}; }
  renderOutputs(job.outputs);
  renderError(job.error);
  renderTimings(job.metrics);
  const cancel = document.getElementById("cancel");
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    const r = await fetch(box.dataset.cancel, { method: "POST", credentials: "same-origin" });
    if (!r.ok) cancel.disabled = false;
  });
  const nodeStarted = {};
  let current = null;
  const nodeRow = (id) => document.querySelector('#nodes tr[data-node="' + CSS.escape(id) + '"]');
  const finishNode = (id) => {
    const row = nodeRow(id);
    if (!row) return;
    row.querySelector(".node-state").textContent = "done";
    if (nodeStarted[id]) row.querySelector(".node-time").textContent = seconds(Date.now() - nodeStarted[id]);
  };
  const terminal = (s) => ["succeeded", "failed", "canceled", "expired"].includes(s);
  if (terminal(job.status)) return;
  const events = new EventSource(box.dataset.events);
  events.addEventListener("status", (e) => {
    const j = JSON.parse(e.data);
    setStatus(document.getElementById("job-status"), j.status);
    renderOutputs(j.outputs);
    renderError(j.error);
    renderTimings(j.metrics);
    if (terminal(j.status)) {
      cancel.hidden = true;
      if (j.status === "succeeded") {
        document.getElementById("overall").value = 1;
        if (current) finishNode(current);
      }
      events.close();
    }
  });
  events.addEventListener("progress", (e) => {
    const p = JSON.parse(e.data);
    document.getElementById("overall").value = p.value || 0;
    document.getElementById("progress-text").textContent =
      (p.nodes_done || 0) + " / " + (p.nodes_total || 0) + " nodes" + (p.message ? " · " + p.message : "");
    const steps = document.getElementById("steps");
    steps.max = p.steps || 1;
    steps.value = p.step || 0;
    document.getElementById("steps-text").textContent = p.steps ? p.step + " / " + p.steps : "";
    if (p.current_node && p.current_node !== current) {
      if (current) finishNode(current);
      current = p.current_node;
      nodeStarted[current] = Date.now();
      const row = nodeRow(current);
      if (row) row.querySelector(".node-state").textContent = "running";
    }
  });
  events.addEventListener("preview", (e) => {
    const p = JSON.parse(e.data);
    if (!/^image\/(png|jpeg|webp)$/.test(p.content_type)) return;
    const img = document.getElementById("preview");
    img.src = "data:" + p.content_type + ";base64," + p.data_base64;
    img.hidden = false;
  });
  events.addEventListener("output", () => {});
  events.addEventListener("log", (e) => {
    const l = JSON.parse(e.data);
    const logs = document.getElementById("logs");
    logs.textContent += l.message.endsWith("\n") ? l.message : l.message + "\n";
  });
}

// ---- submit ---------------------------------------------------------------------------

let catalogue = null;

async function loadCatalogue() {
  if (catalogue) return catalogue;
  const r = await apiCall("GET", "/nodes");
  catalogue = r.ok ? r.data : {};
  return catalogue;
}

function inputSpec(classType, name) {
  const def = catalogue && catalogue[classType];
  if (!def || !def.input) return null;
  return (def.input.required && def.input.required[name]) || (def.input.optional && def.input.optional[name]) || null;
}

function parseWorkflow() {
  const text = document.getElementById("workflow").value;
  return JSON.parse(text);
}

async function buildForm() {
  const form = document.getElementById("form");
  const errorBox = document.getElementById("submit-error");
  form.textContent = "";
  errorBox.textContent = "";
  let workflow;
  try { workflow = parseWorkflow(); } catch (e) {
    errorBox.textContent = "This is not valid JSON: " + e.message;
    return;
  }
  if (!workflow || typeof workflow !== "object" || Array.isArray(workflow)) return;
  await loadCatalogue();
  for (const [id, node] of Object.entries(workflow)) {
    if (!node || typeof node !== "object" || !node.inputs) continue;
    const fieldset = el("fieldset", { "data-node": id });
    fieldset.appendChild(el("legend", {}, "Node " + id + " · " + node.class_type));
    for (const [name, value] of Object.entries(node.inputs)) {
      if (Array.isArray(value) || (value && typeof value === "object")) continue;
      const spec = inputSpec(node.class_type, name);
      const type = spec ? spec[0] : typeof value === "number" ? "FLOAT" : typeof value === "boolean" ? "BOOLEAN" : "STRING";
      const opts = (spec && spec[1]) || {};
      let input;
      if (Array.isArray(type) || type === "COMBO") {
        input = el("select");
        const choices = Array.isArray(type) ? type : opts.options || [];
        for (const c of choices) {
          const o = el("option", { value: String(c) }, String(c));
          if (String(c) === String(value)) o.selected = true;
          input.appendChild(o);
        }
      } else if (type === "BOOLEAN") {
        input = el("input", { type: "checkbox" });
        input.checked = Boolean(value);
      } else if (type === "INT" || type === "FLOAT") {
        input = el("input", { type: "number", step: opts.step !== undefined ? String(opts.step) : type === "INT" ? "1" : "any" });
        if (opts.min !== undefined) input.min = String(opts.min);
        if (opts.max !== undefined) input.max = String(opts.max);
        input.value = String(value);
      } else {
        input = opts.multiline ? el("textarea", { rows: "3" }) : el("input", { type: "text" });
        input.value = String(value);
      }
      input.dataset.node = id;
      input.dataset.input = name;
      input.dataset.type = Array.isArray(type) ? "COMBO" : type;
      input.addEventListener("change", () => {
        const wf = parseWorkflow();
        let v = input.type === "checkbox" ? input.checked : input.value;
        if (input.dataset.type === "INT") v = parseInt(v, 10);
        if (input.dataset.type === "FLOAT") v = parseFloat(v);
        wf[id].inputs[name] = v;
        document.getElementById("workflow").value = JSON.stringify(wf, null, 2);
      });
      const label = el("label", {}, name + " ");
      label.appendChild(input);
      fieldset.appendChild(label);
    }
    form.appendChild(fieldset);
  }
}

function labelsObject() {
  const out = {};
  for (const pair of document.getElementById("labels").value.split(",")) {
    const [k, ...rest] = pair.split("=");
    if (k && k.trim() && rest.length) out[k.trim()] = rest.join("=").trim();
  }
  return out;
}

function submitPage() {
  const area = document.getElementById("workflow");
  area.addEventListener("dragover", (e) => e.preventDefault());
  area.addEventListener("drop", async (e) => {
    e.preventDefault();
    const file = e.dataTransfer.files[0];
    if (!file) return;
    area.value = await file.text();
    buildForm();
  });
  document.getElementById("load").addEventListener("click", buildForm);
  document.getElementById("upload").addEventListener("click", async () => {
    const file = document.getElementById("asset-file").files[0];
    if (!file) return;
    const body = new FormData();
    body.append("file", file, file.name);
    const r = await apiCall("POST", "/assets", body);
    const list = document.getElementById("assets");
    if (!r.ok) {
      list.appendChild(el("li", { class: "error" }, file.name + ": " + errorText(r.data, r.status)));
      return;
    }
    const ref = JSON.stringify({ __type: "core/ASSET", info: { id: r.data.id } });
    list.appendChild(el("li", { "data-asset": r.data.id }, file.name + " → " + ref));
  });
  document.getElementById("queue").addEventListener("click", async () => {
    const errorBox = document.getElementById("submit-error");
    errorBox.textContent = "";
    let workflow;
    try { workflow = parseWorkflow(); } catch (e) {
      errorBox.textContent = "This is not valid JSON: " + e.message;
      return;
    }
    const key = (crypto.randomUUID && crypto.randomUUID()) || String(Date.now()) + Math.random();
    const r = await apiCall("POST", "/jobs", { workflow, metadata: labelsObject() }, { "idempotency-key": key });
    if (!r.ok) {
      errorBox.textContent = errorText(r.data, r.status);
      return;
    }
    window.location.assign("/ui/jobs/" + encodeURIComponent(r.data.id));
  });
}

// ---- nodes and operators ----------------------------------------------------------------

function nodesPage() {
  const search = document.getElementById("node-search");
  search.addEventListener("input", () => {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    for (const node of document.querySelectorAll("#node-list .node")) {
      const text = node.dataset.search || "";
      node.hidden = !words.every((w) => text.includes(w));
    }
  });
}

function operatorPage() {
  const first = { at: Date.now(), finished: Number(document.getElementById("finished").textContent) };
  setInterval(async () => {
    const r = await fetch("/ui/operator", { credentials: "same-origin" });
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    for (const id of ["figures", "plugins", "metrics"]) {
      const fresh = doc.getElementById(id);
      const old = document.getElementById(id);
      if (fresh && old) old.replaceWith(document.adoptNode(fresh));
    }
    const finished = Number(document.getElementById("finished").textContent);
    const minutes = (Date.now() - first.at) / 60000;
    document.getElementById("throughput").textContent =
      minutes > 0 ? ((finished - first.finished) / minutes).toFixed(1) + " jobs/min since this page opened" : "measuring…";
  }, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "jobs" && document.getElementById("jobs")) jobsPage();
  else if (page === "job" && document.getElementById("job")) jobPage();
  else if (page === "submit") submitPage();
  else if (page === "nodes") nodesPage();
  else if (page === "operator" && document.getElementById("figures")) operatorPage();
});
