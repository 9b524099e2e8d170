// The overview's chart: finished jobs per minute (uPlot), redrawn after a live refresh.
(function () {
  "use strict";
  var plot = null;
  function css(name) { return getComputedStyle(document.body).getPropertyValue(name).trim() || "#888"; }
  function draw() {
    var el = document.getElementById("rates-chart");
    var src = document.getElementById("rates-data");
    if (!el || !src || !window.uPlot) { return; }
    var d = JSON.parse(src.textContent);
    var rate = d.ok.map(function (ok, i) { var all = ok + d.bad[i]; return all ? 100 * d.bad[i] / all : null; });
    if (plot) { plot.destroy(); plot = null; }
    el.textContent = "";
    var opts = {
      width: Math.max(280, el.clientWidth), height: 200,
      axes: [{ stroke: css("--fg") }, { stroke: css("--fg"), label: "jobs/min" },
             { side: 1, stroke: css("--fg"), label: "failed %", scale: "%", grid: { show: false } }],
      scales: { "%": { range: [0, 100] } },
      series: [{}, { label: "succeeded", stroke: css("--ok"), width: 2 },
               { label: "failed", stroke: css("--bad"), width: 2 },
               { label: "failed %", stroke: css("--warn"), scale: "%", dash: [4, 4] }]
    };
    plot = new window.uPlot(opts, [d.t, d.ok, d.bad, rate], el);
  }
  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("coordd:refreshed", draw);
  window.addEventListener("resize", function () { if (plot) { var el = document.getElementById("rates-chart"); plot.setSize({ width: Math.max(280, el.clientWidth), height: 200 }); } });
})();
