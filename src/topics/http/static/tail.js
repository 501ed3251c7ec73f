// The live tail: one watch session (POST /v0/watch) streamed with EventSource.

import { api, ApiError, seg, streamUrl } from "./api.js";
import { fmtClock, fmtInt, fmtIso } from "./format.js";

const MAX_ROWS = 500; // oldest rows are dropped past this
const LAST_N = 50; // "last 50 records"
const DATA_CHARS = 400; // a record's JSON is cut here in the list

const REASONS = {
  from_seq_too_old: "older than the topic's earliest record",
  cap: "evicted by the topic's cap",
  ttl: "expired by the topic's TTL",
  mixed: "evicted by cap and TTL",
  source_trim: "the router's source dropped them before forwarding",
  recreated: "the topic was deleted and created again",
  corrupt: "unreadable after a repair",
};

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n)}…` : text;
}

function span(cls, text) {
  const el = document.createElement("span");
  el.className = cls;
  el.textContent = text;
  return el;
}

export class Tail {
  /** `els`: the form's elements; `onAuth()` is called when the server wants a key. */
  constructor(els, { onAuth }) {
    this.els = els;
    this.onAuth = onAuth;
    this.es = null;
    this.topic = null;
    this.cursor = null; // last seq handed to us (records or a gap), for a new session
    this.gen = 0; // bumps on every start/stop so late callbacks of an old stream do nothing
    this.retry = null;
    this.received = 0;
    this.head = null;

    els.form.addEventListener("submit", (e) => {
      e.preventDefault();
      const topic = els.topic.value.trim();
      if (topic) this.start(topic, els.from.value);
    });
    els.stop.addEventListener("click", () => this.stop("Stopped."));
    els.clear.addEventListener("click", () => {
      els.log.replaceChildren();
    });
  }

  get active() {
    return this.topic !== null;
  }

  /** Tail `topic` from `from`: "new", "last" (the last 50 records) or "all". */
  async start(topic, from = "last") {
    this.stop(null);
    const gen = ++this.gen;
    this.topic = topic;
    this.cursor = null;
    this.received = 0;
    this.head = null;
    this.els.topic.value = topic;
    this.els.log.replaceChildren();
    this.els.stop.disabled = false;
    this.status("wait", `Opening ${topic}…`);
    try {
      let spec;
      if (from === "new") {
        spec = { tail: true };
      } else if (from === "all") {
        spec = { from_seq: 0 };
      } else {
        const info = await api(`/v0/topics/${seg(topic)}?touch=false`);
        spec = { from_seq: Math.max(0, info.earliest_seq - 1, info.head_seq - LAST_N) };
      }
      if (gen !== this.gen) return;
      await this.open(spec, gen);
    } catch (e) {
      if (gen === this.gen) this.failed(e, gen);
    }
  }

  /** Close the stream; `message` (when not null) is shown as the status. */
  stop(message) {
    this.gen++;
    if (this.es) this.es.close();
    this.es = null;
    clearTimeout(this.retry);
    this.retry = null;
    this.topic = null;
    this.els.stop.disabled = true;
    if (message !== null) this.status("", message);
  }

  async open(spec, gen) {
    const topic = this.topic;
    const w = await api("/v0/watch", {
      method: "POST",
      body: { topics: { [topic]: spec }, include_tags: true, limit: 200 },
    });
    if (gen !== this.gen) return;
    const start = w.topics && w.topics[topic];
    if (start && this.cursor === null) {
      this.cursor = start.from_seq;
      this.head = start.head_seq;
    }
    const es = new EventSource(streamUrl(w.stream_url));
    this.es = es;
    const live = (fn) => (e) => {
      if (gen === this.gen) fn(e);
    };
    es.addEventListener(
      "open",
      live(() => this.status("live", this.liveText())),
    );
    es.addEventListener(
      "record",
      live((e) => this.onRecords(JSON.parse(e.data))),
    );
    es.addEventListener(
      "tombstone",
      live((e) => this.onTombstone(JSON.parse(e.data))),
    );
    es.addEventListener(
      "caught-up",
      live((e) => {
        this.head = JSON.parse(e.data).head_seq;
        this.status("live", this.liveText());
      }),
    );
    es.addEventListener(
      "topic-deleted",
      live(() => {
        this.note(`The topic ${topic} was deleted.`);
        this.stop(null);
        this.status("bad", `${topic} was deleted; the tail stopped.`);
      }),
    );
    es.addEventListener(
      "error",
      live((e) => {
        if (e.data) {
          // The server's own `error` frame: it is shutting down; the browser reconnects.
          this.status("wait", "The server is shutting down; reconnecting…");
          return;
        }
        if (es.readyState === EventSource.CLOSED) {
          // Refused for good (the session expired or the server restarted): a new session
          // picks up after the last seq we saw.
          this.es = null;
          this.status("wait", "Stream closed; opening a new one…");
          this.reopen(gen, 2000);
        } else {
          this.status("wait", "Connection lost; reconnecting…");
        }
      }),
    );
  }

  reopen(gen, delay) {
    clearTimeout(this.retry);
    this.retry = setTimeout(async () => {
      if (gen !== this.gen) return;
      const spec = this.cursor === null ? { tail: true } : { from_seq: this.cursor };
      try {
        await this.open(spec, gen);
      } catch (e) {
        if (gen === this.gen) this.failed(e, gen);
      }
    }, delay);
  }

  failed(e, gen) {
    const topic = this.topic;
    if (e instanceof ApiError && e.status === 401) {
      this.stop(null);
      this.status("bad", "The server wants an API key.");
      this.onAuth();
    } else if (e instanceof ApiError && e.status === 404) {
      this.stop(null);
      this.status("bad", `No topic named ${topic}.`);
    } else if (e instanceof ApiError && (e.status === 0 || e.status === 503 || e.status === 429)) {
      this.status("wait", `${e.message}; retrying…`);
      this.reopen(gen, 3000);
    } else {
      this.stop(null);
      this.status("bad", `Cannot tail ${topic}: ${e.message || e}`);
    }
  }

  liveText() {
    return `Live: ${this.topic}`;
  }

  /** The state, in the polite live region; the running counts sit outside it. */
  status(kind, text) {
    this.els.status.className = `tail-status ${kind}`;
    if (this.els.statusText.textContent !== text) this.els.statusText.textContent = text;
    this.count();
  }

  count() {
    const parts = [];
    if (this.topic !== null) {
      parts.push(`${fmtInt(this.received)} record${this.received === 1 ? "" : "s"} received`);
      if (this.head !== null) parts.push(`head seq ${fmtInt(this.head)}`);
    }
    this.els.count.textContent = parts.length ? `· ${parts.join(" · ")}` : "";
  }

  onRecords(frame) {
    const rows = frame.records.map((r) => this.recordRow(r));
    this.append(rows);
    this.received += frame.records.length;
    this.cursor = frame.to_seq;
    this.head = frame.head_seq;
    this.status("live", this.liveText());
  }

  onTombstone(t) {
    const li = document.createElement("li");
    li.className = "tombstone";
    li.dataset.gapFrom = t.gap_from;
    li.dataset.gapTo = t.gap_to;
    li.append(span("seq", "gap"), span("kind", "tombstone"));
    const n = t.gap_to - t.gap_from + 1;
    const range = t.gap_from === t.gap_to ? `seq ${fmtInt(t.gap_from)}` : `seqs ${fmtInt(t.gap_from)}–${fmtInt(t.gap_to)}`;
    li.append(
      span(
        "body",
        `${range} gone (${fmtInt(n)} record${n === 1 ? "" : "s"}): ${REASONS[t.reason] || t.reason}. ` +
          `Reading resumes at ${fmtInt(t.earliest_seq)}.`,
      ),
    );
    li.title = `reason: ${t.reason}`;
    this.append([li]);
    this.cursor = t.gap_to;
    this.head = t.head_seq;
  }

  recordRow(r) {
    const li = document.createElement("li");
    li.className = "record new";
    li.dataset.seq = r.$seq;
    li.append(span("seq", fmtInt(r.$seq)));
    const time = document.createElement("time");
    time.dateTime = fmtIso(r.$ts);
    time.textContent = fmtClock(r.$ts);
    li.append(time);
    const body = document.createElement("span");
    body.className = "body";
    const json = JSON.stringify(r.data === undefined ? null : r.data);
    const code = span("data", clip(json, DATA_CHARS));
    if (json.length > DATA_CHARS) code.title = clip(json, 4000);
    body.append(code);
    if (r.$tag !== undefined || r.$node !== undefined) {
      const labels = span("labels", "");
      if (r.$tag !== undefined) labels.append(span("tag", r.$tag));
      if (r.$node !== undefined) labels.append(span("node", r.$node));
      body.append(labels);
    }
    if (r.meta !== undefined) body.append(span("meta", `meta ${clip(JSON.stringify(r.meta), 120)}`));
    li.append(body);
    return li;
  }

  note(text) {
    const li = document.createElement("li");
    li.className = "note";
    li.append(span("seq", ""), span("kind", ""), span("body", text));
    this.append([li]);
  }

  append(rows) {
    const log = this.els.log;
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 48;
    log.append(...rows);
    while (log.childElementCount > MAX_ROWS) log.firstElementChild.remove();
    if (atBottom) log.scrollTop = log.scrollHeight;
  }
}
