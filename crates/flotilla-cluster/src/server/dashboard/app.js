// Flotilla's dashboard: one page, no dependencies. The cluster view comes from the
// server-sent events of /api/events (the coordinator's snapshots, at most twice a second);
// a job's view refetches its status and trace on each event while it is open.
"use strict";

const main = () => document.getElementById("main");
let cluster = null;
let busy = false;
let openLog = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function secs(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

async function get(path, text) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (r.status === 401) { location.reload(); throw new Error("logged out"); }
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()));
  return text ? r.text() : r.json();
}

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map(h => el("th", { class: h.startsWith(">") ? "num" : "" }, h.replace(/^>/, ""))))),
    el("tbody", {}, rows));
}

function progress(done, total) {
  const bar = el("span", {});
  bar.style.width = (total ? (100 * done / total) : 0).toFixed(1) + "%";
  return el("span", { class: "bar" }, bar);
}

// ---------------------------------------------------------------- the cluster

function clusterView() {
  if (!cluster) return [el("p", {}, "Waiting for the coordinator…")];
  const jobs = [...cluster.jobs].sort((a, b) => b.id - a.id);
  const jobRows = jobs.map(j => {
    const left = j.total - j.done;
    // By the learned runtimes; else by the rate so far.
    const eta = j.eta_s !== undefined ? secs(j.eta_s)
      : j.state === "running" && j.done > 0 ? secs(j.makespan_s / j.done * left) : "–";
    return el("tr", { class: "click job-row", "data-job": j.id, onclick: () => { location.hash = "#/job/" + j.id; } },
      el("td", { class: "num" }, j.id), el("td", {}, j.name), el("td", {}, j.tenant || "admin"),
      el("td", { class: "state s-" + j.state }, j.state),
      el("td", {}, progress(j.done, j.total), " ", j.done + "/" + j.total),
      el("td", { class: "num" }, j.counts.running + j.counts.assigned),
      el("td", { class: "num" }, j.counts.failed), el("td", { class: "num" }, j.retries),
      el("td", { class: "num" }, secs(j.makespan_s)), el("td", { class: "num" }, eta),
      el("td", { class: "why" }, j.waiting || ""));
  });
  const workerRows = cluster.workers.map(w => el("tr", { class: "worker-row" },
    el("td", {}, w.id), el("td", {}, w.name), el("td", {}, w.hostname),
    el("td", { class: "num" }, w.resources.cpus), el("td", { class: "num" }, w.used.cpus),
    el("td", { class: "num", title: (w.gpus || []).join(", ") }, w.resources.gpus + ((w.gpus || []).length ? " · " + w.gpus[0] : "")),
    el("td", {}, progress(w.utilization, 1), " ", (100 * w.utilization).toFixed(0) + "%"),
    el("td", { class: "num" }, w.queued), el("td", { class: "num" }, secs(w.uptime_s)),
    el("td", { class: "num" }, w.heartbeat_age_s !== undefined ? secs(w.heartbeat_age_s) + " ago" : "–"),
    el("td", {}, w.hw_class), el("td", {}, w.provider || "")));
  return [
    el("h1", {}, "Cluster"),
    el("h2", {}, "Workers (" + cluster.workers.length + ")"),
    table(["Id", "Name", "Host", ">CPUs", ">Used", ">GPUs", "Utilization", ">Queued", ">Up", ">Heard from", "Hardware class", "Provider"], workerRows),
    el("h2", {}, "Jobs (" + jobs.length + ")"),
    table([">Job", "Name", "Tenant", "State", "Progress", ">Running", ">Failed", ">Retries", ">Makespan", ">ETA", "Waiting"], jobRows),
  ];
}

// ---------------------------------------------------------------- a job

let jobCache = { id: null, job: null, trace: null };

