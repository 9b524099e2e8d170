// Live updates: an EventSource on coordd-web's /events (fed by coordd's event feed).
// On a message, the page's [data-live] parts are fetched again and swapped in place,
// at most once per REFRESH_MS; the stream is closed while the tab is hidden and
// reopened from the last event id when it shows again. No timer re-polls a table.
(function () {
  "use strict";
  var REFRESH_MS = 400;
  var body = document.body;
  var feed = body.dataset.feed;
  var head = body.dataset.head || "0";
  var es = null, timer = null, busy = false, again = false;
  var live = document.getElementById("live");

  function say(text, cls) { if (live) { live.textContent = text; live.className = "live " + (cls || ""); } }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { headers: { "X-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (el) {
          var fresh = el.id && doc.getElementById(el.id);
          if (fresh) { el.replaceWith(fresh); if (window.htmx) { window.htmx.process(fresh); } }
        });
        document.dispatchEvent(new CustomEvent("coordd:refreshed"));
      })
      .catch(function () { say("refresh failed", "bad"); })
      .finally(function () { busy = false; if (again) { again = false; schedule(); } });
  }

  function schedule() {
    if (timer) { return; }
    timer = setTimeout(function () { timer = null; refresh(); }, REFRESH_MS);
  }

  function open() {
    if (es || !feed || !window.EventSource) { return; }
    var url = feed + (feed.indexOf("?") < 0 ? "?" : "&") + "after=" + encodeURIComponent(head);
    es = new EventSource(url);
    es.addEventListener("jobs", function (e) { if (e.lastEventId) { head = e.lastEventId; } say("live", "ok"); schedule(); });
    es.addEventListener("coordd", function (e) {
      var d = JSON.parse(e.data);
      say(d.up ? "live" : "coordd unreachable", d.up ? "ok" : "bad");
    });
    es.onerror = function () { say("reconnecting…", "bad"); };
  }

  function close() { if (es) { es.close(); es = null; } say("paused (tab hidden)", ""); }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { close(); } else { open(); schedule(); }
  });
  if (!feed) { say("", ""); } else if (!document.hidden) { open(); }
  window.coorddLive = { state: function () { return es ? "open" : "closed"; }, head: function () { return head; } };
})();

// Keyboard: g then o/w/j/f/a goes to a page; "/" focuses the jobs filter's text box.
(function () {
  "use strict";
  var pages = { o: "/", w: "/workers", j: "/jobs", f: "/workflows", a: "/agents" };
  var g = false;
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.isContentEditable || /^(INPUT|SELECT|TEXTAREA)$/.test(t.tagName)))) { return; }
    if (e.key === "/") {
      var q = document.querySelector("input[name=q]");
      if (q) { e.preventDefault(); q.focus(); }
      return;
    }
    if (g && pages[e.key]) { location.href = pages[e.key]; }
    g = e.key === "g";
  });
})();
