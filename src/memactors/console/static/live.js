// memactors console: follow a run's log over server-sent events. Lines are added as text (never HTML).
"use strict";
(function () {
  var log = document.getElementById("log");
  if (!log || log.dataset.live !== "yes" || typeof EventSource === "undefined") { return; }
  var state = document.getElementById("log-state");
  var source = new EventSource(log.dataset.events);
  source.addEventListener("line", function (message) {
    var event = JSON.parse(message.data);
    var stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.appendChild(document.createTextNode(event.line + "\n"));
    if (stick) { log.scrollTop = log.scrollHeight; }
  });
  source.addEventListener("end", function (message) {
    source.close();
    var ended = JSON.parse(message.data);
    if (state) { state.textContent = "ended (" + (ended.outcome || ended.state) + ")"; state.dataset.state = "ended"; }
    log.dataset.live = "ended";
  });
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED && state) { state.textContent = "disconnected; reload to follow again"; }
  });
})();
