/* llmgw pages: whether the page is live, ticking "ago" times, charts, action messages. */
(function () {
  "use strict";

  // Reconnect soon after a drop, backing off to 10 s at most so a restarted control
  // plane is found again quickly; the jitter spreads many browsers out.
  htmx.config.wsReconnectDelay = function (retry) {
    var ceiling = Math.min(10000, 500 * Math.pow(2, retry));
    return ceiling / 2 + Math.random() * ceiling / 2;
  };

  function setLive(state, text) {
    var badge = document.getElementById("live-status");
    if (!badge) return;
    badge.dataset.live = state;
    badge.textContent = text;
  }
  document.addEventListener("htmx:wsConnecting", function () {
    var badge = document.getElementById("live-status");
    if (badge && badge.dataset.live !== "down") setLive("connecting", "connecting…");
  });
  document.addEventListener("htmx:wsOpen", function () { setLive("live", "live"); });
  document.addEventListener("htmx:wsClose", function () {
    setLive("down", "not live: reconnecting…");
  });
  document.addEventListener("htmx:wsError", function () {
    setLive("down", "not live: reconnecting…");
  });

  // "heard 12 s ago" keeps counting between pushes, on the server's clock.
  var serverTime = Date.parse(document.documentElement.dataset.serverTime || "");
  var skew = isNaN(serverTime) ? 0 : serverTime - Date.now();
  function duration(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    if (seconds < 120) return seconds + " s";
    if (seconds < 7200) return Math.floor(seconds / 60) + " min";
    if (seconds < 172800) return Math.floor(seconds / 3600) + " h";
    return Math.floor(seconds / 86400) + " d";
  }
  setInterval(function () {
    var now = Date.now() + skew;
    document.querySelectorAll("time[data-since]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) el.textContent = duration((now - at) / 1000) + " ago";
    });
  }, 1000);

  // Charts of the node page, redrawn whenever its history fragment arrives.
  var COLORS = ["#1f5c99", "#c2410c", "#2f7d4f", "#7c3aed", "#b42318", "#0e7490"];
  function formatValue(unit, value) {
    if (value == null) return "—";
    if (unit === "bytes") {
      // Binary units, as the server writes sizes (core/humanize.py).
      var units = [["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
      for (var i = 0; i < units.length; i++) {
        if (Math.abs(value) >= units[i][1]) return (value / units[i][1]).toFixed(1) + " " + units[i][0];
      }
      return Math.round(value) + " B";
    }
    if (unit === "%") return value.toFixed(0) + "%";
    return Math.abs(value) >= 10 ? value.toFixed(0) : value.toFixed(2);
  }
  // Each chart section (the node's last hour, a model's traffic) keeps its own plots.
  function drawHistory(section) {
    var plots = section._plots || (section._plots = []);
    plots.splice(0).forEach(function (plot) { plot.destroy(); });
    var script = section.querySelector("script[type='application/json']");
    if (!script || typeof uPlot === "undefined") return;
    var history = JSON.parse(script.textContent);
    history.charts.forEach(function (chart) {
      var box = section.querySelector('[data-chart="' + chart.id + '"] .plot');
      if (!box || !chart.series.length || !chart.x.length) return;
      var scales = { x: { time: true } };
      if (chart.unit === "%") scales.y = { range: [0, 100] };
      var opts = {
        width: Math.max(260, box.clientWidth || 400),
        height: 170,
        scales: scales,
        series: [{}].concat(chart.series.map(function (series, k) {
          return {
            label: series.label,
            stroke: COLORS[k % COLORS.length],
            width: 1.5,
            value: function (u, v) { return formatValue(chart.unit, v); },
          };
        })),
        axes: [{}, { size: 64, values: function (u, values) {
          return values.map(function (v) { return formatValue(chart.unit, v); });
        } }],
      };
      var data = [chart.x].concat(chart.series.map(function (series) { return series.values; }));
      plots.push(new uPlot(opts, data, box));
    });
    section.dataset.drawn = String(plots.length);
  }
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      document.querySelectorAll("section.history").forEach(drawHistory);
    }, 200);
  });

  htmx.onLoad(function (elt) {
    if (!elt.querySelector) return;
    if (elt.matches && elt.matches("section.history")) drawHistory(elt);
    elt.querySelectorAll("section.history").forEach(drawHistory);
    var lines = elt.id === "log-lines" ? elt : elt.querySelector("#log-lines");
    var pre = lines && lines.querySelector("pre.log");
    if (pre) pre.scrollTop = pre.scrollHeight;
  });

  // Changing what the log page shows reloads it with the new choice.
  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target.form && target.form.classList.contains("log-form") && target.name !== "n") {
      target.form.submit();
    }
  });

  // What an action did (its change itself arrives over the page's socket).
  var flashTimer = null;
  function flash(text, kind) {
    var box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.dataset.kind = kind;
    box.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(function () { box.hidden = true; }, 6000);
  }
  document.addEventListener("llmgw-done", function (event) { flash(event.detail.value, "ok"); });
  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    flash((xhr.responseText || "").trim() || "the server answered " + xhr.status, "error");
  });
})();
