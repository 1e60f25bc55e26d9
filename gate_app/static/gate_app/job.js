// A job page kept current: over the WebSocket when workers' events can reach the web server
// (a cross-process channel layer), else by polling the job's state. State messages carry the
// whole job; progress messages carry the new progress and one log line.
(function () {
  "use strict";
  const root = document.getElementById("job");
  if (!root) return;
  const stateUrl = root.dataset.stateUrl;
  const terminal = new Set(["succeeded", "failed", "cancelled"]);
  let status = "";

  function field(name) { return root.querySelector('[data-field="' + name + '"]'); }
  function text(name, value) {
    const el = field(name);
    if (!el) return;
    el.textContent = value == null ? "" : String(value);
    if (el.classList.contains("notice")) el.hidden = !value;
  }
  function progress(p) {
    if (!p) return;
    field("fraction").value = p.fraction || 0;
    text("stage", p.stage);
    text("message", p.message);
  }
  function render(job) {
    status = job.status;
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
  if (terminal.has(initial.status)) return;
  if (initial.poll) poll(); else live();
})();
