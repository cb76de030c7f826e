// The console's own script: draws Mermaid diagrams (on load and after htmx swaps), says how
// the live stream is doing and clears an action's outcome line once it has been read.
// Everything else is htmx and server-rendered HTML.
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

  // An action's outcome line: a refusal stays until the next action; what was applied is said
  // for a few seconds, then the line goes (on the gates page the decided gate's form with it).
  var OUTCOME_MS = 4000;
  function clearOutcome(event) {
    var target = event.detail && event.detail.target;
    if (!target) { return; }
    var line = target.querySelector(".outcome.ok");
    if (!line) { return; }
    window.setTimeout(function () {
      if (!line.isConnected) { return; }
      var form = line.closest("form.gate");
      var card = form && form.closest("section.card");
      if (card && !card.closest("#plan-body")) { card.remove(); return; }
      line.remove();
    }, OUTCOME_MS);
  }

  document.addEventListener("DOMContentLoaded", drawDiagrams);
  document.addEventListener("htmx:afterSwap", clearOutcome);
  document.addEventListener("htmx:afterSettle", drawDiagrams);
  document.addEventListener("htmx:sseOpen", function () { liveState("live"); });
  document.addEventListener("htmx:sseError", function () { liveState("reconnecting…"); });
  document.addEventListener("htmx:sseClose", function () { liveState("the plan ended"); });
})();
