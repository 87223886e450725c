// The console's chat page: one WebSocket (/api/chat/ws), the specification's chat message out, the turn's
// deltas, tool calls and final status in (pages/chat.py describes the protocol). Text only ever goes into the
// page as textContent: messages and tool output are someone else's words.
//
// The CSRF token goes with the socket as a subprotocol (never in its URL); a waiting approval is decided here
// (POST /api/approvals/{id}/approve or /deny, as the Approvals page does); the session's id is kept in the
// page's address (?session=), so a reload or Back shows the conversation again (the server renders it) and
// follows its turn if one still runs.
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
  var csrf = form.dataset.csrf;
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

  function profileOffered() {
    var option = profileInput.options[profileInput.selectedIndex];
    return !!option && !option.disabled && !!profileInput.value;
  }

  function setBusy(on) {
    busy = on;
    sendButton.disabled = on || !socket || socket.readyState !== WebSocket.OPEN || !profileOffered();
  }

  function setSession(id) {
    sessionInput.value = id || "";
    tagsInput.disabled = !!id;
    if (id) {
      sessionLink.href = "/sessions/" + encodeURIComponent(id);
      sessionLink.textContent = "session " + id;
    } else {
      sessionLink.href = "/sessions";
      sessionLink.textContent = "Sessions";
    }
    // The address says which conversation this is: a reload or Back brings it back.
    var shown = new URLSearchParams(location.search).get("session") || "";
    if (shown !== (id || "")) {
      history.replaceState(null, "", id ? "/chat?session=" + encodeURIComponent(id) : "/chat");
    }
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + form.dataset.socket, ["cos.chat", "csrf." + csrf]);
    socket.onopen = function () {
      state.textContent = "connected";
      setBusy(busy);
      // A conversation shown again while its turn runs: follow that turn to its end.
      if (log.dataset.follow) { socket.send(JSON.stringify({ follow: log.dataset.follow })); }
    };
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

  // Approvals: a box per waiting call, decided here or elsewhere; its badge always says where it stands.

  function approvalBox(callId) {
    var boxes = log.querySelectorAll(".chat-approval");
    for (var i = boxes.length - 1; i >= 0; i--) {
      if (boxes[i].dataset.callId === callId && !boxes[i].dataset.decided) { return boxes[i]; }
    }
    return null;
  }

  function showDecision(box, status, decidedBy) {
    box.dataset.decided = status;
    var badge = box.querySelector(".status");
    var words = status === "timed_out" ? "timed out: nobody decided in time, not run" : status + " by " + decidedBy;
    badge.className = "status " + status;
    badge.textContent = words;
    var decide = box.querySelector(".decide");
    if (decide) { decide.remove(); }
    var link = box.querySelector("a");
    if (link) { link.remove(); }
    var note = box.querySelector(".chat-approval-note");
    if (note) { note.remove(); }
  }

  function decide(box, verb) {
    var buttons = box.querySelectorAll(".decide button");
    buttons.forEach(function (b) { b.disabled = true; });
    var note = box.querySelector(".chat-approval-note") || box.appendChild(el("div", "error chat-approval-note"));
    note.setAttribute("role", "alert");
    note.textContent = "";
    fetch("/api/approvals/" + encodeURIComponent(box.dataset.approvalId) + "/" + verb, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, "Accept": "application/json" }
    }).then(function (response) {
      return response.json().then(function (body) { return { ok: response.ok, status: response.status, body: body }; },
        function () { return { ok: response.ok, status: response.status, body: {} }; });
    }).then(function (answer) {
      if (answer.ok) {
        showDecision(box, answer.body.status, answer.body.decided_by);
        return;
      }
      if (box.dataset.decided) { return; }  // decided meanwhile (its event came first)
      var detail = answer.body && answer.body.detail ? answer.body.detail : "HTTP " + answer.status;
      note.textContent = "not " + (verb === "approve" ? "approved" : "denied") + ": " + detail;
      buttons.forEach(function (b) { b.disabled = false; });
    }, function (error) {
      note.textContent = "not sent: " + error;
      buttons.forEach(function (b) { b.disabled = false; });
    });
  }

  function bindApproval(box) {
    var approve = box.querySelector("button.approve");
    var deny = box.querySelector("button.deny");
    if (approve) { approve.addEventListener("click", function () { decide(box, "approve"); }); }
    if (deny) { deny.addEventListener("click", function () { decide(box, "deny"); }); }
  }

  function waitingBox(m) {
    var box = el("div", "toolcall chat-approval");
    box.dataset.approvalId = m.approval_id;
    box.dataset.callId = m.call_id;
    box.appendChild(el("strong", "", m.tool));
    var until = new Date(m.expires_at);
    var when = isNaN(until.getTime()) ? "" : " until " + until.toISOString().slice(11, 19) + " UTC";
    box.appendChild(el("span", "status pending", "waiting for approval" + when));
    box.appendChild(el("pre", "", JSON.stringify(m.args, null, 2)));
    var buttons = box.appendChild(el("span", "decide"));
    buttons.appendChild(el("button", "approve", "Approve")).type = "button";
    buttons.appendChild(document.createTextNode(" "));
    buttons.appendChild(el("button", "deny", "Deny")).type = "button";
    var link = box.appendChild(el("a", "", "or decide on the Approvals page (new tab)"));
    link.href = "/approvals";
    link.target = "_blank";
    link.rel = "noopener";
    bindApproval(add(box));
  }

  function receive(m) {
    switch (m.type) {
      case "error":
        add(el("div", "error chat-error", m.error));
        setBusy(false);
        state.textContent = "refused";
        break;
      case "following":
        setBusy(true);
        state.textContent = "following turn " + m.turn_id;
        reply = null;
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
        waitingBox(m);
        break;
      case "approval_decided":
        var box = approvalBox(m.call_id);
        if (box) { showDecision(box, m.status, m.decided_by); }
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
        delete log.dataset.follow;
        log.querySelectorAll(".chat-running").forEach(function (note) { note.remove(); });
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
    if (!text || busy || !socket || socket.readyState !== WebSocket.OPEN || !profileOffered()) { return; }
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
  profileInput.addEventListener("change", function () { setBusy(busy); });
  textInput.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  // The approvals still waiting in a conversation shown again (the server rendered them): decided here too.
  log.querySelectorAll(".chat-approval").forEach(bindApproval);
  // Back to a page the browser kept (its socket closed meanwhile): connect again.
  window.addEventListener("pageshow", function (event) {
    if (event.persisted && (!socket || socket.readyState !== WebSocket.OPEN)) { connect(); }
  });
  setSession(sessionInput.value.trim());
  connect();
}());
