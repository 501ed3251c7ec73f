// topics console: polls the /v0 API every few seconds and renders topics, queues,
// routers and metric sparklines; the live tail streams over SSE (tail.js).
// Plain ES modules, no build step, no dependencies.

import { api, ApiError, getToken, mapLimit, seg, setToken } from "./api.js";
import { fmtAgo, fmtBytes, fmtCompact, fmtDuration, fmtInt, fmtIso } from "./format.js";
import { Spark } from "./spark.js";
import { Tail } from "./tail.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// `?refresh=<seconds>` changes the poll interval (default 3 s).
const REFRESH_MS = Math.min(60000, Math.max(500, (Number(params.get("refresh")) || 3) * 1000));
const PAGE_SIZE = 50;
const DETAIL_CONCURRENCY = 6;

const state = {
  prefix: "",
  cursors: [""], // cursor of each topic page visited (page 0 has none)
  page: 0,
  nextCursor: null,
  needAuth: false,
  shown: false, // the dashboard has been rendered once (new rows flash after that)
  timer: null,
  running: false,
  again: false,
  version: null,
};

// ------------------------------------------------------------------ auth

function askForToken(message) {
  state.needAuth = true;
  tail.stop("Stopped: the server wants an API key.");
  $("main").hidden = true;
  $("auth").hidden = false;
  $("auth-error").textContent = message || "";
  $("auth-state").textContent = "key needed";
  setPill("key needed", "warn");
  $("forget-token").hidden = !getToken();
  const input = $("token");
  input.value = "";
  input.focus();
}

$("auth-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  setToken(token);
  state.needAuth = false;
  $("auth-error").textContent = "Checking…";
  refresh();
});

$("forget-token").addEventListener("click", () => {
  setToken("");
  tail.stop("Stopped.");
  state.needAuth = false;
  refresh();
});

function showMain() {
  $("auth").hidden = true;
  $("main").hidden = false;
  const token = getToken();
  $("auth-state").textContent = token ? "API key" : "off (dev mode)";
  $("forget-token").hidden = !token;
}

// ------------------------------------------------------------------ header + banner

function setPill(text, kind) {
  const el = $("srv-state");
  el.textContent = text;
  el.className = `pill ${kind}`;
}

function banner(text, kind = "") {
  const el = $("banner");
  el.hidden = !text;
  el.textContent = text || "";
  el.className = `banner ${kind}`;
}

function explain(err) {
  if (!(err instanceof ApiError)) return [`Unexpected error: ${err}`, "bad"];
  if (err.status === 0) return [`The server cannot be reached; retrying every ${REFRESH_MS / 1000} s.`, "bad"];
  if (err.status === 403) return [`This key may not read everything here: ${err.message}`, ""];
  if (err.status === 503 && err.code === "not_ready") {
    const p = err.detail && err.detail.replay_progress;
    return [`The server is replaying its log${p !== undefined ? ` (${Math.round(p * 100)}%)` : ""}; data appears when it is done.`, ""];
  }
  return [`${err.status} ${err.code}: ${err.message}`, "bad"];
}

// ------------------------------------------------------------------ tables

/** Keep `tbody`'s rows in the order of `items`, reusing a row per key (focus survives). */
function syncRows(tbody, items, key, create, update) {
  const existing = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  const seen = new Set();
  items.forEach((item, i) => {
    const k = key(item);
    seen.add(k);
    let tr = existing.get(k);
    const isNew = !tr;
    if (isNew) {
      tr = create(item);
      tr.dataset.key = k;
      if (state.shown) tr.classList.add("fresh");
    }
    update(tr, item, isNew);
    const at = tbody.children[i];
    if (at !== tr) tbody.insertBefore(tr, at || null);
  });
  for (const [k, tr] of existing) if (!seen.has(k)) tr.remove();
}

function cells(tr, n) {
  for (let i = 0; i < n; i++) tr.append(document.createElement("td"));
  return [...tr.children];
}

