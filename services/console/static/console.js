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
  var ENVELOPE = ["event_id", "job_id", "attempt", "time", "producer"];
  var FAILURES = {
    FAILURE_CRASHED: "its runner crashed", FAILURE_OOM_KILLED: "it ran out of memory",
    FAILURE_EVICTED: "it was evicted", FAILURE_NODE_LOST: "its node was lost",
    FAILURE_LOST: "its pod was lost", FAILURE_CLUSTER_LOST: "its cluster was lost"
  };
  var PHASES = { POD_PENDING: "waiting to start", POD_RUNNING: "running", POD_SUCCEEDED: "done", POD_FAILED: "failed" };
  var MS_PER_DAY = 86400000;

  /* Words for an enum value the page has no phrase for: FAILURE_DISK_FULL -> "disk full". */
  function words(value) {
    return String(value || "").replace(/^[A-Z]+_/, "").toLowerCase().replace(/_/g, " ");
  }
  function failure(reason) { return FAILURES[reason] || words(reason) || "unknown reason"; }
  function stepOf(checkpoint) { return checkpoint && checkpoint.step !== undefined ? " at step " + checkpoint.step : ""; }

  /* What a lifecycle event means, for the status line ("placed on local-1"), never its kind. */
  function phrase(kind, body) {
    body = body || {};
    switch (kind) {
      case "submitted": return "submitted";
      case "released": return "its dependencies succeeded: waiting for a node";
      case "bound": return "placed on " + (body.node || "a node");
      case "started": return "running on " + (body.node || "its node");
      case "pod": return "its pod is " + (PHASES[body.phase] || words(body.phase) || "changing");
      case "checkpoint": return "checkpoint written" + stepOf(body);
      case "copied": return "checkpoint" + stepOf(body.checkpoint) + " copied to the shared store";
      case "fetched": return "resumed from the shared store's copy" + stepOf(body.checkpoint);
      case "outputs": return "output files written";
      case "usage": return "resource use measured";
      case "attempt_failed": return "this attempt failed: " + failure(body.reason);
      case "requeued": return "queued again" + (body.resume_from ? " to resume" + stepOf(body.resume_from) : " from the start");
      case "succeeded": return "succeeded" + (body.reason ? " (" + words("X_" + body.reason) + ")" : "");
      case "failed": return "failed for good: " + failure(body.reason);
      default: return words("X_" + kind);
    }
  }

  /* An event's time in ms since the epoch (its RFC 3339 text may carry nanoseconds). */
  function millis(time) { return time ? Date.parse(String(time).replace(/(\.\d{3})\d+/, "$1")) : NaN; }

  function byId(id) { return document.getElementById(id); }
  function number(value) { return value === undefined || value === null ? 0 : Number(value); }
  function colour(i) { return PALETTE[i % PALETTE.length]; }

  function chartWidth(target) { return Math.max(320, Math.min(target.clientWidth || 640, 1100)); }

  /* One chart: x = shared axis, one y series per label (null where a series has no point);
     ``styles``: options of some series by label (a dashed reference line, say). */
  function makeChart(target, xLabel, labels, data, xTime, styles) {
    var series = [{ label: xLabel }];
    labels.forEach(function (label, i) {
      var one = { label: label, stroke: colour(i), width: 1.5, spanGaps: true, points: { show: false } };
      Object.assign(one, (styles || {})[label] || {});
      series.push(one);
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
    var target = data.targetTemperatureK;
    var metrics = [
      ["chart-potential", function (p) { return p.potential; }],
      ["chart-temperature", function (p) { return p.temperature; }, target ? "thermostat " + target + " K" : null, target],
      ["chart-speed", function (p) { return p.speed; }]
    ];
    var speeds = 0;

    /* The speed of a report: the simulated time since the attempt's report before over the
       wall time between them (a runner's own figure is its average since it started, which
       climbs all run long); for an attempt's first report, that figure; none without MD. */
    function speedOf(previous, progress, ms) {
      var timePs = number(progress.time_ps);
      if (previous && timePs > previous.timePs && ms > previous.ms) {
        return (timePs - previous.timePs) / 1000 / ((ms - previous.ms) / MS_PER_DAY);
      }
      return timePs > 0 && number(progress.ns_per_day) > 0 ? number(progress.ns_per_day) : null;
    }

    function add(event) {
      var progress = event.progress || {};
      var attempt = number(event.attempt);
      var step = number(progress.step);
      if (attempt < last.attempt || (attempt === last.attempt && step <= last.step)) { return false; }
      var points = byAttempt[attempt] = byAttempt[attempt] || [];
      var ms = millis(event.time);
      var speed = speedOf(points[points.length - 1], progress, ms);
      if (speed !== null) { speeds += 1; }
      points.push({
        x: step, potential: number(progress.potential_kj_mol),
        temperature: number(progress.temperature_k), speed: speed,
        timePs: number(progress.time_ps), ms: ms
      });
      last = { attempt: attempt, step: step, time: event.time || last.time };
      count += 1;
      return true;
    }

    function draw() {
      var attempts = Object.keys(byAttempt).map(Number).sort(function (a, b) { return a - b; });
      var labels = attempts.map(function (a) { return "attempt " + a; });
      metrics.forEach(function (metric) {
        var place = byId(metric[0]);
        if (metric[0] === "chart-speed" && count && !speeds) {
          // a minimisation or an analysis: no simulated time, no speed
          if (charts[metric[0]]) { charts[metric[0]].destroy(); delete charts[metric[0]]; }
          place.innerHTML = '<p class="no-data" id="no-speed">No speed: this job runs no molecular dynamics.</p>';
          return;
        }
        var columns = align(byAttempt, attempts, metric[1]);
        var names = labels.slice();
        var styles = {};
        if (metric[2] && columns[0].length) {  // a flat dashed line at the thermostat's temperature
          names.push(metric[2]);
          columns.push(columns[0].map(function () { return metric[3]; }));
          styles[metric[2]] = { stroke: "#4a4a4a", dash: [6, 4], width: 1 };
        }
        var chart = charts[metric[0]];
        if (!chart || chart.series.length !== names.length + 1) {
          if (chart) { chart.destroy(); }
          place.textContent = "";
          charts[metric[0]] = makeChart(place, "step", names, columns, false, styles);
        } else {
          chart.setData(columns);
        }
        place.setAttribute("data-series", JSON.stringify(names));
        var lastAttempt = byAttempt[attempts[attempts.length - 1]] || [];
        var newest = lastAttempt[lastAttempt.length - 1];
        if (newest) { place.setAttribute("data-last", String(metric[1](newest))); }
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
      var body = Object.keys(event).filter(function (k) { return ENVELOPE.indexOf(k) < 0; })[0];
      var kind = STATE_OF_KIND[body] ? body : null;
      status.textContent = "live: attempt " + number(event.attempt) + ", " + phrase(body, event[body]);
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
  var TIME_STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200];

  /* seconds since the epoch -> "HH:MM" (with ":SS" if ``withSeconds``), local time */
  function clock(seconds, withSeconds) {
    var at = new Date(seconds * 1000);
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    var text = two(at.getHours()) + ":" + two(at.getMinutes());
    return withSeconds ? text + ":" + two(at.getSeconds()) : text;
  }

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
      // ticks at least 90 px apart, each the whole time of day (HH:MM, or HH:MM:SS while the
      // chart spans under a few minutes): labels never crowd (":00 :30") along the axis
      axes: [{ label: "time", space: 90, incrs: TIME_STEPS, values: function (u, splits) {
        var seconds = splits.length > 1 && splits[1] - splits[0] < 60;
        var shown = splits.map(function (t) { return clock(t, seconds); });
        target.setAttribute("data-ticks", JSON.stringify(shown));
        return shown;
      } }, { size: 80 }],
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
