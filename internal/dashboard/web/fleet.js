// The fleet page, live: it polls /fleet.json every 2 s while visible and
// redraws the workers, the queue, the failures and the charts (uPlot,
// vendored under /static/vendor/uplot) in place, without a reload.
"use strict";
(function () {
  var charts = {}, history = { t: [], waiting: {}, wait: {} }, maxPoints = 300;
  window.fleetCharts = charts;

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }
  function link(tenant, id) {
    var a = el("a", tenant + "/" + id);
    a.href = "/q/" + encodeURIComponent(tenant) + "/" + encodeURIComponent(id);
    return a;
  }
  function secs(s) {
    s = Math.floor(s);
    if (s < 60) { return s + "s"; }
    if (s < 3600) { return Math.floor(s / 60) + "m" + (s % 60) + "s"; }
    return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
  }
  function table(id, head, rows, empty) {
    var t = document.getElementById(id), tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", h)); });
    t.replaceChildren(tr);
    if (!rows.length) {
      var r = el("tr"), td = el("td", empty);
      td.colSpan = head.length; r.appendChild(td); t.appendChild(r);
    }
    rows.forEach(function (cells) {
      var r = el("tr");
      cells.forEach(function (c) {
        var td = el("td");
        if (c instanceof Node) { td.appendChild(c); } else { td.textContent = c; }
        r.appendChild(td);
      });
      t.appendChild(r);
    });
  }
  function running(w) {
    var s = el("span", String(w.running.length));
    w.running.forEach(function (q) { s.append(" "); s.appendChild(link(q.tenant, q.id)); });
    return s;
  }
  var palette = ["#07a", "#b00", "#070", "#a60", "#609", "#088", "#555", "#c3a"];
  function width(id) { return Math.max(300, document.getElementById(id).clientWidth || 400); }
  // draw (re)creates a chart when its series change, else sets its data.
  function draw(id, key, names, data, opts) {
    var c = charts[id];
    if (c && c.key === key) { c.plot.setData(data); return; }
    if (c) { c.plot.destroy(); }
    var series = [{}].concat(names.map(function (n, i) {
      var s = { label: n, stroke: palette[i % palette.length], width: 2 };
      if (opts.bars) { s.fill = palette[i % palette.length] + "88"; s.paths = uPlot.paths.bars({ size: [0.6, 60] }); s.points = { show: false }; }
      return s;
    }));
    var o = { width: width(id), height: 200, series: series, scales: { x: { time: !opts.bars } } };
    if (opts.xvalues) { o.axes = [{ values: opts.xvalues }, {}]; o.scales.x.range = function () { return [-0.5, data[0].length - 0.5]; }; }
    var box = document.getElementById(id);
    box.replaceChildren();
    charts[id] = { key: key, plot: new uPlot(o, data, box) };
  }

  function render(d) {
    document.getElementById("desired").textContent = d.desired_workers;
    var fin = d.finished || [];
    document.getElementById("rpm").textContent = fin.length ? fin[fin.length - 1] : 0;
    var err = document.getElementById("live-error");
    err.textContent = d.error || "";
    table("workers", ["worker", "state", "slots", "running", "up", "version"], d.workers.map(function (w) {
      return [w.id, w.state, String(w.slots), running(w), secs(w.up_secs), w.version];
    }), "no worker answers discovery");
    table("queue", ["tenant", "waiting", "running", "oldest wait", "spend"], d.tenants.map(function (t) {
      var a = el("a", t.tenant); a.href = "/queries?tenant=" + encodeURIComponent(t.tenant);
      return [a, String(t.waiting), String(t.running), secs(t.wait_secs), "$" + t.spend_usd.toFixed(4)];
    }), "nothing queued");
    table("failures", ["query", "at", "reason"], d.failures.map(function (q) {
      return [link(q.tenant, q.id), new Date(q.at).toLocaleTimeString(), q.error ? q.error.code + ": " + q.error.message : ""];
    }), "none");

    draw("chart-jobs", "jobs", ["ended", "failed"], [d.minutes, d.finished, d.failed], {});
    var names = d.tenants.map(function (t) { return t.tenant; });
    history.t.push(Math.floor(Date.parse(d.at) / 1000));
    names.forEach(function (n) {
      [["waiting", "waiting"], ["wait", "wait_secs"]].forEach(function (p) {
        var h = history[p[0]];
        if (!h[n]) { h[n] = history.t.slice(0, -1).map(function () { return null; }); }
      });
    });
    Object.keys(history.waiting).forEach(function (n) {
      var t = d.tenants.find(function (x) { return x.tenant === n; });
      history.waiting[n].push(t ? t.waiting : 0);
      history.wait[n].push(t ? t.wait_secs : 0);
    });
    if (history.t.length > maxPoints) {
      history.t.shift();
      Object.keys(history.waiting).forEach(function (n) { history.waiting[n].shift(); history.wait[n].shift(); });
    }
    var all = Object.keys(history.waiting).sort();
    draw("chart-queue", all.join(","), all, [history.t].concat(all.map(function (n) { return history.waiting[n]; })), {});
    draw("chart-wait", all.join(","), all, [history.t].concat(all.map(function (n) { return history.wait[n]; })), {});
    draw("chart-spend", names.join(","), ["spend (USD)"], [names.map(function (_, i) { return i; }), d.tenants.map(function (t) { return t.spend_usd; })],
      { bars: true, xvalues: function (_, ticks) { return ticks.map(function (i) { return names[i] === undefined ? "" : names[i]; }); } });
  }

  function poll() {
    if (document.visibilityState !== "visible") { return; }
    fetch("/fleet.json", { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.json();
    }).then(render).catch(function (e) {
      document.getElementById("live-error").textContent = "updating: " + e.message;
    });
  }
  poll();
  setInterval(poll, 2000);
})();
