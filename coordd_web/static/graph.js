// The workflow graph: laid out by dagre, drawn as SVG; nodes coloured by state (CSS
// classes st-STATUS), edges labelled with their policy; a node links to its job.
// dagre keys nodes in plain objects: ids are prefixed ("n:" + name), so a node named
// __proto__ or constructor is a node like any other.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function key(name) { return "n:" + name; }
  function draw() {
    var box = document.getElementById("graph");
    var src = document.getElementById("graph-data");
    if (!box || !src || !window.dagre) { return; }
    var data = JSON.parse(src.textContent);
    var g = new window.dagre.graphlib.Graph();
    g.setGraph({ rankdir: "LR", nodesep: 30, ranksep: 70, marginx: 10, marginy: 10 });
    g.setDefaultEdgeLabel(function () { return {}; });
    data.nodes.forEach(function (n) { g.setNode(key(n.id), { width: 130, height: 44, n: n }); });
    data.edges.forEach(function (e) { g.setEdge(key(e.from), key(e.to), { label: e.policy, width: 40, height: 14, labelpos: "c" }); });
    window.dagre.layout(g);
    var gg = g.graph();
    box.textContent = "";
    var svg = el("svg", { viewBox: "0 0 " + (gg.width || 10) + " " + (gg.height || 10), width: "100%", role: "img", "class": "dag" }, box);
    var defs = el("defs", {}, svg);
    var m = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "8", markerHeight: "8", orient: "auto" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", "class": "arrowhead" }, m);
    g.edges().forEach(function (e) {
      var ed = g.edge(e);
      var d = ed.points.map(function (p, i) { return (i ? "L" : "M") + p.x + "," + p.y; }).join(" ");
      el("path", { d: d, "class": "edge edge-" + ed.label, "marker-end": "url(#arrow)" }, svg);
      var t = el("text", { x: ed.x, y: ed.y, "class": "edge-label", "text-anchor": "middle" }, svg);
      t.textContent = ed.label;
    });
    g.nodes().forEach(function (id) {
      var nd = g.node(id);
      var a = el("a", { href: nd.n.href, "data-node": nd.n.id, "data-status": nd.n.status }, svg);
      el("rect", { x: nd.x - nd.width / 2, y: nd.y - nd.height / 2, width: nd.width, height: nd.height, rx: 6, "class": "node st-" + nd.n.status }, a);
      var t1 = el("text", { x: nd.x, y: nd.y - 3, "text-anchor": "middle", "class": "node-name" }, a);
      t1.textContent = nd.n.id;
      var t2 = el("text", { x: nd.x, y: nd.y + 13, "text-anchor": "middle", "class": "node-status" }, a);
      t2.textContent = nd.n.status;
    });
  }
  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("coordd:refreshed", draw);
})();
