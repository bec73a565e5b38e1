// The run's timeline on the query page: its turns, tool calls (with how
// long each took, from the tool_use line to its tool_result line) and
// model calls (duration, tokens, cost, from the gateway's .model events),
// in stream order. query.js feeds it; times are when the stream stored
// each line ("at" events), so a replay shows the same durations as live.
"use strict";
window.fleetRunline = (function () {
  var list = document.getElementById("runline");
  var stats = document.getElementById("runstats");
  // A turn is one exchange: the assistant's lines (one per content block,
  // or many in a row) up to the next user line (a tool result, an input).
  // The header shows the turns the last result reports (num_turns) until
  // another turn starts, else the exchanges counted.
  var at = 0, first = 0, turns = 0, inTurn = false, reported = null, tools = {}, calls = 0, callMS = 0, spend = 0, toolCount = 0;

  function secs(ms) { return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + "s"; }
  function row(kind, text) {
    var li = document.createElement("li");
    li.className = "run-" + kind;
    var off = document.createElement("span");
    off.className = "dur";
    off.textContent = first ? "+" + secs(at - first) + " " : "";
    li.appendChild(off);
    li.appendChild(document.createTextNode(text));
    list.appendChild(li);
    return li;
  }
  function dur(li, ms) {
    var d = document.createElement("span");
    d.className = "dur took";
    d.textContent = " · " + secs(ms);
    li.appendChild(d);
  }
  function summary() {
    var n = reported === null ? turns : reported;
    stats.textContent = n + (n === 1 ? " turn · " : " turns · ") + toolCount + " tool calls · " + calls + " model calls" +
      (calls ? " · " + secs(callMS) + " in the model · $" + spend.toFixed(4) : "");
  }
  return {
    at: function (ms) { at = ms; if (!first) { first = ms; } },
    line: function (m) {
      if (m.type === "assistant" && m.message) {
        if (!inTurn) { inTurn = true; reported = null; turns++; row("turn", "turn " + turns); }
        (Array.isArray(m.message.content) ? m.message.content : []).forEach(function (b) {
          if (b.type === "tool_use") { toolCount++; tools[b.id] = { li: row("tool", "tool " + b.name), at: at }; }
        });
      } else if (m.type === "user" && m.message) {
        inTurn = false;
        (Array.isArray(m.message.content) ? m.message.content : []).forEach(function (b) {
          var t = b.type === "tool_result" && tools[b.tool_use_id];
          if (t) {
            dur(t.li, at - t.at);
            if (b.is_error) { t.li.className += " err"; }
            delete tools[b.tool_use_id];
          }
        });
      } else if (m.type === "result") {
        inTurn = false;
        if (typeof m.num_turns === "number") { reported = m.num_turns; }
        var li = row("result", (m.is_error ? "ended in error" : "done") + " · " + (m.num_turns || 0) + " turns · $" + (m.total_cost_usd || 0).toFixed(4));
        if (m.duration_ms) { dur(li, m.duration_ms); }
      }
      summary();
    },
    model: function (c) {
      calls++;
      callMS += c.ms || 0;
      spend += c.cost_usd || 0;
      var li = row("model", "model " + (c.model || "?") + " #" + c.call + " · " + (c.input_tokens || 0) + " in / " + (c.output_tokens || 0) + " out · $" + (c.cost_usd || 0).toFixed(4) + (c.status && c.status !== 200 ? " · HTTP " + c.status : ""));
      dur(li, c.ms || 0);
      summary();
    }
  };
})();
