// Live updates: every element with data-live="<fragment url>" is re-fetched when the audit
// trail grows (data-live-incident limits it to one incident's rows). No build step.
(function () {
  "use strict";
  var regions = document.querySelectorAll("[data-live]");
  var status = document.querySelector('[data-test="live-status"]');
  if (!regions.length || !window.EventSource) return;
  var dirty = new Set();
  var timer = null;

  function busy(el) {
    var a = document.activeElement;
    return a && el.contains(a) && (a.tagName === "INPUT" || a.tagName === "TEXTAREA") && a.value;
  }

  function refresh() {
    timer = null;
    dirty.forEach(function (el) {
      if (busy(el)) { schedule(); return; }  // never wipe a reason being typed
      dirty.delete(el);
      fetch(el.dataset.live, { credentials: "same-origin", headers: { accept: "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          el.innerHTML = html;
          el.dispatchEvent(new CustomEvent("relaunch:updated", { bubbles: true }));
        })
        .catch(function () { dirty.add(el); schedule(); });
    });
  }

  function schedule() { if (!timer) timer = setTimeout(refresh, 200); }

  var source = new EventSource("/events");
  source.addEventListener("audit", function (ev) {
    var row;
    try { row = JSON.parse(ev.data); } catch (e) { return; }
    regions.forEach(function (el) {
      var only = el.dataset.liveIncident;
      if (!only || only === row.incident_id) dirty.add(el);
    });
    schedule();
  });
  source.onopen = function () { if (status) { status.textContent = "live"; status.dataset.state = "open"; } };
  source.onerror = function () { if (status) { status.textContent = "reconnecting"; status.dataset.state = "error"; } };
})();