function lanes(spans) {
  // One row per worker slot: attempts that overlapped on a worker go to different rows.
  const byWorker = new Map();
  for (const s of spans) {
    const k = s.worker_name + " (" + s.worker + ")";
    if (!byWorker.has(k)) byWorker.set(k, []);
    byWorker.get(k).push(s);
  }
  const rows = [];
  for (const [name, list] of [...byWorker.entries()].sort()) {
    list.sort((a, b) => a.start_ms - b.start_ms || a.end_ms - b.end_ms);
    const ends = [];
    const mine = [];
    for (const s of list) {
      let lane = s.gpu !== undefined && s.gpu !== null ? "gpu " + s.gpu : null;
      if (lane === null) {
        let i = ends.findIndex(e => e <= s.start_ms);
        if (i < 0) { ends.push(0); i = ends.length - 1; }
        ends[i] = s.end_ms;
        lane = "slot " + i;
      }
      mine.push([lane, s]);
    }
    const names = [...new Set(mine.map(m => m[0]))].sort();
    for (const lane of names) rows.push({ label: name + " · " + lane, spans: mine.filter(m => m[0] === lane).map(m => m[1]) });
  }
  return rows;
}

function gantt(trace) {
  const spans = trace.spans.concat(trace.running);
  const rows = lanes(spans);
  const label = 190, width = 1100, rowH = 18, top = 18;
  const span = Math.max(trace.now_ms, 1);
  const x = ms => label + (width - label - 10) * ms / span;
  const g = svg("svg", { id: "gantt", width, height: top + rows.length * rowH + 8, viewBox: `0 0 ${width} ${top + rows.length * rowH + 8}` });
  for (let t = 0; t <= 4; t++) {
    const ms = span * t / 4;
    g.append(svg("text", { x: x(ms), y: 12, "text-anchor": "middle" }, secs(ms / 1000)));
  }
  rows.forEach((r, i) => {
    const y = top + i * rowH;
    g.append(svg("text", { x: 4, y: y + 12 }, r.label));
    for (const s of r.spans) {
      const w = Math.max(x(s.end_ms) - x(s.start_ms), 1.5);
      g.append(svg("rect", { class: "gantt-bar o-" + s.outcome, x: x(s.start_ms), y: y + 2, width: w, height: rowH - 4, "data-task": s.task },
        svg("title", {}, `${s.task} #${s.attempt}: ${s.outcome}, ${secs((s.end_ms - s.start_ms) / 1000)} on ${s.worker_name}`)));
    }
  });
  return g;
}

