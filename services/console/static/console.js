/* mdq console: draws the charts (uPlot, shipped beside this file) and follows a job live over
   server-sent events. The page carries its data as JSON in the protobuf JSON mapping
   (proto field names); nothing here talks to anything but the console itself. */
(function () {
  "use strict";

  var PALETTE = ["#1f5fa8", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d"];
  var STATE_OF_KIND = {
    released: "PENDING", bound: "BOUND", started: "RUNNING", succeeded: "SUCCEEDED",
    failed: "FAILED", attempt_failed: "RECOVERING", requeued: "PENDING", cancelled: "CANCELLED",
    extended: "PENDING"
  };

  function byId(id) { return document.getElementById(id); }
  function number(value) { return value === undefined || value === null ? 0 : Number(value); }
  function colour(i) { return PALETTE[i % PALETTE.length]; }

  function chartWidth(target) { return Math.max(320, Math.min(target.clientWidth || 640, 1100)); }

  /* One chart: x = shared axis, one y series per label (null where a series has no point). */
  function makeChart(target, xLabel, labels, data, xTime) {
    var series = [{ label: xLabel }];
    labels.forEach(function (label, i) {
      series.push({ label: label, stroke: colour(i), width: 1.5, spanGaps: true, points: { show: false } });
    });
    var options = {
      width: chartWidth(target), height: 220, series: series,
      scales: { x: { time: !!xTime } },
      axes: [{ label: xLabel }, { size: 80 }],
      legend: { live: true }
    };
    return new uPlot(options, data, target);
  }

  /* Rows of {x, key, y...} into uPlot's aligned columns. */
  function align(xsByKey, keys, pick) {
    var xs = {};
    keys.forEach(function (key) { xsByKey[key].forEach(function (p) { xs[p.x] = true; }); });
    var sorted = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
    var index = {};
    sorted.forEach(function (x, i) { index[x] = i; });
    var columns = [sorted];
    keys.forEach(function (key) {
      var column = new Array(sorted.length).fill(null);
      xsByKey[key].forEach(function (p) { column[index[p.x]] = pick(p); });
      columns.push(column);
    });
    return columns;
  }

  // -- a job's page --------------------------------------------------------------------------
  function initJob(data) {
    var byAttempt = {};
    var count = 0;
    var last = { attempt: 0, step: -1, time: "" };
    var charts = {};
    var metrics = [
      ["chart-potential", function (p) { return p.potential; }],
      ["chart-temperature", function (p) { return p.temperature; }],
      ["chart-speed", function (p) { return p.speed; }]
    ];

    function add(event) {
      var progress = event.progress || {};
      var attempt = number(event.attempt);
      var step = number(progress.step);
      if (attempt < last.attempt || (attempt === last.attempt && step <= last.step)) { return false; }
      (byAttempt[attempt] = byAttempt[attempt] || []).push({
        x: step, potential: number(progress.potential_kj_mol),
        temperature: number(progress.temperature_k), speed: number(progress.ns_per_day)
      });
      last = { attempt: attempt, step: step, time: event.time || last.time };
      count += 1;
      return true;
    }

    function draw() {
      var attempts = Object.keys(byAttempt).map(Number).sort(function (a, b) { return a - b; });
      var labels = attempts.map(function (a) { return "attempt " + a; });
      metrics.forEach(function (metric) {
        var target = byId(metric[0]);
        var columns = align(byAttempt, attempts, metric[1]);
        var chart = charts[metric[0]];
        if (!chart || chart.series.length !== labels.length + 1) {
          if (chart) { chart.destroy(); }
          target.textContent = "";
          charts[metric[0]] = makeChart(target, "step", labels, columns, false);
        } else {
          chart.setData(columns);
        }
      });
      byId("point-count").textContent = String(count);
      byId("charts").setAttribute("data-points", String(count));
      byId("charts").setAttribute("data-last-step", String(last.step));
      if (last.step >= 0) { byId("job-step").textContent = String(last.step); }
    }

    data.points.forEach(add);
    draw();

    var pending = false;
    function redrawSoon() {
      if (pending) { return; }
      pending = true;
      window.requestAnimationFrame(function () { pending = false; draw(); });
    }

    var status = byId("live-status");
    var query = "attempt=" + last.attempt + "&step=" + last.step +
      (last.time ? "&since=" + encodeURIComponent(last.time) : "") +
      "&events_since=" + encodeURIComponent(data.eventsSince);
    var source = new EventSource("/jobs/" + encodeURIComponent(data.jobId) + "/live?" + query);
    source.addEventListener("ready", function () { status.textContent = "live: following"; });
    source.addEventListener("progress", function (message) {
      var event = JSON.parse(message.data);
      if (add(event)) {
        byId("charts").setAttribute("data-last-received-ms", String(Date.now()));
        redrawSoon();
      }
    });
    source.addEventListener("event", function (message) {
      var event = JSON.parse(message.data);
      var kind = Object.keys(STATE_OF_KIND).filter(function (k) { return event[k] !== undefined; })[0];
      var other = kind || Object.keys(event).filter(function (k) {
        return ["event_id", "job_id", "attempt", "time", "producer"].indexOf(k) < 0;
      })[0] || "event";
      status.textContent = "live: " + other + " (attempt " + number(event.attempt) + ")";
      if (kind) {
        var state = byId("job-state");
        state.textContent = STATE_OF_KIND[kind];
        state.className = "state state-" + STATE_OF_KIND[kind].toLowerCase();
        byId("job-attempt").textContent = String(number(event.attempt));
      }
    });
    source.onerror = function () { status.textContent = "live: reconnecting…"; };
  }

  // -- a campaign: every job's curve overlaid -----------------------------------------------
  function initCampaign(curves) {
    var byJob = {};
    var keys = [];
    var labels = [];
    curves.forEach(function (curve) {
      keys.push(curve.jobId);
      labels.push(curve.name);
      byJob[curve.jobId] = curve.steps.map(function (step, i) {
        return { x: step, potential: curve.potentialKjMol[i], temperature: curve.temperatureK[i] };
      });
    });
    if (!keys.length) { return; }
    makeChart(byId("chart-campaign"), "step", labels,
      align(byJob, keys, function (p) { return p.potential; }), false);
    makeChart(byId("chart-campaign-temperature"), "step", labels,
      align(byJob, keys, function (p) { return p.temperature; }), false);
  }

  // -- nodes: load over the last hour ---------------------------------------------------------
  /* The summaries of the last hour (the mean of each minute, dashed its peak), then the latest
     report; CPU and memory each in one colour. */
  function initNode(target, history) {
    if (!history.t.length) { target.textContent = "No load reported in the last hour."; return; }
    var line = function (label, i, dash) {
      var s = { label: label, stroke: colour(i), width: dash ? 1 : 1.5, spanGaps: true, points: { show: history.t.length < 3 } };
      if (dash) { s.dash = [4, 4]; }
      return s;
    };
    var options = {
      width: chartWidth(target), height: 220,
      series: [{ label: "time" }, line("CPU", 0, false), line("CPU peak", 0, true),
        line("memory", 1, false), line("memory peak", 1, true)],
      // a fraction of the node: from 0 to 1 (or past it, for a node running over its capacity)
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      axes: [{ label: "time" }, { size: 80 }],
      legend: { live: true }
    };
    new uPlot(options, [history.t, history.cpu, history.cpu_max, history.memory, history.memory_max], target);
  }

  var job = byId("job-data");
  if (job) { initJob(JSON.parse(job.textContent)); }
  var campaign = byId("campaign-data");
  if (campaign) { initCampaign(JSON.parse(campaign.textContent)); }
  document.querySelectorAll(".node-data").forEach(function (script) {
    var chart = script.previousElementSibling.querySelector(".node-chart");
    initNode(chart, JSON.parse(script.textContent));
  });
}());
