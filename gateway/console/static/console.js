// snlpgw console: live lesson progress over server-sent events (no build step, no CDN).
// The server sends the latest lesson as an HTML fragment it rendered (escaped by Jinja2);
// we swap it into the element that names the event stream.
(function () {
  "use strict";
  function connect(box) {
    var source = new EventSource(box.getAttribute("data-events"));
    source.addEventListener("steps", function (event) {
      box.innerHTML = event.data;
      box.setAttribute("data-updated", String(Date.now()));
    });
    window.addEventListener("pagehide", function () { source.close(); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var boxes = document.querySelectorAll("[data-events]");
    for (var i = 0; i < boxes.length; i++) { connect(boxes[i]); }
  });
})();
