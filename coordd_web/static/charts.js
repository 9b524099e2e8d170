// The overview's chart: jobs that ended per minute (uPlot), redrawn after a live refresh.
// Times on the x axis and in the legend are 24-hour UTC, as everywhere on the site.
(function () {
  "use strict";
  var plot = null;
  function css(name) { return getComputedStyle(document.body).getPropertyValue(name).trim() || "#888"; }
  function two(n) { return (n < 10 ? "0" : "") + n; }
  function hhmm(ts) { var d = new Date(ts * 1000); return two(d.getUTCHours()) + ":" + two(d.getUTCMinutes()); }
  function width(el) { return Math.max(280, el.clientWidth); }
  function draw() {
    var el = document.getElementById("rates-chart");
    var src = document.getElementById("rates-data");
    if (!el || !src || !window.uPlot) { return; }
    var d = JSON.parse(src.textContent);
    var rate = d.ok.map(function (ok, i) { var all = ok + d.bad[i]; return all ? 100 * d.bad[i] / all : null; });
    if (plot) { plot.destroy(); plot = null; }
    el.textContent = "";
    var opts = {
      width: width(el), height: 200,
      tzDate: function (ts) { return window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); },
      axes: [{ stroke: css("--fg"), values: function (u, ticks) { return ticks.map(hhmm); } },
             { stroke: css("--fg"), label: "jobs/min" },
             { side: 1, stroke: css("--fg"), label: "failed %", scale: "%", grid: { show: false } }],
      scales: { "%": { range: [0, 100] } },
      series: [{ label: "UTC", value: function (u, v) { return v == null ? "--" : hhmm(v); } },
               { label: "succeeded", stroke: css("--ok"), width: 2 },
               { label: "failed", stroke: css("--bad"), width: 2 },
               { label: "skipped", stroke: css("--warn"), width: 1 },
               { label: "cancelled", stroke: css("--muted"), width: 1, dash: [2, 3] },
               { label: "failed %", stroke: css("--rate"), scale: "%", dash: [4, 4] }]
    };
    var zeros = d.t.map(function () { return 0; });
    plot = new window.uPlot(opts, [d.t, d.ok, d.bad, d.skip || zeros, d.gone || zeros, rate], el);
    window.coorddChart = plot;  // for the browser test: the axes' tick labels
  }
  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("coordd:refreshed", draw);
  window.addEventListener("resize", function () { if (plot) { plot.setSize({ width: width(document.getElementById("rates-chart")), height: 200 }); } });
})();