/** Set a cell's text; flash it when a number changed. */
function setText(td, text, bump = false) {
  if (td.textContent === text) return;
  const had = td.textContent !== "";
  td.textContent = text;
  if (bump && had && state.shown) {
    td.classList.remove("bump");
    void td.offsetWidth; // restart the animation
    td.classList.add("bump");
  }
}

function badge(text, cls) {
  const b = document.createElement("span");
  b.className = `badge ${cls}`;
  b.textContent = text;
  return b;
}

function createTopicRow(t) {
  const tr = document.createElement("tr");
  const c = cells(tr, 9);
  const name = document.createElement("th");
  name.scope = "row";
  name.className = "name";
  tr.replaceChild(name, c[0]);
  [1, 2, 3, 4, 6].forEach((i) => c[i].classList.add("num"));
  const btn = document.createElement("button");
  btn.type = "button";
  btn.className = "ghost small tail-btn";
  btn.textContent = "Tail";
  btn.setAttribute("aria-label", `Tail ${t.topic}`);
  btn.addEventListener("click", () => {
    tail.start(t.topic, $("tail-from").value).then(markSelected);
    markSelected();
  });
  c[8].append(btn);
  return tr;
}

function updateTopicRow(tr, t) {
  const info = t.info;
  const [name, head, earliest, live, bytes, dur, prio, last] = tr.children;
  if (name.dataset.name !== t.topic || name.dataset.type !== (info ? info.type : "")) {
    name.dataset.name = t.topic;
    name.dataset.type = info ? info.type : "";
    name.replaceChildren(document.createTextNode(t.topic));
    if (info && info.type === "queue") name.append(badge("queue", "queue"));
    name.title = t.topic;
  }
  setText(head, fmtInt(t.head_seq), true);
  setText(earliest, fmtInt(t.earliest_seq));
  setText(live, fmtInt(t.count), true);
  setText(bytes, fmtBytes(t.bytes));
  bytes.title = `${fmtInt(t.bytes)} bytes`;
  const d = info ? info.config.durability : t.durable ? "fsync" : null;
  if (dur.dataset.d !== String(d)) {
    dur.dataset.d = String(d);
    dur.replaceChildren(d ? badge(d, `d-${d}`) : document.createTextNode("–"));
  }
  const manual = info && info.config.priority !== null;
  setText(prio, `${fmtInt(t.effective_priority)}${manual ? " (manual)" : ""}`);
  prio.title = manual ? "set with the topic's priority" : "automatic: recently read topics rank higher";
  const ts = info ? info.last_write_ts : null;
  setText(last, info ? fmtAgo(ts) : "–");
  last.title = fmtIso(ts);
  tr.classList.toggle("selected", tail.topic === t.topic);
}

function markSelected() {
  for (const tr of $("topics-body").children) tr.classList.toggle("selected", tr.dataset.key === tail.topic);
}

function createQueueRow() {
  const tr = document.createElement("tr");
  const c = cells(tr, 6);
  const name = document.createElement("th");
  name.scope = "row";
  name.className = "name";
  tr.replaceChild(name, c[0]);
  [1, 2, 4, 5].forEach((i) => c[i].classList.add("num"));
  const track = document.createElement("span");
  track.className = "bar-track";
  track.setAttribute("role", "img");
  const ready = document.createElement("span");
  ready.className = "ready";
  const leased = document.createElement("span");
  leased.className = "leased";
  track.append(ready, leased);
  c[3].append(track);
  return tr;
}

function updateQueueRow(tr, t) {
  const q = t.info.queue || { ready: 0, in_flight: 0, dead_lettered: 0 };
  const [name, ready, leased, depth, dead, lease] = tr.children;
  setText(name, t.topic);
  setText(ready, fmtInt(q.ready), true);
  setText(leased, fmtInt(q.in_flight), true);
  setText(dead, fmtInt(q.dead_lettered));
  setText(lease, fmtDuration(t.info.config.lease_ms));
  const total = Math.max(1, t.count);
  const track = depth.firstElementChild;
  track.children[0].style.width = `${(100 * q.ready) / total}%`;
  track.children[1].style.width = `${(100 * q.in_flight) / total}%`;
  track.setAttribute(
    "aria-label",
    `${fmtInt(q.ready)} ready and ${fmtInt(q.in_flight)} leased of ${fmtInt(t.count)} live jobs`,
  );
  track.title = track.getAttribute("aria-label");
}

