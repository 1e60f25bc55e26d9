// A job page kept current: over the WebSocket when workers' events can reach the web server
// (a cross-process channel layer), else by polling the job's state. State messages carry the
// whole job; progress messages carry the new progress and one log line. An optimization's
// progress also carries its chart (progress.chart), drawn with KLCharts from whatever state the
// page has, so a reload redraws the run so far. When the job finishes while the page is open, the
// page reloads once: the server renders the outcome (the optimized kernel, the lineage link).
(function () {
  "use strict";
  const root = document.getElementById("job");
  if (!root) return;
  const stateUrl = root.dataset.stateUrl;
  const terminal = new Set(["succeeded", "failed", "cancelled"]);
  const OUTCOME_FILL = { faster: "var(--pass)", not_faster: "var(--baseline)", untimed: "var(--compiled)",
                         unsettled: "var(--notice)",  // passed, but the timing never settled (no decision)
                         rejected: "var(--fail)", gate_error: "var(--error-tone)", not_applicable: "var(--line)",
                         duplicate: "var(--line)", passed_over: "var(--line)",
                         precondition_failed: "var(--line)", same_code: "var(--line)" };  // the last five cost no gate call
  let status = "";

  function field(name) { return root.querySelector('[data-field="' + name + '"]'); }
  function chartPart(name) { return root.querySelector('[data-chart="' + name + '"]'); }
  function text(name, value) {
    const el = field(name);
    if (!el) return;
    el.textContent = value == null ? "" : String(value);
    if (el.classList.contains("notice")) el.hidden = !value;
  }

  function drawChart(chart) {
    if (!chart || !chartPart("speedup") || !window.KLCharts) return;
    const best = chart.speedup == null ? "not timed" : chart.speedup.toFixed(3) + "x";
    chartPart("summary").textContent = chart.tried + " candidate" + (chart.tried === 1 ? "" : "s") + " tried · " +
      chart.evaluations + " of " + chart.budget + " gate evaluations · " + chart.steps + " taken · best speedup " + best;
    KLCharts.line(chartPart("speedup"), {
      points: chart.points.map(function (p) { return [p[0], p[1]]; }), xMax: chart.budget, baseline: 1,
      xEnd: chart.evaluations,
      xLabel: "gate evaluations", yLabel: "best speedup", title: "Best speedup by gate evaluation",
      empty: chart.timed ? "no candidate gated yet" : "compile-only: nothing is timed"
    });
    const outcomes = Object.keys(chart.outcomes).sort();
    KLCharts.bars(chartPart("outcomes"), {
      title: "Candidates by outcome",
      bars: outcomes.map(function (k) { return { label: k.replace("_", " "), value: chart.outcomes[k], fill: OUTCOME_FILL[k] }; })
    });
    const body = chartPart("recent");
    if (!chart.recent.length) return;
    body.replaceChildren.apply(body, chart.recent.map(function (a) {
      const row = document.createElement("tr");
      [a.index, a.transform + (a.card ? " (" + a.card + ")" : ""), a.status, a.ratio == null ? "" : a.ratio.toFixed(3),
       a.message].forEach(function (value, i) {
        const cell = document.createElement("td");
        cell.textContent = String(value);
        if (i === 3) cell.className = "num";
        if (i === 4) cell.className = "small";
        row.appendChild(cell);
      });
      return row;
    }));
  }

  function progress(p) {
    if (!p) return;
    field("fraction").value = p.fraction || 0;
    text("stage", p.stage);
    text("message", p.message);
    drawChart(p.chart);
  }
  function render(job) {
    const was = status;
    status = job.status;
    if (was && !terminal.has(was) && terminal.has(job.status)) { location.reload(); return; }
    ["status", "needs", "attempts", "worker_id", "waiting", "error"].forEach(function (k) { text(k, job[k]); });
    progress(job.progress);
    if (job.log !== undefined) text("log", job.log);
    text("result", job.result ? JSON.stringify(job.result, null, 1) : "none yet");
  }
  function appendLog(line) {
    const el = field("log");
    el.textContent += line + "\n";
  }

  function poll() {
    text("transport", "Updated by polling every second.");
    fetch(stateUrl, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (job) { render(job); if (!terminal.has(job.status)) setTimeout(poll, 1000); })
      .catch(function () { setTimeout(poll, 3000); });
  }

  function live() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/jobs/" + root.dataset.job + "/");
    let fellBack = false;
    function fallBack() { if (!fellBack && !terminal.has(status)) { fellBack = true; poll(); } }
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "state") {
        render(message.job);
        if (message.job.poll) { fellBack = true; socket.close(); poll(); }
      } else if (message.type === "progress") {
        progress(message.progress);
        if (message.log) appendLog(message.log);
      }
    };
    socket.onerror = fallBack;
    socket.onclose = fallBack;
  }

  const initial = JSON.parse(document.getElementById("job-state").textContent);
  status = initial.status;
  drawChart(initial.progress && initial.progress.chart);
  if (terminal.has(initial.status)) return;
  if (initial.poll) poll(); else live();
})();
