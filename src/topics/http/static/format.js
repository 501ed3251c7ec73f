// Number, size and time formatting for the console.

const intFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const oneFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

export function fmtInt(n) {
  return n === null || n === undefined || Number.isNaN(n) ? "–" : intFmt.format(n);
}

/** A count with k/M suffixes (for chart headlines). */
export function fmtCompact(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const a = Math.abs(n);
  if (a >= 1e9) return `${oneFmt.format(n / 1e9)}G`;
  if (a >= 1e6) return `${oneFmt.format(n / 1e6)}M`;
  if (a >= 1e4) return `${oneFmt.format(n / 1e3)}k`;
  if (a >= 10 || Number.isInteger(n)) return intFmt.format(n);
  return oneFmt.format(n);
}

export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (n < 1024) return `${intFmt.format(n)} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${oneFmt.format(v)} ${units[i]}`;
}

/** Milliseconds as "3 s", "4 min", "2 h 5 min", "3 d". */
export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d`;
}

/** A past ms timestamp as "12 s ago" ("never" for null). */
export function fmtAgo(ts, now = Date.now()) {
  if (ts === null || ts === undefined) return "never";
  const d = now - ts;
  if (d < 1500) return "just now";
  return `${fmtDuration(d)} ago`;
}

/** A ms timestamp as local HH:MM:SS.mmm. */
export function fmtClock(ts) {
  const d = new Date(ts);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

export function fmtIso(ts) {
  return ts === null || ts === undefined ? "" : new Date(ts).toISOString();
}
