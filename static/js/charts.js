// Tiny inline-SVG charts, no library: KLCharts.line(el, spec) draws a step line (a best-so-far
// series), KLCharts.bars(el, spec) horizontal bars. Each call replaces what `el` held. Colours come
// from the stylesheet's custom properties, so the charts follow the site's palette. A chart takes
// the width of its container (within limits) at drawing time, so its text keeps its size on a phone.
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";

  function node(name, attrs, parent) {
    const el = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) {
      // Colours go through style: var() is reliable there, in presentation attributes less so.
      if (k === "fill" || k === "stroke") el.style.setProperty(k, attrs[k]);
      else el.setAttribute(k, attrs[k]);
    });
    if (parent) parent.appendChild(el);
    return el;
  }
  function label(parent, x, y, text, attrs) {
    const el = node("text", Object.assign({ x: x, y: y, "font-size": 11, fill: "var(--ink-soft, #555)" }, attrs), parent);
    el.textContent = text;
    return el;
  }
  function width(el) { return Math.max(300, Math.min(720, el.clientWidth || 560)); }
  function canvas(el, W, H, title) {
    const svg = node("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img", "aria-label": title || "chart" });
    svg.style.maxWidth = "100%";
    svg.style.height = "auto";
    svg.style.display = "block";
    el.replaceChildren(svg);
    return svg;
  }
  function fmt(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2); }

  // spec: {points: [[x, y], ...] in x order, xMax, xEnd (where the last value is held to; default
  //        xMax), yMin, yMax (optional), baseline (a y drawn dashed),
  //        xLabel, yLabel, title (the accessible name), empty (text shown with no points)}
  function line(el, spec) {
    const W = width(el), H = 220, L = 48, R = 12, T = 12, B = 34;
    const pts = (spec.points || []).filter(function (p) { return p[1] != null && isFinite(p[1]); });
    const svg = canvas(el, W, H, spec.title);
    const xMax = Math.max(1, spec.xMax || 0, pts.length ? pts[pts.length - 1][0] : 0);
    const ys = pts.map(function (p) { return p[1]; }).concat(spec.baseline != null ? [spec.baseline] : []);
    let yMin = spec.yMin != null ? spec.yMin : Math.min.apply(null, ys.length ? ys : [0]);
    let yMax = spec.yMax != null ? spec.yMax : Math.max.apply(null, ys.length ? ys : [1]);
    if (yMax - yMin < 1e-9) { yMin -= 0.1; yMax += 0.1; }
    const pad = (yMax - yMin) * 0.08;
    yMin -= pad; yMax += pad;
    const sx = function (x) { return L + (W - L - R) * x / xMax; };
    const sy = function (y) { return T + (H - T - B) * (1 - (y - yMin) / (yMax - yMin)); };

    node("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "var(--line, #ccc)" }, svg);
    node("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "var(--line, #ccc)" }, svg);
    [yMin + pad, (yMin + yMax) / 2, yMax - pad].forEach(function (y) {
      label(svg, L - 6, sy(y) + 4, fmt(y), { "text-anchor": "end" });
    });
    [0, Math.round(xMax / 2), xMax].forEach(function (x) { label(svg, sx(x), H - B + 15, String(x), { "text-anchor": "middle" }); });
    if (spec.xLabel) label(svg, (L + W - R) / 2, H - 3, spec.xLabel, { "text-anchor": "middle" });
    if (spec.yLabel) label(svg, 12, T + (H - T - B) / 2, spec.yLabel, { "text-anchor": "middle", transform: "rotate(-90 12 " + (T + (H - T - B) / 2) + ")" });
    if (spec.baseline != null) {
      node("line", { x1: L, x2: W - R, y1: sy(spec.baseline), y2: sy(spec.baseline), stroke: "var(--ink-soft, #777)",
                     "stroke-dasharray": "4 4", "stroke-width": 1 }, svg);
    }
    if (!pts.length) {
      label(svg, (L + W - R) / 2, T + (H - T - B) / 4, spec.empty || "no data yet", { "text-anchor": "middle", "font-size": 13 });
      return svg;
    }
    // A best-so-far series holds its value until the next point: draw steps, not slopes.
    let d = "M" + sx(pts[0][0]) + " " + sy(pts[0][1]);
    for (let i = 1; i < pts.length; i++) d += " H" + sx(pts[i][0]) + " V" + sy(pts[i][1]);
    d += " H" + sx(Math.max(pts[pts.length - 1][0], Math.min(xMax, spec.xEnd != null ? spec.xEnd : xMax)));
    node("path", { d: d, fill: "none", stroke: "var(--accent, #1f5fbf)", "stroke-width": 2 }, svg);
    pts.forEach(function (p) {
      const dot = node("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: "var(--accent, #1f5fbf)" }, svg);
      node("title", {}, dot).textContent = (spec.xLabel || "x") + " " + p[0] + ": " + fmt(p[1]);
    });
    return svg;
  }

  // spec: {bars: [{label, value, fill}], title}
  function bars(el, spec) {
    const rows = spec.bars || [];
    const W = width(el), rowH = 22, L = 120, R = 40;
    const H = Math.max(rowH, rows.length * rowH) + 4;
    const svg = canvas(el, W, H, spec.title);
    const most = Math.max(1, Math.max.apply(null, rows.map(function (r) { return r.value; }).concat([0])));
    rows.forEach(function (r, i) {
      const y = 2 + i * rowH;
      label(svg, L - 6, y + 15, r.label, { "text-anchor": "end", "font-size": 12 });
      const w = (W - L - R) * r.value / most;
      node("rect", { x: L, y: y + 3, width: Math.max(r.value ? 2 : 0, w), height: rowH - 8, rx: 2,
                     fill: r.fill || "var(--accent, #1f5fbf)" }, svg);
      label(svg, L + w + 6, y + 15, String(r.value), { "font-size": 12, fill: "var(--ink, #222)" });
    });
    return svg;
  }

  window.KLCharts = { line: line, bars: bars };
})();