function createRouterRow() {
  const tr = document.createElement("tr");
  const c = cells(tr, 4);
  const name = document.createElement("th");
  name.scope = "row";
  name.className = "name";
  tr.replaceChild(name, c[0]);
  c[1].classList.add("mono");
  c[3].classList.add("num");
  return tr;
}

function updateRouterRow(tr, r) {
  const [name, path, guarantee, fwd] = tr.children;
  setText(name, r.router);
  setText(path, `${r.source} → ${r.dest}`);
  setText(guarantee, (r.guarantee || "").replace(/_/g, " "));
  setText(fwd, fmtInt(r.forwarded_total), true);
}

// ------------------------------------------------------------------ loaders

async function loadTopics() {
  const q = new URLSearchParams({ page_size: String(PAGE_SIZE) });
  if (state.prefix) q.set("prefix", state.prefix);
  const cursor = state.cursors[state.page];
  if (cursor) q.set("cursor", cursor);
  const list = await api(`/v0/topics?${q}`);
  // The listing has no durability class, type or queue counters: ask each topic (touch=false
  // so that looking does not count as reading for its priority).
  const details = await mapLimit(list.topics, DETAIL_CONCURRENCY, (t) =>
    api(`/v0/topics/${seg(t.topic)}?touch=false`),
  );
  for (const d of details) if (!d.ok && d.error instanceof ApiError && d.error.status === 401) throw d.error;
  const rows = list.topics.map((t, i) => ({ ...t, info: details[i].ok ? details[i].value : null }));
  state.nextCursor = list.next_cursor || null;

  syncRows($("topics-body"), rows, (t) => t.topic, createTopicRow, updateTopicRow);
  $("topics-empty").hidden = rows.length > 0 || state.page > 0 || !!state.prefix;
  $("topics-nomatch").hidden = rows.length > 0 || !state.prefix;
  $("page-prev").disabled = state.page === 0;
  $("page-next").disabled = !state.nextCursor;
  $("page-info").textContent = state.page > 0 || state.nextCursor ? `page ${state.page + 1}` : "";
  document.querySelector(".pager").hidden = state.page === 0 && !state.nextCursor;

  const queues = rows.filter((t) => t.info && t.info.type === "queue");
  syncRows($("queues-body"), queues, (t) => t.topic, createQueueRow, updateQueueRow);
  $("queues-empty").hidden = queues.length > 0;
  $("queues-count").textContent = queues.length ? fmtInt(queues.length) : "";

  const names = $("topic-names");
  const wanted = rows.map((t) => t.topic).join("\n");
  if (names.dataset.names !== wanted) {
    names.dataset.names = wanted;
    names.replaceChildren(
      ...rows.map((t) => {
        const o = document.createElement("option");
        o.value = t.topic;
        return o;
      }),
    );
  }
}

async function loadRouters() {
  const res = await api("/v0/routers?page_size=100");
  syncRows($("routers-body"), res.routers, (r) => r.router, createRouterRow, updateRouterRow);
  $("routers-empty").hidden = res.routers.length > 0;
}

const charts = $("charts");
const sparks = {
  records: new Spark(charts, { id: "records", label: "Live records", format: fmtCompact }),
  bytes: new Spark(charts, { id: "bytes", label: "Live bytes", format: fmtBytes }),
  frames: new Spark(charts, { id: "frames", label: "WAL frames", unit: "/s", format: fmtCompact, rate: true }),
  fsyncs: new Spark(charts, { id: "fsyncs", label: "WAL fsyncs", unit: "/s", format: fmtCompact, rate: true }),
  sse: new Spark(charts, { id: "sse", label: "SSE connections", format: fmtCompact }),
  leases: new Spark(charts, { id: "leases", label: "Leases in flight", format: fmtCompact }),
};

