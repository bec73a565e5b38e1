// The query page: renders the query's stream-json lines and status events
// as they arrive over SSE (EventSource), without reloads.
"use strict";
(function () {
  var box = document.getElementById("transcript");
  var timeline = document.getElementById("timeline");
  var stateEl = document.getElementById("state");
  var resultEl = document.getElementById("result");
  var elapsedEl = document.getElementById("elapsed");
  var started = Date.now();
  var ended = false;

  function add(cls, text) {
    var d = document.createElement("div");
    d.className = "line " + cls;
    d.textContent = text;
    box.appendChild(d);
  }
  function clip(s, n) { s = String(s); return s.length > n ? s.slice(0, n) + "…" : s; }
  function blocks(content) {
    if (typeof content === "string") { return [{ type: "text", text: content }]; }
    return Array.isArray(content) ? content : [];
  }
  function resultText(content) {
    return blocks(content).filter(function (b) { return b.type === "text"; }).map(function (b) { return b.text; }).join(" ");
  }
  function approval(req) {
    var sess = document.getElementById("session");
    sess.hidden = false;
    var f = document.createElement("form");
    f.method = "post";
    f.action = location.pathname + "/approve";
    f.className = "approval";
    var tool = (req.request && req.request.tool_name) || "a tool";
    f.innerHTML = "<span></span> <input type=hidden name=request_id> <button name=allow value=true type=submit>Approve</button> <button name=allow value=false type=submit>Deny</button>";
    f.querySelector("span").textContent = "Permission requested for " + tool;
    f.querySelector("input").value = req.request_id || "";
    document.getElementById("approvals").appendChild(f);
  }
  function line(m) {
    switch (m.type) {
      case "system":
        if (m.subtype === "init") { add("init", "● session " + m.session_id + " · model " + m.model); }
        break;
      case "assistant":
        blocks(m.message && m.message.content).forEach(function (b) {
          if (b.type === "text") { add("text", b.text); }
          else if (b.type === "tool_use") { add("tool", "→ " + b.name + " " + clip(JSON.stringify(b.input), 300)); }
          else if (b.type === "thinking") { add("init", "(thinking…)"); }
        });
        break;
      case "user":
        blocks(m.message && m.message.content).forEach(function (b) {
          if (b.type === "tool_result") { add(b.is_error ? "err" : "tool-result", (b.is_error ? "← error: " : "← ") + clip(resultText(b.content), 500)); }
        });
        break;
      case "control_request":
        approval(m);
        break;
      case "result":
        var stats = "turns " + (m.num_turns || 0) + " · cost $" + (m.total_cost_usd || 0).toFixed(4) + " · " + ((m.duration_ms || 0) / 1000).toFixed(1) + "s";
        var why = m.x_fleet && m.x_fleet.synthetic ? (m.x_fleet.reason === "cancelled" ? "cancelled" : "failed (worker: " + m.x_fleet.reason + ")") : "failed (" + m.subtype + ")";
        add(m.is_error ? "err" : "text", (m.is_error ? "✗ " + why : "✓ done") + " · " + stats);
        // The result text is the run's answer; on an error it says why,
        // and differs from the last assistant line.
        if (m.result) { add(m.is_error ? "err" : "answer", (m.is_error ? "" : "Answer: ") + clip(m.result, 4000)); }
        resultEl.textContent = "cost $" + (m.total_cost_usd || 0).toFixed(4);
        break;
      case "x_text":
        add("init", m.text);
        break;
    }
  }
  var lastStatus = "";
  function status(ev) {
    // A worker may report one state twice (running, then running with
    // its checkout): the timeline shows each change once.
    var key = [ev.state, ev.attempt, ev.worker, ev.turn, ev.request_id, ev.error && ev.error.code].join("|");
    if (key === lastStatus) { return; }
    lastStatus = key;
    var li = document.createElement("li");
    var s = new Date(ev.at).toLocaleTimeString() + " " + ev.state;
    if (ev.attempt) { s += " · attempt " + ev.attempt; }
    if (ev.worker) { s += " · " + ev.worker; }
    if (ev.error) { s += " · " + ev.error.code + ": " + ev.error.message; }
    li.textContent = s;
    li.className = "state-" + ev.state;
    timeline.appendChild(li);
    stateEl.textContent = ev.state;
    stateEl.className = "state-" + ev.state;
    if (ev.turn) { document.getElementById("session").hidden = false; }
    if (ev.request_id) { approval({ request_id: ev.request_id, request: { tool_name: ev.tool_name } }); }
  }
  var es = new EventSource(box.getAttribute("data-events"));
  var run = window.fleetRunline;
  es.addEventListener("at", function (e) { run.at(Number(e.data)); });
  es.addEventListener("line", function (e) {
    var m;
    try { m = JSON.parse(e.data); } catch (err) { add("init", e.data); return; }
    line(m);
    run.line(m);
  });
  es.addEventListener("model", function (e) { run.model(JSON.parse(e.data)); });
  es.addEventListener("status", function (e) { status(JSON.parse(e.data)); });
  es.addEventListener("artifact", function (e) {
    var a = JSON.parse(e.data);
    document.getElementById("workspace").hidden = false;
    document.getElementById("files").textContent = (a.files || []).map(function (f) {
      return (f.status || "M") + " " + f.path + (f.binary ? " (binary)" : " +" + (f.additions || 0) + " −" + (f.deletions || 0));
    }).join("\n");
    if (a.diff_key && a.diff_bytes > 0) {
      fetch(location.pathname + "/diff", { credentials: "same-origin" }).then(function (r) {
        return r.ok ? r.text() : "";
      }).then(function (t) { document.getElementById("diff").textContent = t; });
    }
  });
  es.addEventListener("end", function () {
    ended = true;
    es.close();
    var c = document.getElementById("cancel");
    if (c) { c.disabled = true; }
  });
  es.addEventListener("failure", function (e) { add("err", "following failed: " + JSON.parse(e.data).error); es.close(); });
  setInterval(function () {
    if (!ended) { elapsedEl.textContent = "· " + Math.round((Date.now() - started) / 1000) + "s"; }
  }, 1000);
})();
