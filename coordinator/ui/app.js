// The coordinator's dashboard: plain JavaScript, no framework, no build step.
// Data comes from two server-sent event streams the coordinator pushes once a
// second (docs/design.md, "The dashboard"): GET events (the /status summary)
// and GET events?job=NAME (that job's /jobs/NAME JSON). They are read with
// fetch() rather than EventSource so that the token goes in an
// Authorization header, never in a URL. The token is kept in
// sessionStorage only (this tab, until it closes). Every URL is relative, so
// the page works at / and /ui, over http and https, behind a path prefix.
"use strict";

// The charts draw the job's curve: the coordinator's points since the job
// started (the stream's first event), then those the page takes itself,
// thinned as the coordinator thins its own (coordinator/jobs/curve.h).
const CURVE_POINTS = 1024;
const $ = (id) => document.getElementById(id);

const ui = {
  token: sessionStorage.getItem("gradsync-token") || "",
  job: decodeURIComponent(location.hash.slice(1)) || null, // selected job
  curves: new Map(), // job name -> {points: [{step, loss, sps}], intervalMs, lastMs}
  streams: { status: null, job: null }, // AbortControllers
};

// One stream of server-sent events read with fetch(), reconnecting with
// backoff until it is aborted. onEvent(kind, parsedJson) per event.
function stream(url, onEvent, onState) {
  const ctl = new AbortController();
  let delay = 500;
  const once = async () => {
    const headers = ui.token ? { Authorization: "Bearer " + ui.token } : {};
    const res = await fetch(url, { headers, signal: ctl.signal, cache: "no-store" });
    if (res.status === 401) throw Object.assign(new Error("this needs the token"), { auth: true });
    if (!res.ok) throw new Error(url + ": " + res.status + " " + (await res.text()));
    onState("live");
    delay = 500;
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        let kind = "message";
        let data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) kind = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        if (data) onEvent(kind, JSON.parse(data));
      }
    }
  };
  (async () => {
    while (!ctl.signal.aborted) {
      try {
        await once();
        onState("reconnecting");
      } catch (e) {
        if (ctl.signal.aborted) return;
        onState(e.auth ? "token needed" : "reconnecting", e.message);
        if (e.auth) return; // until a token is given
      }
      await new Promise((ok) => setTimeout(ok, delay));
      delay = Math.min(delay * 2, 10000);
    }
  })();
  return ctl;
}

function setConn(state, why) {
  $("conn").textContent = state;
  $("conn").dataset.state = state;
  const n = $("notice");
  n.hidden = !why;
  n.textContent = why || "";
}

// Small DOM helpers: text only, never HTML from the wire.
function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function row(cells, attrs) {
  const tr = el("tr", null, attrs);
  for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
  return tr;
}
const num = (v, d = 0) => (typeof v === "number" ? v.toFixed(d) : "");
const fmt = (v) => (typeof v === "number" ? (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3)) : "");

// How a field of BEAT_FIELDS (beat_fields.js, the coordinator's table of
// what ranks report) is shown in the members' table.
const FORMATS = {
  int: (v) => (typeof v === "number" ? String(v) : ""),
  sig: fmt,
  num: (v) => num(v),
  num2: (v) => num(v, 2),
  pct: (v) => (typeof v === "number" ? (v * 100).toFixed(0) + "%" : ""),
};
function addBeatColumns() {
  const end = $("beat-fields-end");
  for (const [, label] of BEAT_FIELDS) end.before(el("th", label));
}

function onStatus(kind, s) {
  const c = s.coordinator || {};
  $("coordinator").textContent = `v${c.version || "?"} · up ${num(c.uptime_s)} s · ${c.jobs || 0} jobs`;
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const j of s.jobs || []) {
    const rs = j.rank_summary || {};
    const name = el("td");
    const a = el("a", j.name, { href: "#" + encodeURIComponent(j.name) });
    name.appendChild(a);
    const tr = row([name, el("td", j.state, { class: "state-" + j.state }), String(j.world_size),
      `${rs.step_min ?? ""} – ${rs.step_max ?? ""}`, num(j.samples_per_sec)],
    { "data-job": j.name });
    if (j.name === ui.job) tr.classList.add("selected");
    body.appendChild(tr);
  }
  $("no-jobs").hidden = (s.jobs || []).length > 0;
  if (!ui.job && s.jobs && s.jobs.length) select(s.jobs[0].name);
}

