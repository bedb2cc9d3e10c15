// Live updates, as a progressive enhancement: every page is complete as served. The server streams the page's
// changing part (#live) as Server-Sent Events; this swaps it in, keeping keyboard focus and open <details>.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var state = document.getElementById("live-state");
  var toggle = document.getElementById("live-toggle");
  if (!live || !window.EventSource || !live.dataset.stream) return;
  var source = null;
  var last = null;

  function say(text) { if (state) state.textContent = text; }

  // Where focus was, as something that survives the swap: an id, or a link's address.
  function focusKey() {
    var el = document.activeElement;
    if (!el || !live.contains(el)) return null;
    if (el.id) return { id: el.id };
    if (el.getAttribute("href")) return { href: el.getAttribute("href") };
    return null;
  }

  function refocus(key) {
    if (!key) return;
    var again = key.id ? document.getElementById(key.id) : null;
    if (!again && key.href) {
      var links = live.querySelectorAll("a[href]");
      for (var i = 0; i < links.length; i++) {
        if (links[i].getAttribute("href") === key.href) { again = links[i]; break; }
      }
    }
    if (again) again.focus({ preventScroll: true });
  }

  function swap(html) {
    if (html === last) return;
    last = html;
    var key = focusKey();
    var open = [];
    live.querySelectorAll("details[open][id]").forEach(function (d) { open.push(d.id); });
    live.innerHTML = html;
    open.forEach(function (id) { var d = document.getElementById(id); if (d) d.open = true; });
    refocus(key);
  }

  function start() {
    source = new EventSource(live.dataset.stream);
    source.addEventListener("fragment", function (e) { swap(e.data); });
    source.onopen = function () { say("Live: updates as the cluster changes."); };
    source.onerror = function () { say("Live updates interrupted; reconnecting…"); };
  }

  function stop() {
    if (source) source.close();
    source = null;
    say("Live updates paused; the page shows the cluster as of the last update.");
  }

  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      var pause = toggle.getAttribute("aria-pressed") !== "true";
      toggle.setAttribute("aria-pressed", pause ? "true" : "false");
      if (pause) stop(); else start();
    });
  }
  start();
})();
