// The console's chat page: one WebSocket (/api/chat/ws), the specification's chat message out, the turn's
// deltas, tool calls and final status in (pages/chat.py describes the protocol). Text only ever goes into the
// page as textContent: messages and tool output are someone else's words.
(function () {
  "use strict";
  var form = document.getElementById("chat-form");
  if (!form) { return; }
  var log = document.getElementById("chat-log");
  var state = document.getElementById("chat-state");
  var sessionInput = document.getElementById("chat-session");
  var tagsInput = document.getElementById("chat-tags");
  var textInput = document.getElementById("chat-text");
  var profileInput = document.getElementById("chat-profile");
  var sendButton = document.getElementById("chat-send");
  var sessionLink = document.getElementById("chat-session-link");
  var socket = null;
  var reply = null;   // the assistant's text of the running turn
  var busy = false;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function add(node) {
    log.appendChild(node);
    node.scrollIntoView({ block: "end" });
    return node;
  }

  function message(role, text) {
    var box = el("div", "message " + role);
    box.appendChild(el("div", "role", role));
    var body = add(box).appendChild(el("div", "text", text));
    return body;
  }

  function setBusy(on) {
    busy = on;
    sendButton.disabled = on || !socket || socket.readyState !== WebSocket.OPEN;
  }

  function setSession(id) {
    sessionInput.value = id || "";
    tagsInput.disabled = !!id;
    if (id) { sessionLink.href = "/sessions/" + encodeURIComponent(id); sessionLink.textContent = "session " + id; }
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + location.host + form.dataset.socket + "?csrf_token=" + encodeURIComponent(form.dataset.csrf);
    socket = new WebSocket(url);
    socket.onopen = function () { state.textContent = "connected"; setBusy(busy); };
    socket.onclose = function () {
      state.textContent = "disconnected: reload the page (signed out?)";
      setBusy(busy);
    };
    socket.onmessage = function (event) {
      var m;
      try { m = JSON.parse(event.data); } catch (e) { return; }
      receive(m);
    };
  }

  function receive(m) {
    switch (m.type) {
      case "error":
        add(el("div", "error chat-error", m.error));
        setBusy(false);
        state.textContent = "refused";
        break;
      case "started":
        setSession(m.session_id);
        state.textContent = "running turn " + m.turn_id;
        reply = null;
        break;
      case "delta":
        if (m.kind === "text") {
          if (!reply) { reply = message("assistant", ""); }
          reply.textContent += m.text;
        } else if (m.kind === "tool_call") {
          reply = null;
          add(el("div", "toolcall muted", "calling " + m.text + "…"));
        } else if (m.kind === "done") {
          reply = null;
        }
        break;
      case "approval":
        var wait = add(el("div", "toolcall chat-approval"));
        wait.appendChild(el("strong", "", m.tool));
        wait.appendChild(el("span", "status pending", "waiting for approval"));
        wait.appendChild(el("pre", "", JSON.stringify(m.args, null, 2)));
        var link = wait.appendChild(el("a", "", "decide on the Approvals page"));
        link.href = "/approvals";
        break;
      case "approval_decided":
        add(el("div", "toolcall", "approval of " + m.call_id + ": " + m.status + " by " + m.decided_by));
        break;
      case "tool_call":
        var call = add(el("details", "toolcall chat-tool"));
        var summary = call.appendChild(el("summary"));
        summary.appendChild(el("strong", "", m.name));
        summary.appendChild(document.createTextNode(" "));
        summary.appendChild(el("span", "risk-" + m.risk, "risk " + m.risk));
        if (m.approval) { summary.appendChild(el("span", "status " + m.approval, m.approval)); }
        if (m.is_error) { summary.appendChild(el("span", "status failed", "error")); }
        call.appendChild(el("pre", "", JSON.stringify(m.args, null, 2)));
        call.appendChild(el("pre", "", m.result === null ? "" : m.result));
        break;
      case "done":
        if (m.session_id) { setSession(m.session_id); }
        var done = add(el("div", "chat-done"));
        done.appendChild(el("span", "status " + m.status, m.status));
        if (m.error) { done.appendChild(el("span", "error", " " + m.error)); }
        state.textContent = "turn " + m.status;
        reply = null;
        setBusy(false);
        break;
    }
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = textInput.value.trim();
    if (!text || busy || !socket || socket.readyState !== WebSocket.OPEN) { return; }
    var out = { text: text, profile_id: profileInput.value };
    if (sessionInput.value.trim()) {
      out.session_id = sessionInput.value.trim();
    } else {
      out.tags = tagsInput.value.split(/[\s,]+/).filter(function (t) { return t.length > 0; });
    }
    message("user", text);
    textInput.value = "";
    setBusy(true);
    state.textContent = "sending…";
    socket.send(JSON.stringify(out));
  });

  document.getElementById("chat-new").addEventListener("click", function () {
    setSession("");
    log.textContent = "";
  });
  textInput.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  setSession(sessionInput.value.trim());
  connect();
}());
