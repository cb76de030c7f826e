// The console's own script: draws Mermaid diagrams (on load and after htmx swaps) and says how
// the live stream is doing. Everything else is htmx and server-rendered HTML.
(function () {
  "use strict";
  var mermaidReady = false;

  function drawDiagrams() {
    if (!window.mermaid) { return; }
    if (!mermaidReady) {
      window.mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral",
        flowchart: { htmlLabels: false } });
      mermaidReady = true;
    }
    var pending = document.querySelectorAll("pre.mermaid:not([data-processed])");
    if (pending.length) {
      window.mermaid.run({ nodes: pending }).catch(function (err) {
        pending.forEach(function (node) { node.classList.add("diagram-failed"); });
        console.warn("mermaid:", err);
      });
    }
  }

  function liveState(text) {
    var state = document.getElementById("live-state");
    if (state) { state.textContent = text; }
  }

  document.addEventListener("DOMContentLoaded", drawDiagrams);
  document.addEventListener("htmx:afterSettle", drawDiagrams);
  document.addEventListener("htmx:sseOpen", function () { liveState("live"); });
  document.addEventListener("htmx:sseError", function () { liveState("reconnecting…"); });
  document.addEventListener("htmx:sseClose", function () { liveState("the plan ended"); });
})();