function select(name) {
  if (ui.job === name && ui.streams.job) return;
  ui.job = name;
  if (location.hash.slice(1) !== encodeURIComponent(name)) location.hash = encodeURIComponent(name);
  if (ui.streams.job) ui.streams.job.abort();
  $("job").hidden = false;
  $("job-name").textContent = name;
  ui.streams.job = stream("events?job=" + encodeURIComponent(name), onJob, (st, why) => {
    if (st !== "live") setConn(st, why);
  });
}

function onJob(kind, j) {
  if (kind === "gone") {
    $("job-state").textContent = "forgotten by the coordinator";
    return;
  }
  const rs = j.rank_summary || {};
  const ranks = j.ranks || [];
  $("job-name").textContent = j.name;
  $("job-state").textContent = j.state;
  $("job-state").dataset.state = j.state;
  // A stall's reason is the waiting-on line's; this one is a failure's.
  const reason = j.state === "stalled" ? "" : j.reason || j.abort_reason || "";
  $("job-reason").hidden = !reason;
  $("job-reason").textContent = reason;
  $("step-min").textContent = rs.step_min ?? "";
  $("step-max").textContent = rs.step_max ?? 0;
  $("job-sps").textContent = num(j.samples_per_sec);
  $("job-gen").textContent = `${j.generation} (regroups ${j.regroups ?? 0})`;
  $("job-world").textContent = `${j.world_size} (min ${j.world_min}, max ${j.world_max})`;
  showWaiting(j);
  showSettings(j);
  if (j.curve) takeCurve(j.name, j.curve);
  record(j, ranks);
  showMembers(ranks);
  showHeatmap(ranks);
  showGenerations(j.generations || []);
  const cut = $("ranks-cut");
  cut.hidden = !(j.ranks_listed < j.world_size);
  cut.textContent = `showing the first ${j.ranks_listed} of ${j.world_size} ranks ` +
    "(the stream lists at most " + j.ranks_max_listed + ")";
}

// Who the job waits on: waiting_on when the coordinator says it, else the
// ranks at the lowest step of a stalled job.
function showWaiting(j) {
  const w = j.waiting_on;
  let ranks = [];
  let why = "";
  if (w && typeof w === "object") {
    ranks = w.ranks || [];
    why = w.reason || [w.kind, w.phase, w.collective].filter(Boolean).join(", ");
    if (w.rank_count > ranks.length) why += ` (${w.rank_count} ranks in all)`;
  } else if (j.stalled || j.state === "stalled") {
    ranks = j.stalled_ranks || [];
    why = j.state === "stalled" && j.reason ? j.reason :
      `no step for ${num(j.stalled_since_s, 1)} s; these ranks are at the lowest step`;
  }
  const show = ranks.length > 0 || (w && typeof w === "object");
  $("waiting-box").hidden = !show;
  $("waiting-on").textContent = ranks.map((r) => "rank " + r).join(", ") || (w ? w.kind : "");
  $("waiting-why").textContent = why;
}