function graph(trace, job) {
  if (!trace.names.length) return el("p", { class: "muted" }, "The graph is drawn for jobs of at most 300 tasks.");
  const n = trace.names.length;
  const preds = Array.from({ length: n }, () => []);
  for (const [p, s] of trace.edges) preds[s].push(p);
  const depth = new Array(n).fill(-1);
  const d = i => {
    if (depth[i] >= 0) return depth[i];
    depth[i] = 0;
    for (const p of preds[i]) depth[i] = Math.max(depth[i], d(p) + 1);
    return depth[i];
  };
  for (let i = 0; i < n; i++) d(i);
  const layers = [];
  for (let i = 0; i < n; i++) (layers[depth[i]] = layers[depth[i]] || []).push(i);
  const colW = 120, rowH = 22, widest = Math.max(...layers.map(l => l.length));
  const W = Math.max(colW * layers.length + 40, 200), H = Math.max(rowH * widest + 20, 60);
  const pos = new Array(n);
  layers.forEach((l, c) => l.forEach((t, r) => { pos[t] = [30 + c * colW, 15 + r * rowH + (widest - l.length) * rowH / 2]; }));
  const g = svg("svg", { id: "graph", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  for (const [p, s] of trace.edges) g.append(svg("line", { class: "edge", x1: pos[p][0], y1: pos[p][1], x2: pos[s][0], y2: pos[s][1] }));
  const state = i => (job.tasks[i] || {}).state || "waiting";
  for (let i = 0; i < n; i++) {
    g.append(svg("circle", { class: "n-" + state(i), cx: pos[i][0], cy: pos[i][1], r: 6 }, svg("title", {}, trace.names[i] + ": " + state(i))));
    if (widest <= 12) g.append(svg("text", { x: pos[i][0] + 9, y: pos[i][1] + 4 }, trace.names[i]));
  }
  return g;
}

function eta(job, trace) {
  // The coordinator's, from the performance model; else the tasks left × their mean
  // runtime so far ÷ the slots at work.
  const summary = cluster && cluster.jobs.find(j => j.id === job.id);
  if (summary && summary.eta_s !== undefined) return secs(summary.eta_s);
  if (job.state !== "running") return "–";
  const done = trace.spans.filter(s => s.outcome === "succeeded");
  if (!done.length) return "–";
  const mean = done.reduce((a, s) => a + (s.end_ms - s.start_ms), 0) / done.length / 1000;
  const left = job.total - job.counts.done;
  const slots = Math.max(trace.running.length, 1);
  return secs(mean * left / slots);
}

async function showLog(id, task, stderr) {
  openLog = { id, task, stderr };
  const out = document.getElementById("log-out");
  if (!out) return;
  document.getElementById("log-title").textContent = task + (stderr ? " — stderr" : " — stdout");
  try {
    out.textContent = (await get(`/api/jobs/${id}/logs/${encodeURIComponent(task)}?stderr=${stderr}`, true)) || "(empty)";
  } catch (e) {
    out.textContent = String(e);
  }
}

function workerName(id) {
  if (!id) return "";
  const w = cluster && cluster.workers.find(w => w.id === id);
  return w ? `${w.name} (${id})` : `(gone) ${id}`;
}

function jobView(id) {
  const { job, trace } = jobCache.id === id ? jobCache : {};
  if (!job || !trace) return [el("p", {}, "Loading job " + id + "…")];
  const c = job.counts;
  const rows = job.tasks.slice(0, 500).map(t => el("tr", { class: "click task-row", "data-task": t.name, onclick: () => showLog(id, t.name, false) },
    el("td", {}, t.name), el("td", { class: "state s-" + t.state }, t.state), el("td", {}, workerName(t.worker)),
    el("td", { class: "num" }, t.attempts), el("td", {}, t.variant || ""),
    el("td", { class: "num" }, t.usage ? secs(t.usage.wall_seconds) : "–"),
    el("td", { class: "num" }, t.cost !== undefined ? t.cost.toFixed(6) : ""),
    el("td", { class: "why" }, (t.placement && t.placement.why) || t.message || "")));
  const logTask = openLog && openLog.id === id ? openLog.task : null;
  return [
    el("h1", {}, `Job ${job.id}: ${job.name} `, el("span", { id: "job-state", class: "state s-" + job.state }, job.state)),
    el("div", { class: "cards" },
      el("div", { class: "card" }, el("b", {}, c.done + "/" + job.total), "done"),
      el("div", { class: "card" }, el("b", {}, c.running + c.assigned), "running"),
      el("div", { class: "card" }, el("b", {}, c.waiting + c.ready + c.backoff), "waiting"),
      el("div", { class: "card" }, el("b", {}, c.failed), "failed"),
      el("div", { class: "card" }, el("b", {}, job.retries), "retries"),
      el("div", { class: "card" }, el("b", {}, secs(job.makespan_s)), "makespan"),
      el("div", { class: "card" }, el("b", {}, eta(job, trace)), "ETA")),
    job.waiting ? el("p", { class: "muted" }, "Waiting: " + job.waiting) : null,
    el("h2", {}, "Timeline (a row per worker slot and GPU)" + (trace.partial ? " — partial" : "")),
    gantt(trace),
    el("h2", {}, "Task graph"),
    graph(trace, job),
    el("h2", {}, "Tasks" + (job.tasks.length > 500 ? " (the first 500)" : "") + " — click one for its log"),
    table(["Task", "State", "Worker", ">Attempts", "Variant", ">Duration", ">Cost", "Why there"], rows),
    el("h2", { id: "log-title" }, logTask ? logTask : "Log"),
    el("div", { class: "tabs" },
      el("button", { id: "log-stdout", onclick: () => openLog && showLog(id, openLog.task, false) }, "stdout"),
      el("button", { id: "log-stderr", onclick: () => openLog && showLog(id, openLog.task, true) }, "stderr")),
    el("pre", { id: "log-out" }, logTask ? "…" : "Click a task."),
  ];
}

async function refreshJob(id) {
  if (busy) return;
  busy = true;
  try {
    const [job, trace] = await Promise.all([get("/api/jobs/" + id), get("/api/jobs/" + id + "/trace")]);
    jobCache = { id, job, trace };
  } catch (e) {
    jobCache = { id: null };
    main().replaceChildren(el("p", { class: "error" }, String(e)));
    busy = false;
    return;
  }
  busy = false;
  render();
  if (openLog && openLog.id === id) showLog(id, openLog.task, openLog.stderr);
}

// ---------------------------------------------------------------- the performance model

async function modelView() {
  const m = await get("/api/model");
  const entries = (m.entries || m || []);
  const rows = entries.map(e => {
    const sd = e.count > 1 ? Math.sqrt(e.m2 / (e.count - 1)) : 0;
    return el("tr", {}, el("td", {}, e.codelet), el("td", {}, e.arch), el("td", { class: "num" }, e.footprint),
      el("td", { class: "num" }, secs(e.mean)), el("td", { class: "num" }, secs(sd)), el("td", { class: "num" }, e.count));
  });
  main().replaceChildren(el("h1", {}, "Performance model"),
    el("p", { class: "muted" }, "What the scheduler learned: each task kind's runtime on each hardware class."),
    table(["Task kind", "Hardware class", ">Footprint", ">Mean", ">Spread (σ)", ">Samples"], rows));
}

// ---------------------------------------------------------------- the pool

function credits(micro) {
  return (micro / 1e6).toFixed(6);
}

async function poolView() {
  const [ledger, providers] = await Promise.all([get("/api/ledger"), get("/api/providers")]);
  const accounts = (ledger.accounts || []).map(a => el("tr", { class: "account-row" },
    el("td", {}, a.kind), el("td", {}, a.name), el("td", { class: "num" }, credits(a.balance_micro))));
  const rows = (providers || []).map(p => el("tr", { class: "provider-row" },
    el("td", {}, p.name), el("td", { class: "num" }, (p.workers || []).length),
    el("td", { class: "num" }, p.cpus), el("td", { class: "num" }, p.gpus),
    el("td", { class: "num" }, Number(p.reputation).toFixed(2) + (p.eligible ? "" : " (out)")),
    el("td", { class: "num" }, p.accepted), el("td", { class: "num" }, p.rejected),
    el("td", { class: "num" }, Number(p.earned).toFixed(6)),
    el("td", {}, (p.availability || []).join("; ") || "always"), el("td", {}, (p.prices || []).join("; ")),
    el("td", {}, p.revoked ? "revoked" : "active")));
  const total = ledger.total_micro !== undefined
    ? el("p", { class: "muted" }, `Total ${credits(ledger.total_micro)} credits (handed out: ${ledger.issued}); the platform holds ${ledger.platform}.`)
    : null;
  main().replaceChildren(...[el("h1", {}, "Pool"),
    el("h2", {}, "Ledger"), table(["Kind", "Account", ">Balance (credits)"], accounts), total,
    el("h2", {}, "Providers"),
    table(["Provider", ">Workers", ">CPUs", ">GPUs", ">Reputation", ">Accepted", ">Rejected", ">Earned", "Available", "Prices (per unit-hour)", "Token"], rows),
  ].filter(x => x));
}

// ---------------------------------------------------------------- routing

function route() {
  const h = location.hash || "#/";
  let m = h.match(/^#\/job\/(\d+)/);
  if (m) return { page: "job", id: Number(m[1]) };
  if (h.startsWith("#/model")) return { page: "model" };
  if (h.startsWith("#/pool")) return { page: "pool" };
  return { page: "cluster" };
}

function render() {
  const r = route();
  const parts = r.page === "job" ? jobView(r.id) : clusterView();
  main().replaceChildren(...parts.filter(p => p !== null && p !== undefined));
}

window.addEventListener("hashchange", () => {
  const r = route();
  if (r.page === "model") modelView().catch(e => main().replaceChildren(el("p", { class: "error" }, String(e))));
  else if (r.page === "pool") poolView().catch(e => main().replaceChildren(el("p", { class: "error" }, String(e))));
  else if (r.page === "job") { render(); refreshJob(r.id); }
  else render();
});

function connect() {
  const es = new EventSource("/api/events");
  const live = document.getElementById("live");
  es.addEventListener("cluster", ev => {
    cluster = JSON.parse(ev.data);
    live.textContent = "live · " + new Date().toLocaleTimeString();
    const r = route();
    if (r.page === "job") refreshJob(r.id);
    else if (r.page === "cluster") render();
  });
  es.onerror = () => { live.textContent = "reconnecting…"; };
}

window.addEventListener("DOMContentLoaded", () => {
  connect();
  const r = route();
  if (r.page === "model") modelView();
  else if (r.page === "pool") poolView();
  else if (r.page === "job") refreshJob(r.id);
  else render();
});