async function loadMetrics() {
  const m = await api("/v0/metrics", { accept: "application/json" });
  const t = Date.now();
  const wal = m.wal || null; // a prefix-restricted key gets no instance-wide sections
  sparks.records.push(m.records_live, t);
  sparks.bytes.push(m.bytes_live, t);
  sparks.frames.push(wal ? wal.frames : null, t);
  sparks.fsyncs.push(wal ? wal.fsyncs : null, t);
  sparks.sse.push(m.sse_connections, t);
  sparks.leases.push(m.queue_leases_in_flight, t);
  $("srv-uptime").textContent = fmtDuration(m.uptime_ms);
  $("topics-count").textContent = fmtInt(m.topics);
  $("routers-count").textContent = fmtInt(m.routers);
  return m;
}

async function loadReady() {
  if (state.version === null) {
    try {
      state.version = (await api("/v0/health")).version || "";
      $("srv-version").textContent = state.version || "–";
    } catch {
      // probes may need a key (TOPICS_PROBE_AUTH); the version is only decoration
    }
  }
  try {
    const r = await api("/v0/ready");
    if (r.status === "degraded") {
      const why = Object.keys(r.degraded || {}).join(", ").replace(/_/g, " ");
      setPill("degraded", "warn");
      return `Writes are refused: ${why || "the log is not writable"}. Reads go on.`;
    }
    setPill("ready", "ok");
  } catch (e) {
    if (e instanceof ApiError && e.status === 503) setPill("replaying", "warn");
    else if (e instanceof ApiError && e.status === 0) setPill("unreachable", "bad");
  }
  return null;
}

// ------------------------------------------------------------------ the poll loop

function schedule() {
  clearTimeout(state.timer);
  state.timer = setTimeout(refresh, REFRESH_MS);
}

async function refresh() {
  clearTimeout(state.timer);
  if (state.running) {
    state.again = true;
    return;
  }
  if (document.hidden && state.shown) return schedule();
  state.running = true;
  try {
    const [topics, metrics, routers, ready] = await Promise.allSettled([
      loadTopics(),
      loadMetrics(),
      loadRouters(),
      loadReady(),
    ]);
    const errors = [topics, metrics, routers].filter((r) => r.status === "rejected").map((r) => r.reason);
    if (errors.some((e) => e instanceof ApiError && e.status === 401)) {
      askForToken(getToken() ? "The server refused this key." : "");
      return;
    }
    showMain();
    state.shown = true;
    if (errors.length) {
      banner(...explain(errors[0]));
    } else {
      banner(ready.status === "fulfilled" ? ready.value : null, "");
    }
  } finally {
    state.running = false;
    if (state.again) {
      state.again = false;
      setTimeout(refresh, 0);
    } else if (!state.needAuth) {
      schedule();
    }
  }
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && !state.needAuth) refresh();
});

let prefixTimer = null;
$("prefix").addEventListener("input", (e) => {
  clearTimeout(prefixTimer);
  prefixTimer = setTimeout(() => {
    state.prefix = e.target.value.trim();
    state.cursors = [""];
    state.page = 0;
    refresh();
  }, 250);
});

$("page-next").addEventListener("click", () => {
  if (!state.nextCursor) return;
  state.cursors[state.page + 1] = state.nextCursor;
  state.page++;
  refresh();
});

$("page-prev").addEventListener("click", () => {
  if (state.page === 0) return;
  state.page--;
  refresh();
});

const tail = new Tail(
  {
    form: $("tail-form"),
    topic: $("tail-topic"),
    from: $("tail-from"),
    start: $("tail-start"),
    stop: $("tail-stop"),
    clear: $("tail-clear"),
    status: $("tail-status"),
    statusText: $("tail-status-text"),
    count: $("tail-count"),
    log: $("tail-log"),
  },
  { onAuth: () => askForToken("") },
);
$("tail-form").addEventListener("submit", () => setTimeout(markSelected, 0));
$("tail-stop").addEventListener("click", () => setTimeout(markSelected, 0));

// `?tail=<topic>` opens the tail at load (`&from=new|last|all`).
if (params.get("tail")) {
  const from = params.get("from");
  if (from) $("tail-from").value = from;
  tail.start(params.get("tail"), $("tail-from").value);
}

refresh();