function showSettings(j) {
  const dl = $("settings");
  dl.replaceChildren();
  const add = (k, v) => {
    if (v === undefined || v === null || v === "") return;
    dl.appendChild(el("dt", k));
    dl.appendChild(el("dd", typeof v === "object" ? JSON.stringify(v) : String(v)));
  };
  add("broadcast period", j.bcast_period);
  add("lr scale", j.lr_scale);
  add("world min / max", `${j.world_min} / ${j.world_max}`);
  const p = j.pack_list;
  if (p) add("packs", `${p.packs} packs, ${p.params} params, ${(p.bytes / 1048576).toFixed(2)} MiB ` +
    `(threshold ${(p.threshold_bytes / 1048576).toFixed(1)} MiB)`);
  const r0 = (j.ranks || [])[0];
  if (r0 && r0.state_bytes)
    add("optimizer state", `${(r0.state_bytes / 1048576).toFixed(2)} MiB on rank 0` +
      ((j.settings || {})["shard-optimizer"] === "true" ? " (sharded over the ranks)" : ""));
  add("broadcasts asked", j.broadcast_seq);
  add("checkpoints asked", j.checkpoint_seq);
  add("stop asked", j.stop ? "yes" : "no");
  for (const [k, v] of Object.entries(j.settings || {})) add(k, v);
  // What the job runs with, unless the user is typing a new value.
  for (const [id, v] of [["bcast-period", j.bcast_period], ["lr-scale", j.lr_scale]]) {
    const input = $(id);
    if (document.activeElement !== input) input.value = v;
  }
}

// The coordinator's curve of the job: the run so far, evenly spaced in time.
function takeCurve(name, c) {
  ui.curves.set(name, {
    points: (c.points || []).map(([step, loss, sps]) => ({ step, loss, sps })),
    intervalMs: (c.interval_s || 1) * 1000,
    lastMs: Date.now(),
  });
}

// Adds this event's point when the job stepped and an interval passed;
// full, every other point goes and the interval doubles, as the
// coordinator does.
function record(j, ranks) {
  let c = ui.curves.get(j.name);
  if (!c) ui.curves.set(j.name, (c = { points: [], intervalMs: 1000, lastMs: 0 }));
  const h = c.points;
  const live = ranks.filter((r) => typeof r.loss === "number" && r.state === "running");
  const step = j.rank_summary ? j.rank_summary.step_max : 0;
  const now = Date.now();
  if (live.length && step > 0 && (!h.length || (h[h.length - 1].step !== step &&
      now - c.lastMs >= c.intervalMs))) {
    const loss = live.reduce((a, r) => a + r.loss, 0) / live.length;
    if (h.length >= CURVE_POINTS) {
      c.points = h.filter((_, i) => i % 2 === 0);
      c.intervalMs *= 2;
    }
    c.points.push({ step, loss, sps: j.samples_per_sec || 0 });
    c.lastMs = now;
  }
  const marks = generationMarks(c.points, j.generations || []);
  chart($("chart-loss"), c.points.map((p) => p.loss), marks);
  chart($("chart-sps"), c.points.map((p) => p.sps), marks);
}

// Where each generation after the first starts: the index of the first
// point at or past its start step.
function generationMarks(points, gens) {
  const marks = [];
  for (const g of gens) {
    if (g.generation <= 1) continue;
    const i = points.findIndex((p) => p.step >= g.start_step);
    if (i > 0) marks.push({ i, generation: g.generation, world: g.world_size });
  }
  return marks;
}

// A line chart of `ys` in a 300x100 SVG, with its last value and range, and
// a dashed line where each of `marks` (a new generation) starts.
function chart(svg, ys, marks) {
  const NS = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  svg.dataset.points = ys.length;
  if (!ys.length) return;
  const lo = Math.min(...ys);
  const hi = Math.max(...ys);
  const span = hi - lo || 1;
  const x = (i) => (i / Math.max(ys.length - 1, 1)) * 300;
  const pts = ys.map((y, i) => `${x(i)},${95 - ((y - lo) / span) * 85}`);
  for (const m of marks) {
    const line = document.createElementNS(NS, "line");
    for (const [k, v] of [["x1", x(m.i)], ["x2", x(m.i)], ["y1", 0], ["y2", 100]]) line.setAttribute(k, v);
    line.dataset.generation = m.generation;
    const title = document.createElementNS(NS, "title");
    title.textContent = `generation ${m.generation}: ${m.world} ranks`;
    line.appendChild(title);
    svg.appendChild(line);
  }
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.appendChild(line);
  const label = document.createElementNS(NS, "text");
  label.setAttribute("x", "4");
  label.setAttribute("y", "12");
  label.textContent = `${fmt(ys[ys.length - 1])}  (${fmt(lo)} – ${fmt(hi)})`;
  svg.appendChild(label);
}

