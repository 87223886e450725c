// The Costs page (pages/costs.py): its form asks htmx for the tables. htmx swaps only successful answers, so a
// parameter the page refuses (422: a range, a tag key or a tag value it cannot use) would leave the old tables in
// place with no word; that answer holds the page's error where the tables were, and is swapped in like any other.
// Any other failure (the console or its database unavailable, the network) is said above the tables, as text.
(function () {
  "use strict";
  var form = document.querySelector("form.costs-filters");
  var status = document.getElementById("costs-request-error");
  if (!form || !status) { return; }

  // A request of the form: htmx names its element in the event (beforeSwap fires on the target, #costs).
  function fromForm(event) {
    var detail = event.detail || {};
    return detail.elt === form || (detail.requestConfig && detail.requestConfig.elt === form);
  }

  function say(text) {
    status.textContent = text;
    status.hidden = !text;
  }

  document.body.addEventListener("htmx:beforeRequest", function (event) {
    if (fromForm(event)) { say(""); }
  });

  document.body.addEventListener("htmx:beforeSwap", function (event) {
    if (!fromForm(event)) { return; }
    if (event.detail.xhr.status === 422) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  document.body.addEventListener("htmx:responseError", function (event) {
    if (!fromForm(event)) { return; }
    var xhr = event.detail.xhr;
    say("The console answered " + xhr.status + " " + (xhr.statusText || "") +
        ": the costs below are those of the last request that worked. Try again in a moment.");
  });

  document.body.addEventListener("htmx:sendError", function (event) {
    if (!fromForm(event)) { return; }
    say("The console could not be reached: the costs below are those of the last request that worked.");
  });
})();
