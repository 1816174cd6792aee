// EchoMQ dashboard: live numbers without reloading. A page that can update names its JSON
// twin in <body data-live>; every data-poll ms this fetches it and writes each value into the
// elements that name its path: data-k="a|b|c" (text), <progress data-v=... data-max=...> and
// data-html="chart" (markup the server drew from numbers only: the queue page's chart).
// No framework, no build step.
(function () {
  "use strict";
  var body = document.body;
  var url = body.dataset.live;
  var every = parseInt(body.dataset.poll, 10) || 2000;
  var status = document.getElementById("live-status");
  if (!url) {
    return;
  }

  function get(obj, path) {
    for (var i = 0; i < path.length; i++) {
      if (obj === null || obj === undefined) {
        return undefined;
      }
      obj = obj[path[i]];
    }
    return obj;
  }

  function show(value) {
    if (typeof value === "number") {
      return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(1);
    }
    return String(value);
  }

  // seconds as the server's pages write them (app.py's _ago): 12.3s, 4.5m, 1.2h, 2.0d
  function ago(s) {
    var units = [["d", 86400], ["h", 3600], ["m", 60]];
    s = Math.max(0, s);
    for (var i = 0; i < units.length; i++) {
      if (s >= units[i][1]) {
        return (s / units[i][1]).toFixed(1) + units[i][0];
      }
    }
    return s.toFixed(1) + "s";
  }

  function apply(data) {
    document.querySelectorAll("[data-k]").forEach(function (el) {
      var value = get(data, el.dataset.k.split("|"));
      if (value === null && el.dataset.ago) {
        value = "-";
      } else if (typeof value === "number" && el.dataset.ago) {
        value = ago(value);
      }
      if (value !== undefined && value !== null && el.textContent !== show(value)) {
        el.textContent = show(value);
        el.classList.add("changed");
      }
    });
    document.querySelectorAll("[data-html]").forEach(function (el) {
      var markup = get(data, el.dataset.html.split("|"));
      // compared with what was last written (the browser re-serialises innerHTML)
      if (typeof markup === "string" && el.emqMarkup !== markup) {
        el.emqMarkup = markup;
        el.innerHTML = markup;
        el.dataset.refreshed = String(Date.now());
      }
    });
    document.querySelectorAll("progress[data-v]").forEach(function (el) {
      var value = get(data, el.dataset.v.split("|"));
      var max = el.dataset.max ? get(data, el.dataset.max.split("|")) : undefined;
      if (typeof max === "number") {
        el.max = Math.max(max, 1);
      }
      if (typeof value === "number") {
        el.value = value;
      }
    });
  }

  function tick() {
    fetch(url, { headers: { accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        apply(data);
        status.textContent = "live " + new Date().toLocaleTimeString();
        status.className = "ok";
        body.dataset.updated = String(Date.now());
      })
      .catch(function (err) {
        status.textContent = "live update failed: " + err.message;
        status.className = "err";
      })
      .then(function () {
        window.setTimeout(tick, every);
      });
  }

  window.setTimeout(tick, every);
})();
