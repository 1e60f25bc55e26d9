// The lineage page: a step's diff is fetched when its <details> first opens (the page itself carries
// none, so a 60-step lineage stays small), and the filter form hides steps in the table and timeline.
(function () {
  function loadDiff(details) {
    if (!details.open || details.dataset.loaded) return;
    details.dataset.loaded = "1";
    var slot = details.querySelector(".diff-slot");
    slot.textContent = "Loading the diff…";
    fetch(details.dataset.src, {headers: {"X-Fragment": "1"}, credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error(r.status + " " + r.statusText); return r.text(); })
      .then(function (html) { slot.innerHTML = html; })
      .catch(function (e) { slot.textContent = "The diff did not load (" + e.message + "). "; delete details.dataset.loaded; });
  }

  function applyFilters(form) {
    var accepted = form.elements.accepted.checked, rejected = form.elements.rejected.checked;
    var least = parseFloat(form.elements.change.value) || 0;
    var shown = 0;
    function keep(node) {
      var kind = node.dataset.kind;
      if (kind === "accepted" && !accepted) return false;
      if (kind === "rejected" && !rejected) return false;
      if (least > 0) {
        var change = parseFloat(node.dataset.change);
        if (isNaN(change) || change <= least) return false;
      }
      return true;
    }
    document.querySelectorAll("#step-table tbody tr").forEach(function (row) {
      var visible = keep(row);
      row.hidden = !visible;
      if (visible) shown += 1;
    });
    document.querySelectorAll(".timeline [data-kind]").forEach(function (node) { node.hidden = !keep(node); });
    document.getElementById("step-count").textContent = shown + " step" + (shown === 1 ? "" : "s") + " shown";
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("details[data-src]").forEach(function (details) {
      details.addEventListener("toggle", function () { loadDiff(details); });
      loadDiff(details);  // opened by a link to it (anchors.js) before this ran
    });
    var form = document.getElementById("step-filters");
    if (!form) return;
    form.addEventListener("input", function () { applyFilters(form); });
    form.addEventListener("submit", function (e) { e.preventDefault(); applyFilters(form); });
  });
})();
