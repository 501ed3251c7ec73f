// Small SVG sparklines: one card per metric, a rolling window of samples.

const NS = "http://www.w3.org/2000/svg";
const W = 120;
const H = 32;
const MIN_SLOTS = 12;

function svgEl(name, attrs) {
  const el = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

/**
 * One chart card. `rate: true` turns a counter into a per-second rate between
 * samples; `format` renders a value; `size` is how many samples are kept.
 */
export class Spark {
  constructor(list, { id, label, unit = "", format, rate = false, size = 60 }) {
    this.label = label;
    this.unit = unit;
    this.format = format;
    this.rate = rate;
    this.size = size;
    this.values = [];
    this.prev = null; // {value, t} of the last counter sample (rate charts)

    this.li = document.createElement("li");
    this.li.className = "chart";
    this.li.id = `chart-${id}`;
    const h = document.createElement("h3");
    h.id = `chart-${id}-label`;
    h.textContent = label;
    this.val = document.createElement("p");
    this.val.className = "val";
    this.val.textContent = "–";
    this.svg = svgEl("svg", {
      viewBox: `0 0 ${W} ${H}`,
      preserveAspectRatio: "none",
      role: "img",
    });
    this.title = svgEl("title", {});
    this.svg.append(this.title);
    this.svg.append(svgEl("line", { class: "base", x1: 0, x2: W, y1: H, y2: H }));
    this.area = svgEl("path", { class: "area", d: "" });
    this.line = svgEl("path", { class: "line", d: "" });
    this.svg.append(this.area, this.line);
    this.range = document.createElement("p");
    this.range.className = "range";
    this.li.append(h, this.val, this.svg, this.range);
    list.append(this.li);
  }

  /** Add a sample (`null` when the metric is absent); `t` in ms. */
  push(value, t = Date.now()) {
    let v = value;
    if (this.rate) {
      if (value === null || value === undefined) {
        v = null;
        this.prev = null;
      } else {
        const p = this.prev;
        this.prev = { value, t };
        // The first sample, or a counter that went back (a restart), gives no rate.
        v = p && t > p.t && value >= p.value ? ((value - p.value) * 1000) / (t - p.t) : null;
        if (!p) return this.render();
      }
    }
    this.values.push(v === undefined ? null : v);
    if (this.values.length > this.size) this.values.shift();
    this.render();
  }

  render() {
    const vals = this.values;
    const last = vals.length ? vals[vals.length - 1] : null;
    this.val.textContent = last === null ? "–" : this.format(last);
    if (this.unit && last !== null) {
      const small = document.createElement("small");
      small.textContent = this.unit;
      this.val.append(small);
    }
    const nums = vals.filter((v) => v !== null);
    const max = Math.max(1, ...nums);
    const min = Math.min(0, ...nums);
    // The window stretches over the width until it holds `MIN_SLOTS`, then scrolls.
    const slots = Math.min(this.size, Math.max(vals.length, MIN_SLOTS));
    const step = W / Math.max(1, slots - 1);
    const x0 = W - (vals.length - 1) * step;
    const y = (v) => H - ((v - min) / (max - min)) * (H - 2) - 1;
    let d = "";
    let area = "";
    let run = [];
    const flush = () => {
      if (!run.length) return;
      const pts = run.map(([x, v]) => `${x.toFixed(2)},${y(v).toFixed(2)}`);
      d += `M${pts.join("L")}`;
      area += `M${run[0][0].toFixed(2)},${H}L${pts.join("L")}L${run[run.length - 1][0].toFixed(2)},${H}Z`;
      run = [];
    };
    vals.forEach((v, i) => {
      if (v === null) flush();
      else run.push([x0 + i * step, v]);
    });
    flush();
    this.line.setAttribute("d", d);
    this.area.setAttribute("d", area);
    if (nums.length) {
      const lo = Math.min(...nums);
      const hi = Math.max(...nums);
      const span = `over the last ${vals.length} samples`;
      this.range.textContent = `min ${this.format(lo)} · max ${this.format(hi)}`;
      this.title.textContent = `${this.label}: now ${this.format(last ?? 0)}${this.unit}, ${span} between ${this.format(lo)} and ${this.format(hi)}`;
    } else {
      this.range.textContent = "no data yet";
      this.title.textContent = `${this.label}: no data yet`;
    }
  }
}