function showMembers(ranks) {
  const body = $("members").tBodies[0];
  body.replaceChildren();
  for (const r of ranks) {
    const attrs = { "data-rank": r.rank, "data-state": r.state, "data-phase": r.phase || "" };
    body.appendChild(row([String(r.rank), r.state, r.phase ? r.phase + (r.pack != null ? ` (pack ${r.pack})` : "") : "",
      r.node || "", r.device || "", ...BEAT_FIELDS.map(([key, , format]) => FORMATS[format](r[key])),
      typeof r.last_heartbeat_s === "number" ? r.last_heartbeat_s.toFixed(1) + " s ago" : ""], attrs));
  }
}

// One cell per rank, its colour from its step time between the fastest
// (green) and the slowest (red); all alike stay green.
function showHeatmap(ranks) {
  const box = $("heatmap");
  box.replaceChildren();
  const t = ranks.map((r) => (r.compute_ms || 0) + (r.comm_wait_ms || 0));
  const min = Math.min(...t);
  const spread = Math.max(...t) - min;
  ranks.forEach((r, i) => {
    const cell = el("span", null, {
      "data-rank": r.rank,
      title: `rank ${r.rank}: ${t[i].toFixed(2)} ms (compute ${num(r.compute_ms, 2)}, comm wait ${num(r.comm_wait_ms, 2)})`,
    });
    const f = spread > 0.05 * min ? (t[i] - min) / spread : 0;
    cell.style.backgroundColor = r.state === "running" ? `hsl(${120 - 120 * f}, 70%, ${70 - 25 * f}%)` : "#bbb";
    if (ranks.length <= 64) cell.textContent = r.rank;
    box.appendChild(cell);
  });
}

function showGenerations(gens) {
  const body = $("generations").tBodies[0];
  body.replaceChildren();
  for (const g of gens.slice().reverse()) {
    body.appendChild(row([String(g.generation), String(g.world_size), String(g.start_step),
      num(g.started_s_ago) + " s ago", num(g.duration_s, 1) + " s", num(g.lost_s, 1) + " s",
      g.end || "running", g.lost || ""]));
  }
}

async function control(action) {
  const out = $("control-result");
  const body = {};
  if (action === "period") body.bcast_period = Number($("bcast-period").value);
  else if (action === "lr_scale") body.lr_scale = Number($("lr-scale").value);
  else body.action = action;
  if (action === "stop" && !confirm(`Stop job ${ui.job}?`)) return;
  const headers = { "Content-Type": "application/json" };
  if (ui.token) headers.Authorization = "Bearer " + ui.token;
  try {
    const res = await fetch("jobs/" + encodeURIComponent(ui.job) + "/control",
      { method: "POST", headers, body: JSON.stringify(body) });
    const text = await res.text();
    out.textContent = res.ok ? `${action}: done` : `${action}: ${res.status} ${text}`;
  } catch (e) {
    out.textContent = `${action}: ${e.message}`;
  }
}

function start() {
  if (ui.streams.status) ui.streams.status.abort();
  ui.streams.status = stream("events", onStatus, setConn);
  if (ui.streams.job) ui.streams.job.abort();
  ui.streams.job = null;
  if (ui.job) select(ui.job);
}

document.addEventListener("DOMContentLoaded", () => {
  addBeatColumns();
  $("token").value = ui.token;
  $("token-set").addEventListener("click", () => {
    ui.token = $("token").value.trim();
    if (ui.token) sessionStorage.setItem("gradsync-token", ui.token);
    else sessionStorage.removeItem("gradsync-token");
    start();
  });
  $("control").addEventListener("click", (e) => {
    const a = e.target.dataset && e.target.dataset.action;
    if (a && ui.job) control(a);
  });
  window.addEventListener("hashchange", () => {
    const name = decodeURIComponent(location.hash.slice(1));
    if (name && name !== ui.job) select(name);
  });
  start();
});
