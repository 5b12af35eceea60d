// lagscope pages work without this script; it adds auto-refresh and nothing else.
// It never inserts telemetry into the page: it only reloads the page and rewrites the
// client search form's target.
(function () {
  "use strict";
  var control = document.querySelector("[data-refresh-control]");
  var select = document.querySelector("[data-refresh]");
  if (control && select) {
    control.hidden = false;
    var params = new URLSearchParams(window.location.search);
    var stored = params.get("refresh") || window.localStorage.getItem("lagscope.refresh") || "0";
    select.value = ["0", "5", "15", "60"].indexOf(stored) >= 0 ? stored : "0";
    var timer = null;
    var schedule = function () {
      if (timer) { window.clearTimeout(timer); timer = null; }
      var seconds = parseInt(select.value, 10);
      if (seconds > 0) {
        timer = window.setTimeout(function () {
          // Keep following the latest data: drop a fixed end so the range moves on.
          var next = new URLSearchParams(window.location.search);
          if (next.has("to") && next.has("from")) {
            var length = parseFloat(next.get("to")) - parseFloat(next.get("from"));
            if (isFinite(length) && length > 0) {
              next.delete("from"); next.delete("to"); next.set("last", Math.round(length) + "s");
            }
          }
          next.set("refresh", String(seconds));
          window.location.search = next.toString();
        }, seconds * 1000);
      }
    };
    select.addEventListener("change", function () {
      window.localStorage.setItem("lagscope.refresh", select.value);
      schedule();
    });
    schedule();
  }
})();
