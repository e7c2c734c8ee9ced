// Live rows for a run's flow: one EventSource per open run page.
// Each "call" event carries one row's HTML (id call-<seq>): it replaces the
// row it updates (a running call that finished) or goes in at its place by seq.
// Rows older than the first one shown are left to "Load earlier".
(function () {
  "use strict";

  function rowFrom(html) {
    var template = document.createElement("template");
    template.innerHTML = html.trim();
    return template.content.firstElementChild;
  }

  function place(flow, row) {
    var old = document.getElementById(row.id);
    if (old) { old.replaceWith(row); return true; }
    var seq = Number(row.dataset.seq);
    var rows = flow.querySelectorAll("li.item");
    if (rows.length && seq < Number(rows[0].dataset.seq)) return false;
    for (var i = rows.length - 1; i >= 0; i--) {
      if (Number(rows[i].dataset.seq) < seq) { rows[i].after(row); return true; }
    }
    flow.appendChild(row);
    return true;
  }

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  }

  function markOpen() {
    var opened = document.querySelector("#detail article.call");
    var seq = opened ? opened.dataset.seq : null;
    document.querySelectorAll("#flow li.item").forEach(function (li) {
      li.classList.toggle("open", li.dataset.seq === seq);
    });
  }

  function start() {
    var flow = document.getElementById("flow");
    if (!flow || !window.EventSource) return;
    var source = new EventSource(flow.dataset.events);
    source.addEventListener("call", function (event) {
      var current = document.getElementById("flow");  // htmx's history restore replaces it
      var follow = nearBottom();
      var row = rowFrom(event.data);
      if (current && row && place(current, row)) {
        if (window.htmx) window.htmx.process(row);
        markOpen();
        if (follow) row.scrollIntoView({block: "end"});
      }
    });
    document.body.addEventListener("htmx:afterSettle", markOpen);
    markOpen();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
