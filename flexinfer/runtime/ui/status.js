// FlexInfer status page: polls /status, streams /logs/<model>?follow=1, posts /load and /unload.
// Every value that comes from the server is set with textContent, never parsed as HTML: model output,
// errors and config strings are shown as text, whatever they contain.
"use strict";

const POLL_MS = 1000;
const LOG_LINES = 500;
const STATES = new Set(["stopped", "starting", "ready", "stopping", "restarting", "failed"]);
const rows = new Map(); // model -> {tr, cells, load, unload, logs}
let logModel = null;
let logAbort = null;
let logLines = [];
let logPending = false;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtRate(v) {
  if (v === null || v === undefined) return "\u2013";
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

function fmtAgo(now, t) {
  if (t === null || t === undefined) return "never";
  const s = Math.max(0, now - t);
  if (s < 60) return s.toFixed(0) + " s ago";
  if (s < 3600) return (s / 60).toFixed(0) + " min ago";
  return (s / 3600).toFixed(1) + " h ago";
}

function fmtUptime(s) {
  if (!s) return "\u2013";
  if (s < 60) return s.toFixed(0) + " s";
  if (s < 3600) return (s / 60).toFixed(0) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function flash(text) {
  const f = document.getElementById("flash");
  f.textContent = text;
  f.hidden = !text;
}

async function post(path) {
  try {
    const r = await fetch(path, { method: "POST" });
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      try { msg = (await r.json()).error.message; } catch (e) { /* not JSON */ }
      flash(msg);
    } else {
      flash("");
    }
  } catch (e) {
    flash("request failed: " + e);
  }
  poll();
}

function makeRow(name) {
  const tr = el("tr");
  tr.dataset.model = name;
  const cells = {};
  const nameTd = el("td", "model");
  cells.name = el("span", "mono name", name);
  cells.where = el("span", "dim where");
  nameTd.append(cells.name, el("br"), cells.where);
  tr.append(nameTd);
  const stateTd = el("td");
  cells.state = el("span", "state");
  stateTd.append(cells.state);
  tr.append(stateTd);
  for (const k of ["group", "queue", "rps", "tps", "requests", "errors", "uptime", "last"]) {
    cells[k] = el("td", ["group", "last"].includes(k) ? "" : "num");
    tr.append(cells[k]);
  }
  const act = el("td", "actions");
  const load = el("button", "load", "Load");
  const unload = el("button", "unload", "Unload");
  const logs = el("button", "logs", "Logs");
  load.addEventListener("click", () => { load.disabled = true; showLog(name); post("/load/" + encodeURIComponent(name)); });
  unload.addEventListener("click", () => { unload.disabled = true; post("/unload/" + encodeURIComponent(name)); });
  logs.addEventListener("click", () => showLog(name));
  act.append(load, unload, logs);
  tr.append(act);
  document.querySelector("#models tbody").append(tr);
  const row = { tr, cells, load, unload, logs };
  rows.set(name, row);
  return row;
}

function render(data) {
  const seen = new Set();
  for (const m of data.models) {
    const name = String(m.model);
    seen.add(name);
    const row = rows.get(name) || makeRow(name);
    const c = row.cells;
    const state = String(m.state);
    c.state.textContent = m.loading && state === "stopped" ? "starting" : state;
    c.state.className = "state " + (STATES.has(state) ? state : "other");
    c.state.title = m.last_error ? String(m.last_error) : "";
    row.tr.dataset.state = state;
    c.where.textContent = m.pid ? "pid " + m.pid + " \u00b7 port " + m.port : "";
    c.group.textContent = m.group ? String(m.group) : "\u2013";
    c.queue.textContent = String(m.queue_depth);
    c.rps.textContent = fmtRate(m.requests_per_s);
    c.tps.textContent = fmtRate(m.tokens_per_s);
    c.tps.title = m.completion_tokens + " completion + " + m.prompt_tokens + " prompt tokens in all";
    c.requests.textContent = String(m.requests);
    c.errors.textContent = m.errors_5xx + " / " + m.errors_4xx;
    c.errors.classList.toggle("bad", m.errors_5xx > 0);
    c.uptime.textContent = fmtUptime(m.uptime_s);
    c.last.textContent = fmtAgo(data.now, m.last_request);
    const busy = m.loading || ["starting", "stopping", "restarting"].includes(state);
    row.load.disabled = state === "ready" || busy;
    row.unload.disabled = state === "stopped" && !m.loading;
    row.logs.classList.toggle("on", name === logModel);
    row.tr.classList.toggle("sel", name === logModel);
  }
  for (const [name, row] of rows) {
    if (!seen.has(name)) { row.tr.remove(); rows.delete(name); }
  }
  const ul = document.getElementById("errors");
  ul.replaceChildren(...data.errors.slice(0, 20).map((e) => {
    const li = el("li");
    li.append(el("span", "dim", new Date(e.time * 1000).toLocaleTimeString() + " "),
              el("span", "mono", String(e.model)), el("span", "", ": "), el("span", "msg", String(e.message)));
    return li;
  }));
  document.getElementById("noerrors").hidden = data.errors.length > 0;
  if (logModel === null && data.models.length) {
    const ready = data.models.find((m) => m.state === "ready");
    showLog(String((ready || data.models[0]).model));
  }
}

async function poll() {
  const conn = document.getElementById("conn");
  try {
    const r = await fetch("/status", { cache: "no-store" });
    if (!r.ok) throw new Error(r.status + " " + r.statusText);
    render(await r.json());
    conn.textContent = "live";
    conn.className = "conn ok";
  } catch (e) {
    conn.textContent = "disconnected (" + e.message + ")";
    conn.className = "conn down";
  }
}

function drawLog() {
  logPending = false;
  const pre = document.getElementById("log");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = logLines.join("\n") || "(no output yet)";
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function addLog(text) {
  const parts = text.split("\n");
  if (logLines.length && parts.length) logLines[logLines.length - 1] += parts.shift();
  logLines.push(...parts);
  if (logLines.length > LOG_LINES + 1) logLines = logLines.slice(-LOG_LINES - 1);
  if (!logPending) { logPending = true; requestAnimationFrame(drawLog); }
}

async function streamLog(name, signal) {
  const state = document.getElementById("logstate");
  while (!signal.aborted) {
    try {
      const r = await fetch("/logs/" + encodeURIComponent(name) + "?follow=1&tail=" + LOG_LINES, { signal });
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      state.textContent = "(following)";
      logLines = [""];
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        addLog(dec.decode(value, { stream: true }));
      }
    } catch (e) {
      if (signal.aborted) return;
      state.textContent = "(reconnecting: " + e.message + ")";
    }
    await new Promise((res) => setTimeout(res, 2000));
  }
}

function showLog(name) {
  if (name === logModel) return;
  if (logAbort) logAbort.abort();
  logModel = name;
  logLines = [""];
  drawLog();
  document.getElementById("logmodel").textContent = name;
  for (const [n, row] of rows) {
    row.logs.classList.toggle("on", n === name);
    row.tr.classList.toggle("sel", n === name);
  }
  logAbort = new AbortController();
  streamLog(name, logAbort.signal);
}

poll();
setInterval(poll, POLL_MS);
