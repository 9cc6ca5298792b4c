// The inspector's charts, drawn as SVG from numbers only (a box plot of Q, line charts of Q histories and of learning
// curves). Loaded before app.js, whose el(), setProps() and fmt() they use; text reaches them through textContent
// only, like every other part of the page (app.js says why).

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2757c7", "#d9822b", "#1d7f4e", "#b3372f", "#7b52ab", "#2b8a9e", "#8c6d1f", "#c2417b"];
const DASHES = ["", "6 3", "2 3", "8 3 2 3"];

function svg(tag, props, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setProps(node, props);
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

function qBoxPlot(stats, settings) {
  const [lo, hi] = [settings.reward_min, settings.reward_max];
  const width = 360, height = 92, left = 16, right = 16;
  const x = (value) => left + ((value - lo) / (hi - lo)) * (width - left - right);
  const chart = svg("svg", { width, height, id: "q-distribution", role: "img", "aria-label": "Q distribution" },
    svg("text", { x: left, y: 14, class: "title" }, "Q distribution"));
  const axisY = 66;
  chart.append(svg("line", { x1: x(lo), x2: x(hi), y1: axisY, y2: axisY, class: "axis" }));
  for (const tick of [lo, (lo + hi) / 2, hi]) {
    chart.append(svg("line", { x1: x(tick), x2: x(tick), y1: axisY, y2: axisY + 4, class: "axis" }),
      svg("text", { x: x(tick), y: axisY + 16, "text-anchor": "middle" }, String(tick)));
  }
  const q = stats.q;
  if (!q) {
    chart.append(svg("text", { x: width / 2, y: 44, "text-anchor": "middle" }, "no memory yet"));
    return chart;
  }
  const mid = 42;
  chart.append(
    svg("line", { x1: x(q.min), x2: x(q.max), y1: mid, y2: mid, stroke: "#5d6778" }),
    svg("line", { x1: x(q.min), x2: x(q.min), y1: mid - 7, y2: mid + 7, stroke: "#5d6778" }),
    svg("line", { x1: x(q.max), x2: x(q.max), y1: mid - 7, y2: mid + 7, stroke: "#5d6778" }),
    svg("rect", { x: x(q.p25), y: mid - 12, width: Math.max(1, x(q.p75) - x(q.p25)), height: 24,
      fill: "#dbe5fb", stroke: "#2757c7" }),
    svg("line", { x1: x(q.median), x2: x(q.median), y1: mid - 12, y2: mid + 12, stroke: "#2757c7",
      "stroke-width": 2 }),
    svg("circle", { cx: x(q.mean), cy: mid, r: 3, fill: "#d9822b" },
      svg("title", {}, "mean " + fmt(q.mean))),
    svg("title", {}, `min ${fmt(q.min)}, p25 ${fmt(q.p25)}, median ${fmt(q.median)}, p75 ${fmt(q.p75)}, ` +
      `max ${fmt(q.max)}, mean ${fmt(q.mean)}`),
  );
  const caption = el("div", { class: "note" },
    `median ${fmt(q.median)} · middle half ${fmt(q.p25)} to ${fmt(q.p75)} · mean ${fmt(q.mean)} (dot)`);
  return el("div", {}, chart, caption);
}

// A line chart in SVG: one series per setting (colours and dashes differ, so equal curves stay visible).
function lineChart({ title, xLabel, yMin, yMax, series, integerX }) {
  const width = 460, height = 280, left = 44, right = 12, top = 26, bottom = 40;
  const xs = series.flatMap((s) => s.points.map((p) => p.x));
  const xMin = Math.min(...xs, integerX ? 1 : 0), xMax = Math.max(...xs, xMin + 1);
  const X = (v) => left + ((v - xMin) / (xMax - xMin)) * (width - left - right);
  const Y = (v) => top + (1 - (v - yMin) / (yMax - yMin)) * (height - top - bottom);
  const chart = svg("svg", { width, height, class: "chart", role: "img", "aria-label": title },
    svg("text", { x: left, y: 16, class: "title" }, title));
  for (let i = 0; i <= 4; i++) {
    const v = yMin + ((yMax - yMin) * i) / 4;
    chart.append(svg("line", { x1: left, x2: width - right, y1: Y(v), y2: Y(v), class: "grid" }),
      svg("text", { x: left - 6, y: Y(v) + 4, "text-anchor": "end" }, fmt(v, 2)));
  }
  const step = Math.max(1, Math.ceil((xMax - xMin) / 10));
  for (let v = xMin; v <= xMax; v += integerX ? step : (xMax - xMin) / 5) {
    const tick = integerX ? v : Math.round(v * 10) / 10;
    chart.append(svg("text", { x: X(tick), y: height - bottom + 16, "text-anchor": "middle" }, String(tick)));
  }
  chart.append(svg("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "axis" }),
    svg("line", { x1: left, x2: left, y1: top, y2: height - bottom, class: "axis" }),
    svg("text", { x: (left + width - right) / 2, y: height - 6, "text-anchor": "middle" }, xLabel));
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const banded = s.points.filter((p) => p.std !== null && p.std !== undefined);
    if (banded.length > 1) {
      const upper = banded.map((p) => `${X(p.x)},${Y(Math.min(yMax, p.y + p.std))}`);
      const lower = banded.map((p) => `${X(p.x)},${Y(Math.max(yMin, p.y - p.std))}`).reverse();
      chart.append(svg("polygon", { points: [...upper, ...lower].join(" "), fill: color, "fill-opacity": 0.15 }));
    }
    chart.append(svg("polyline", { points: s.points.map((p) => `${X(p.x)},${Y(p.y)}`).join(" "), fill: "none",
      stroke: color, "stroke-width": 2, "stroke-dasharray": DASHES[i % DASHES.length] || null }));
    for (const p of s.points) {
      chart.append(svg("circle", { cx: X(p.x), cy: Y(p.y), r: p.partial ? 4.5 : 3.2, fill: p.partial ? "#fff" : color,
        stroke: color, "stroke-width": 1.5, class: "point" },
        svg("title", {}, `${s.label}: ${xLabel} ${p.x}, ${fmt(p.y)}` + (p.std ? ` ± ${fmt(p.std)}` : "") +
          (p.partial ? " (partial)" : ""))));
    }
  });
  const legend = el("div", { class: "legend" }, series.map((s, i) => el("span", { class: "legend-item" },
    svg("svg", { width: 22, height: 8 }, svg("line", { x1: 0, x2: 22, y1: 4, y2: 4, stroke: COLORS[i % COLORS.length],
      "stroke-width": 2, "stroke-dasharray": DASHES[i % DASHES.length] || null })), " ", s.label)));
  return el("figure", { class: "figure" }, chart, series.length > 1 || series[0].label !== "Q" ? legend : null);
}
