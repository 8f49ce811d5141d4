// gantry dashboard: live parts of server-rendered pages. No framework, no
// build step: refresh the [data-live] sections, count down expiries, ask
// before an action, follow the audit tail and a task's output (SSE).
(function () {
  "use strict";

  var every = parseInt(document.body.dataset.refresh || "2000", 10);
  var dialog = document.getElementById("confirm");
  var dot = document.getElementById("live-dot");
  var busy = false;

  function span(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  // tick rewrites every relative time: "12s ago", and the countdowns of
  // lease expiries, cooldowns and next fires.
  function tick() {
    var now = Date.now();
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      var s = (now - Date.parse(el.dateTime)) / 1000;
      el.textContent = s < 0 ? "in " + span(-s) : span(s) + " ago";
    });
    document.querySelectorAll("time[data-countdown]").forEach(function (el) {
      var s = (Date.parse(el.dateTime) - now) / 1000;
      el.textContent = s >= 0 ? "in " + span(s) : span(-s) + " ago";
      el.classList.toggle("late", s < 0);
    });
  }

  function stale(yes) {
    if (dot) dot.classList.toggle("stale", yes);
  }

  // refresh fetches the page again and swaps in each live section that
  // changed, unless the user is busy with it.
  function refresh() {
    var live = document.querySelectorAll("[data-live][id]");
    if (!live.length || busy || document.hidden || (dialog && dialog.open)) return;
    busy = true;
    fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store" })
      .then(function (res) {
        if (res.redirected && new URL(res.url).pathname === "/login") {
          location.reload();
          return null;
        }
        if (!res.ok) throw new Error(res.status);
        return res.text();
      })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (!fresh || fresh.innerHTML === el.innerHTML) return;
          var active = document.activeElement;
          if (active && active !== document.body && el.contains(active)) return;
          if (el.querySelector("details[open]")) return;
          el.replaceWith(document.importNode(fresh, true));
        });
        tick();
        stale(false);
      })
      .catch(function () { stale(true); })
      .then(function () { busy = false; });
  }

  // An action's form asks first, in the dialog; the server asks again
  // (a page of its own) when the form comes without the answer.
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (!form.matches("form[data-confirm]") || !dialog || typeof dialog.showModal !== "function") return;
    e.preventDefault();
    document.getElementById("confirm-text").textContent = form.dataset.confirm;
    document.getElementById("confirm-detail").textContent = form.dataset.detail || "";
    dialog.returnValue = "";
    dialog.onclose = function () {
      if (dialog.returnValue !== "yes") return;
      var yes = document.createElement("input");
      yes.type = "hidden";
      yes.name = "confirm";
      yes.value = "yes";
      form.appendChild(yes);
      form.submit();
    };
    dialog.showModal();
    document.getElementById("confirm-yes").focus();
  });

  function cell(tr, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function chip(parent, cls, text, href) {
    var el = document.createElement(href ? "a" : "span");
    el.className = cls;
    el.textContent = text;
    if (href) el.href = href;
    parent.appendChild(el);
    parent.appendChild(document.createTextNode(" "));
    return el;
  }

  // eventRow renders an audit event as the server renders one.
  function eventRow(ev) {
    var tr = document.createElement("tr");
    tr.className = "lv-" + ev.level;
    var t = cell(tr, "nowrap mono");
    t.textContent = ev.clock;
    t.title = ev.time;
    chip(cell(tr), "lvl lvl-" + ev.level, ev.level);
    chip(cell(tr), "etype", ev.type);
    var about = cell(tr, "about");
    if (ev.task_id) chip(about, "mono", ev.task_id.length > 14 ? ev.task_id.slice(0, 13) + "…" : ev.task_id, "/tasks/" + encodeURIComponent(ev.task_id));
    if (ev.resource_id) chip(about, "tag", "res " + ev.resource_id, "/resources/" + encodeURIComponent(ev.resource_id));
    if (ev.route_id) chip(about, "tag", "route " + ev.route_id, "/routes");
    if (ev.job_id) chip(about, "tag", "job " + ev.job_id, "/jobs/" + encodeURIComponent(ev.job_id));
    var msg = cell(tr, "msg");
    msg.textContent = ev.message || "";
    if (ev.payload) {
      var det = document.createElement("details");
      var sum = document.createElement("summary");
      sum.textContent = "payload";
      var pre = document.createElement("pre");
      pre.textContent = JSON.stringify(ev.payload);
      det.appendChild(sum);
      det.appendChild(pre);
      msg.appendChild(det);
    }
    cell(tr, "muted nowrap").textContent = ev.component + "@" + ev.host;
    return tr;
  }

  function followAudit() {
    var tail = document.getElementById("tail");
    if (!tail || !window.EventSource) return;
    var rows = tail.querySelector("tbody");
    var status = document.getElementById("tail-status");
    var counter = document.getElementById("tail-count");
    var empty = document.getElementById("tail-empty");
    var pause = document.getElementById("tail-pause");
    var paused = false, held = [], n = 0;
    function show(ev) {
      rows.insertBefore(eventRow(ev), rows.firstChild);
      while (rows.children.length > 300) rows.removeChild(rows.lastChild);
      if (empty) empty.hidden = true;
    }
    pause.addEventListener("click", function () {
      paused = !paused;
      pause.textContent = paused ? "Resume" : "Pause";
      if (!paused) { held.forEach(show); held = []; }
    });
    var es = new EventSource(tail.dataset.src);
    es.addEventListener("open", function () { status.textContent = "live"; tail.classList.remove("down"); });
    es.addEventListener("error", function () { status.textContent = "reconnecting…"; tail.classList.add("down"); });
    es.addEventListener("audit", function (m) {
      var ev = JSON.parse(m.data);
      n++;
      counter.textContent = n + (n === 1 ? " event" : " events");
      if (paused) held.push(ev); else show(ev);
    });
    window.addEventListener("pagehide", function () { es.close(); });
  }

  function followOutput() {
    var out = document.getElementById("output");
    if (!out || !out.dataset.src || !window.EventSource) return;
    var status = document.getElementById("output-status");
    var first = true;
    var es = new EventSource(out.dataset.src);
    function done(text) {
      es.close();
      status.textContent = text;
      setTimeout(refresh, 100);
    }
    es.addEventListener("line", function (m) {
      var l = JSON.parse(m.data);
      if (first) { out.textContent = ""; first = false; }
      var stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      var s = document.createElement("span");
      if (l.stream === "stderr") s.className = "stderr";
      s.textContent = l.line + "\n";
      out.appendChild(s);
      if (stick) out.scrollTop = out.scrollHeight;
    });
    es.addEventListener("end", function (m) { done("ended: " + JSON.parse(m.data)); });
    es.addEventListener("problem", function (m) { done("output unavailable: " + JSON.parse(m.data)); });
    es.addEventListener("error", function () { done("output stream closed: reload to follow it again"); });
    window.addEventListener("pagehide", function () { es.close(); });
  }

  tick();
  setInterval(tick, 1000);
  setInterval(refresh, every);
  followAudit();
  followOutput();
})();
