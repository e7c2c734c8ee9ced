// Live rows for a run's flow: one EventSource per open run page.
// Each "call" event carries one row's HTML (id call-<seq>): it replaces the
// row it updates (a running call that finished) or goes in at its place by seq.
// Rows older than the first one shown are left to "Load earlier".
//
// The stream always starts after what the page shows whole: the last row of
// the unbroken run of finished rows from the first one shown. So a page
// restored by Back or Forward (fetched from the record: the run page keeps no
// history snapshot), or shown again from the browser's cache, asks the record
// for every row it lacks, a gap in the middle included. A page that stops
// before the newest call ("Load later") streams nothing until it reaches it.
(function () {
  "use strict";

  var source = null;

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
    var later = flow.querySelector("li.later");
    if (later) later.before(row); else flow.appendChild(row);
    return true;
  }

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
  }

  function markOpen() {
    var opened = document.querySelector("#detail article.call");
    var row = opened ? document.getElementById("call-" + opened.dataset.seq) : null;
    document.querySelectorAll("#flow li.open").forEach(function (li) {
      if (li !== row) li.classList.remove("open");
    });
    if (row) row.classList.add("open");
  }

  // The seq after which the stream must send: the end of the unbroken run of
  // finished rows from the first row shown (the page's own point when it has none).
  function resumePoint(flow) {
    var rows = flow.querySelectorAll("li.item");
    if (!rows.length) {
      var match = /[?&]after=(\d+)/.exec(flow.dataset.events || "");
      return match ? Number(match[1]) : 0;
    }
    var after = Number(rows[0].dataset.seq) - 1;
    for (var i = 0; i < rows.length; i++) {
      var seq = Number(rows[i].dataset.seq);
      if (seq !== after + 1 || rows[i].classList.contains("running")) break;
      after = seq;
    }
    return after;
  }

  function stop() {
    if (source) { source.close(); source = null; }
  }

  function connect() {
    stop();
    var flow = document.getElementById("flow");
    if (!flow || !window.EventSource || !flow.dataset.eventsBase) return;
    if (flow.querySelector("li.later")) return;  // not at the newest call yet
    source = new EventSource(flow.dataset.eventsBase + "?after=" + resumePoint(flow));
    source.addEventListener("call", function (event) {
      var current = document.getElementById("flow");
      var follow = nearBottom();
      var row = rowFrom(event.data);
      if (current && row && place(current, row)) {
        if (window.htmx) window.htmx.process(row);
        markOpen();
        if (follow) row.scrollIntoView({block: "end"});
      }
    });
  }

  function start() {
    connect();
    markOpen();
    document.body.addEventListener("htmx:afterSettle", function (event) {
      markOpen();
      // the last "Load later" page reached the newest call: live updates start now
      if (!source && event.target && event.target.closest && event.target.closest("#flow")) connect();
    });
    document.body.addEventListener("htmx:historyRestore", function () { connect(); markOpen(); });
    window.addEventListener("pageshow", function (event) { if (event.persisted) connect(); });
    window.addEventListener("pagehide", stop);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
