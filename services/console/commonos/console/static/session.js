// The session page, live: one EventSource on the page's data-live URL (pages/timeline.py). Each `update` is a
// list of operations on the page: put an element (a turn, a message, a tool call, a timeline span) in place of
// the one with its key, or at the end of its container; set a status; add to a count; set an attribute. The
// server renders the HTML (escaped there: messages and tool output are someone else's words); this script
// only places it. Then every turn's timeline is laid out again: a bar's x and width are SVG attributes, in
// thousandths of its turn's axis (no style attribute: the content security policy forbids them).
(function () {
  "use strict";
  var root = document.getElementById("session");
  if (!root) { return; }
  var state = document.getElementById("live-state");
  var AXIS = 1000;
  var MIN_BAR = 4;

  function say(text) { if (state) { state.textContent = text; } }

  // The element of `key` whose own turn (or timeline) is `scope`: a delegated child's elements, nested in the
  // turn, have keys of their own turns.
  function byKey(container, key) {
    var scope = container.closest("article.turn, .turn-timeline") || container;
    var found = container.querySelectorAll("[data-key]");
    for (var i = 0; i < found.length; i++) {
      var el = found[i];
      if (el.getAttribute("data-key") === key && (el.closest("article.turn, .turn-timeline") || container) === scope) {
        return el;
      }
    }
    return null;
  }

  function parse(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    return template.content.firstElementChild;
  }

  // A new element keeps what the person opened.
  function keepOpen(from, to) {
    if (from.tagName === "DETAILS" && to.tagName === "DETAILS" && from.open) { to.open = true; }
  }

  // A message requesting a tool call the page already shows (waiting, decided, recorded): the call stays one
  // element, moved into the message in place of the request.
  function adoptCalls(node, container) {
    var requests = node.querySelectorAll("[data-key^='call:']");
    for (var i = 0; i < requests.length; i++) {
      var existing = byKey(container, requests[i].getAttribute("data-key"));
      if (existing && existing !== requests[i]) { requests[i].replaceWith(existing); }
    }
  }

  function put(op) {
    var container = op.into ? document.getElementById(op.into) : null;
    var existing = op.id ? document.getElementById(op.id) : (container && op.key ? byKey(container, op.key) : null);
    if (op.unless && container && byKey(container, op.unless)) { return; }
    if (existing && op.mode === "create") { return; }
    var node = parse(op.html);
    if (!node) { return; }
    if (op.key) { node.setAttribute("data-key", op.key); }
    if (existing) {
      keepOpen(existing, node);
      existing.replaceWith(node);
    } else if (container) {
      if (container.id === "conversation" || container.id === "timeline-turns") {
        var empty = container.parentNode.querySelector(":scope > .timeline-empty");
        if (empty) { empty.remove(); }
      }
      if (op.key && op.key.indexOf("msg:") === 0) { adoptCalls(node, container); }
      container.appendChild(node);
    }
  }

  function setStatus(op) {
    var el = document.getElementById(op.id);
    if (!el) { return; }
    el.className = "status " + op.status;
    el.textContent = op.status;
  }

  function add(op) {
    var el = document.getElementById(op.id);
    if (!el) { return; }
    var now = parseInt(el.textContent, 10);
    el.textContent = String((isNaN(now) ? 0 : now) + op.n);
  }

  function attr(op) {
    var el = document.getElementById(op.id);
    if (el) { el.setAttribute(op.name, op.value); }
  }

  function number(value) {
    var n = parseFloat(value);
    return isNaN(n) ? null : n;
  }

  function duration(ms) {
    if (ms === null) { return "running"; }
    if (ms < 1000) { return Math.round(ms) + " ms"; }
    if (ms < 60000) { return (ms / 1000).toFixed(2) + " s"; }
    return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
  }

  // One turn's bars on its axis: from its start to its end, or (running) to the latest thing that happened.
  function layout(section) {
    var start = number(section.getAttribute("data-start"));
    if (start === null) { return; }
    var turnStart = start;
    var end = number(section.getAttribute("data-end"));
    var last = number(section.getAttribute("data-last")) || start;
    var rows = section.querySelectorAll(".span");
    var i, row, s, e;
    for (i = 0; i < rows.length; i++) {
      s = number(rows[i].getAttribute("data-start"));
      e = number(rows[i].getAttribute("data-end"));
      last = Math.max(last, s || start, e || start);
    }
    // A model call's start is its end less its latency: it may be before the turn's own start.
    for (i = 0; i < rows.length; i++) {
      s = number(rows[i].getAttribute("data-start"));
      if (s !== null) { start = Math.min(start, s); }
    }
    var axisEnd = end === null ? last : Math.max(end, last);
    var total = Math.max(axisEnd - start, 1);
    var models = 0, tools = 0, tokensIn = 0, tokensOut = 0;
    for (i = 0; i < rows.length; i++) {
      row = rows[i];
      s = number(row.getAttribute("data-start"));
      e = number(row.getAttribute("data-end"));
      if (s === null) { continue; }
      var x = Math.min(Math.max((s - start) / total, 0), 1) * AXIS;
      var width = Math.max(((e === null ? axisEnd : e) - s) / total * AXIS, MIN_BAR);
      x = Math.min(Math.round(x), AXIS - MIN_BAR);
      width = Math.max(Math.min(Math.round(width), AXIS - x), MIN_BAR);
      var bar = row.querySelector(".span-bar");
      if (bar) { bar.setAttribute("x", String(x)); bar.setAttribute("width", String(width)); }
      var kind = row.getAttribute("data-kind");
      if (kind === "model") {
        models += 1;
        tokensIn += number(row.getAttribute("data-in")) || 0;
        tokensOut += number(row.getAttribute("data-out")) || 0;
      } else if (kind === "tool") {
        tools += 1;
      }
    }
    var fields = { ".tl-models": models, ".tl-tools": tools, ".tl-in": tokensIn, ".tl-out": tokensOut };
    Object.keys(fields).forEach(function (selector) {
      var el = section.querySelector(selector);
      if (el) { el.textContent = String(fields[selector]); }
    });
    var shown = section.querySelector(".tl-duration");
    if (shown) { shown.textContent = duration(end === null ? null : end - turnStart); }
  }

  function layoutAll() {
    var sections = document.querySelectorAll(".turn-timeline");
    for (var i = 0; i < sections.length; i++) { layout(sections[i]); }
  }

  var apply = { put: put, status: setStatus, add: add, attr: attr };

  function update(event) {
    var ops;
    try { ops = JSON.parse(event.data); } catch (e) { return; }
    for (var i = 0; i < ops.length; i++) {
      var fn = apply[ops[i].op];
      if (fn) { fn(ops[i]); }
    }
    layoutAll();
  }

  layoutAll();
  var url = root.getAttribute("data-live");
  if (!url || !window.EventSource) { return; }
  var source = new EventSource(url);
  say("connecting…");
  source.addEventListener("ready", function () { say("following: what happens appears here as it happens"); });
  source.addEventListener("update", update);
  source.addEventListener("reload", function (event) {
    say(event.data);
    source.close();
  });
  source.onerror = function () {
    say(source.readyState === 2 ? "not following: reload the page" : "reconnecting…");  // 2: CLOSED
  };
  // Leaving the page ends the stream at once (the server stops following for it).
  window.addEventListener("pagehide", function () { source.close(); });
}());
