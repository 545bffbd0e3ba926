// batchq web console: draws each page from the JSON API under /api/.
// Every value from Redis (queue names, job arguments, errors, tracebacks) is put on the
// page as text (text nodes, textContent), never parsed as HTML. No inline script runs:
// the Content-Security-Policy allows scripts from this origin only.
"use strict";

(function () {
  const meta = (name) => document.querySelector(`meta[name="batchq-${name}"]`).content;
  const PAGE = meta("page");
  const CSRF = meta("csrf");
  const READ_ONLY = meta("read-only") === "1";
  const REFRESH_MS = Math.min(Math.max(parseInt(meta("refresh-ms"), 10) || 2000, 1000), 60000);
  const main = document.getElementById("main");
  const params = new URLSearchParams(location.search);

  // --- building the page from text ----------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function link(href, text) { return el("a", { href }, text); }
  function qs(obj) { return new URLSearchParams(obj).toString(); }
  function fmtInt(n) { return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"); }
  function numCell(n, col, cls) {
    return el("td", { class: "num " + (n ? (cls || "") : "zero"), "data-col": col }, fmtInt(n));
  }
  function rate(v) { return v === null || v === undefined ? "–" : v.toFixed(v < 10 ? 2 : 1); }
  function duration(s) {
    if (s === null || s === undefined || isNaN(s)) return "-";
    if (s < 10) return s ? s.toFixed(1) + "s" : "0s";
    const n = Math.floor(s);
    if (n < 60) return n + "s";
    if (n < 3600) return Math.floor(n / 60) + "m" + String(n % 60).padStart(2, "0") + "s";
    if (n < 86400) return Math.floor(n / 3600) + "h" + String(Math.floor(n % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(n / 86400) + "d" + String(Math.floor(n % 86400 / 3600)).padStart(2, "0") + "h";
  }
  function when(ts) {
    if (ts === null || ts === undefined) return "-";
    return new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
  }
  function card(label, value, id, note) {
    return el("div", { class: "card" }, el("div", { class: "label" }, label),
      el("div", { class: "value", id }, value), note ? el("div", { class: "note" }, note) : null);
  }
  function table(headers, rows, numeric) {
    return el("div", { class: "panel" }, el("table", {},
      el("thead", {}, el("tr", {}, headers.map((h, i) =>
        el("th", { class: (numeric || []).includes(i) ? "num" : "" }, h)))),
      el("tbody", {}, rows)));
  }
  function banner(text, kind) {
    const b = document.getElementById("banner");
    b.hidden = !text;
    b.className = "banner" + (kind ? " " + kind : "");
    b.textContent = text || "";
  }
  function setLive(ok) {
    document.getElementById("live").className = "live " + (ok ? "on" : "err");
  }

  // --- talking to the API -------------------------------------------------------------

  async function api(path, query) {
    const res = await fetch("/api/" + path + (query ? "?" + qs(query) : ""),
      { credentials: "same-origin", headers: { Accept: "application/json" } });
    const data = await res.json().catch(() => ({ error: res.statusText }));
    if (res.status === 401) { location.reload(); }
    if (!res.ok) throw new Error(data.error || res.statusText);
    return data;
  }

  async function post(path, body) {
    const res = await fetch("/api/" + path, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": CSRF },
      body: JSON.stringify(body),
    });
    const data = await res.json().catch(() => ({ error: res.statusText }));
    if (!res.ok) throw new Error(data.error || res.statusText);
    return data;
  }

  function confirmDialog(text) {
    const dlg = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent = text;
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "yes"), { once: true });
      dlg.returnValue = "";
      dlg.showModal();
    });
  }

  // Redraw every REFRESH_MS while the tab is visible; one request at a time.
  function live(draw) {
    let timer = null;
    async function tick() {
      clearTimeout(timer);
      if (!document.hidden) {
        // a message of an action stays until the next action; the live one goes
        try { await draw(); setLive(true); if (document.getElementById("banner").classList.contains("stale")) banner(""); }
        catch (e) { setLive(false); banner("Cannot update: " + e.message, "stale"); }
      }
      timer = setTimeout(tick, REFRESH_MS);
    }
    document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
    tick();
    return tick;
  }

  function pager(total, offset, limit, go) {
    const end = Math.min(offset + limit, total);
    return el("div", { class: "pager" },
      el("span", { id: "page-info" }, total ? `${fmtInt(offset + 1)}–${fmtInt(end)} of ${fmtInt(total)}` : "none"),
      el("button", { id: "prev", disabled: offset <= 0, onclick: () => go(Math.max(0, offset - limit)) }, "‹ Prev"),
      el("button", { id: "next", disabled: end >= total, onclick: () => go(offset + limit) }, "Next ›"));
  }

  function setQuery(changes) {
    const p = new URLSearchParams(location.search);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === "" || v === 0) p.delete(k); else p.set(k, v);
    }
    history.replaceState(null, "", location.pathname + (p.toString() ? "?" + p : ""));
  }

  // --- pages -------------------------------------------------------------------------

  function overviewPage() {
    let offset = parseInt(params.get("offset"), 10) || 0;
    let filter = params.get("q") || "";
    const search = el("input", { type: "search", id: "filter", placeholder: "Filter queues", value: filter });
    const summary = el("div", { class: "cards" });
    const body = el("div");
    let tick = null;
    search.addEventListener("input", () => { filter = search.value; offset = 0; setQuery({ q: filter, offset: 0 }); tick(); });
    main.replaceChildren(el("h1", {}, "Queues"), summary,
      el("div", { class: "toolbar" }, search), body);
    tick = live(async () => {
      const d = await api("overview", { offset, limit: 50, q: filter });
      const qsum = (f) => d.queues.reduce((a, q) => a + q[f], 0);
      const part = d.total > d.queues.length ? "this page" : null;  // sums of the page shown
      summary.replaceChildren(card("Queues", fmtInt(d.total), "total-queues"),
        card("Workers", fmtInt(d.workers), "total-workers"),
        card("Ready", fmtInt(qsum("ready")), null, part), card("Reserved", fmtInt(qsum("reserved")), null, part),
        card("Delayed", fmtInt(qsum("delayed")), null, part), card("Dead", fmtInt(qsum("dead")), null, part));
      const rows = d.queues.map((q) => el("tr", { "data-queue": q.name },
        el("td", { "data-col": "name" }, link("/queue?" + qs({ name: q.name }), q.name)),
        numCell(q.ready, "ready"), numCell(q.delayed, "delayed"), numCell(q.reserved, "reserved"),
        el("td", { class: "num", "data-col": "dead" }, q.dead
          ? el("a", { class: "dead-count", href: "/dead?" + qs({ queue: q.name }) }, fmtInt(q.dead))
          : el("span", { class: "zero" }, "0")),
        el("td", { "data-col": "paused" }, el("span", { class: "badge " + (q.paused ? "paused" : "running") },
          q.paused ? "paused" : "running")),
        el("td", { class: "num", "data-col": "oldest" }, q.ready ? duration(q.oldest_age_s) : "-"),
        el("td", { class: "num", "data-col": "in" }, rate(q.in_per_s_1m)),
        el("td", { class: "num", "data-col": "out" }, rate(q.out_per_s_1m))));
      body.replaceChildren(
        table(["Queue", "Ready", "Delayed", "Reserved", "Dead", "State", "Oldest", "In/s (1m)", "Out/s (1m)"],
          rows.length ? rows : [el("tr", {}, el("td", { colspan: 9, class: "muted" }, "no queues"))],
          [1, 2, 3, 4, 6, 7, 8]),
        pager(d.total, offset, d.limit, (o) => { offset = o; setQuery({ offset: o }); tick(); }));
    });
  }

  function queuePage() {
    const name = params.get("name") || "";
    const state = el("span", { id: "queue-state", class: "badge" }, "…");
    const actions = el("div", { class: "toolbar" });
    const cards = el("div", { class: "cards" });
    const prio = el("div");
    const counters = el("div");
    main.replaceChildren(el("h1", {}, "Queue ", el("span", { id: "queue-name" }, name), state), actions,
      cards, el("h2", {}, "Ready by priority"), prio, el("h2", {}, "Counted by Redis since the queue began"), counters);
    let paused = null;
    const toggle = el("button", { id: "pause", hidden: READ_ONLY, onclick: async () => {
      toggle.disabled = true;
      try { await post(paused ? "queue/resume" : "queue/pause", { queue: name }); }
      catch (e) { banner(e.message); }
      toggle.disabled = false;
      tick();
    } }, "Pause");
    actions.append(toggle, link("/dead?" + qs({ queue: name }), "Dead letters →"),
      link("/groups?" + qs({ queue: name }), "Customers and limits →"));
    const tick = live(async () => {
      const q = await api("queue", { name });
      paused = q.paused;
      state.textContent = q.paused ? "paused" : "running";
      state.className = "badge " + (q.paused ? "paused" : "running");
      toggle.textContent = q.paused ? "Resume" : "Pause";
      toggle.id = q.paused ? "resume" : "pause";
      cards.replaceChildren(card("Ready", fmtInt(q.ready), "ready"), card("Delayed", fmtInt(q.delayed), "delayed"),
        card("Reserved", fmtInt(q.reserved), "reserved"), card("Dead", fmtInt(q.dead), "dead"),
        card("Oldest ready", q.ready ? duration(q.oldest_age_s) : "-", "oldest"),
        card("In/s (1m)", rate(q.in_per_s_1m), "in-rate", "5m: " + rate(q.in_per_s_5m)),
        card("Out/s (1m)", rate(q.out_per_s_1m), "out-rate", "5m: " + rate(q.out_per_s_5m)));
      const byPrio = q.ready_by_priority;
      const most = Math.max(1, ...Object.values(byPrio));
      const rows = [];
      for (let p = 9; p >= 0; p--) {
        const n = byPrio[String(p)] || 0;
        rows.push(el("tr", { "data-priority": p }, el("td", {}, String(p)), numCell(n, "ready"),
          el("td", {}, el("span", { class: "bar", style: null, "data-w": n }))));
      }
      prio.replaceChildren(table(["Priority", "Ready", ""], rows, [1]));
      // widths through the CSSOM (allowed by the CSP), not a style attribute
      prio.querySelectorAll(".bar").forEach((b) => { b.style.width = (240 * b.dataset.w / most) + "px"; });
      const c = q.counters;
      counters.replaceChildren(table(["Enqueued", "Succeeded", "Dead-lettered", "Retried"],
        [el("tr", {}, numCell(c.enqueued, "enqueued"), numCell(c.succeeded, "succeeded"),
          numCell(c.dead, "dead"), numCell(c.retried, "retried"))], [0, 1, 2, 3]));
    });
  }

  function deadPage() {
    const queue = params.get("queue") || "";
    let offset = parseInt(params.get("offset"), 10) || 0;
    let text = params.get("q") || "";
    let cursors = [0];
    const selected = new Set();
    const search = el("input", { type: "search", id: "search", placeholder: "Search task or error text", value: text });
    const info = el("span", { class: "muted", id: "dead-info" });
    const body = el("div");
    const bulk = (verb, label, cls, id) => el("button", { id, class: cls, hidden: READ_ONLY, onclick: () => act(verb, id.endsWith("all")) }, label);
    const tools = el("div", { class: "toolbar" },
      el("form", { id: "search-form", onsubmit: (e) => { e.preventDefault(); text = search.value.trim(); offset = 0; cursors = [0]; setQuery({ q: text, offset: 0 }); load(); } },
        search, " ", el("button", { type: "submit" }, "Search")),
      info, el("span", { class: "spacer" }),
      bulk("retry", "Retry selected", "", "retry-selected"), bulk("purge", "Purge selected", "danger", "purge-selected"),
      bulk("retry", "Retry all", "", "retry-all"), bulk("purge", "Purge all", "danger", "purge-all"));
    main.replaceChildren(el("h1", {}, "Dead letters of ", link("/queue?" + qs({ name: queue }), queue)), tools, body);

    async function act(verb, all) {
      const ids = [...selected];
      if (!all && !ids.length) { banner("Select jobs first (the boxes on the left)", "info"); return; }
      const what = all ? `every dead job of queue ${queue}` : `${ids.length} dead job${ids.length > 1 ? "s" : ""}`;
      const bulkAct = all || ids.length > 1;
      if (bulkAct && !(await confirmDialog(`${verb === "retry" ? "Retry" : "Permanently delete"} ${what}?`))) return;
      try {
        let done = 0, skip = 0, res;
        do {  // "all" goes in bounded chunks: the server does a few thousand per request
          res = await post("dead/" + verb, all ? { queue, all: true, skip, confirmed: true }
            : { queue, ids, confirmed: bulkAct });
          done += res.retried !== undefined ? res.retried : res.purged;
          skip = res.skip || 0;
          banner(`${verb === "retry" ? "Retried" : "Purged"} ${fmtInt(done)}; ${fmtInt(res.remaining)} dead left`, "info");
        } while (all && res.more);
        selected.clear();
        load();
      } catch (e) { banner(e.message); }
    }

    async function load() {
      const limit = 50;
      const d = text ? await api("dead", { queue, q: text, cursor: cursors[cursors.length - 1], limit })
        : await api("dead", { queue, offset, limit });
      const all = el("input", { type: "checkbox", id: "select-all", hidden: READ_ONLY, onchange: () => {
        body.querySelectorAll("input.pick").forEach((c) => { c.checked = all.checked; c.dispatchEvent(new Event("change")); });
      } });
      const rows = d.jobs.map((j) => {
        const pick = el("input", { type: "checkbox", class: "pick", "data-id": j.id, hidden: READ_ONLY, checked: selected.has(j.id),
          onchange: () => { pick.checked ? selected.add(j.id) : selected.delete(j.id); } });
        return el("tr", { "data-id": j.id }, el("td", {}, pick),
          el("td", { "data-col": "id" }, link("/dead/job?" + qs({ queue, id: j.id }), j.id)),
          el("td", { "data-col": "task" }, j.task || "?"), el("td", {}, j.reason),
          el("td", { class: "wrap", "data-col": "error" }, j.error_type ? `${j.error_type}: ${j.error_message}` : j.error_message || "-"),
          el("td", { class: "num" }, String(j.attempts)), el("td", {}, j.died_at));
      });
      const empty = el("tr", {}, el("td", { colspan: 7, class: "muted" }, text ? "no match in this stretch" : "no dead jobs"));
      let foot;
      if (text) {
        info.textContent = `searched ${fmtInt(d.cursor + d.scanned)} of ${fmtInt(d.total)}`;
        foot = el("div", { class: "pager" },
          el("button", { id: "prev", disabled: cursors.length < 2, onclick: () => { cursors.pop(); load(); } }, "‹ Prev"),
          el("button", { id: "next", disabled: d.next_cursor === null, onclick: () => { cursors.push(d.next_cursor); load(); } }, "Search further ›"));
      } else {
        info.textContent = `${fmtInt(d.total)} dead, newest first`;
        foot = pager(d.total, offset, limit, (o) => { offset = o; setQuery({ offset: o }); load(); });
      }
      body.replaceChildren(table([all, "ID", "Task", "Reason", "Error", "Attempts", "Died at (UTC)"],
        rows.length ? rows : [empty], [5]), foot);
    }
    load().catch((e) => banner(e.message));
  }

  function jobPage() {
    const queue = params.get("queue") || "";
    const id = params.get("id") || "";
    main.replaceChildren(el("h1", {}, "Dead job ", el("span", { id: "job-id" }, id)));
    async function action(verb) {
      try {
        await post("dead/" + verb, { queue, ids: [id] });
        location.href = "/dead?" + qs({ queue });
      } catch (e) { banner(e.message); }
    }
    api("dead/job", { queue, id }).then((j) => {
      const row = (k, v, attrs) => [el("dt", {}, k), el("dd", attrs || {}, v)];
      main.append(
        el("div", { class: "toolbar" },
          el("button", { id: "retry-one", class: "primary", hidden: READ_ONLY, onclick: () => action("retry") }, "Retry"),
          el("button", { id: "purge-one", class: "danger", hidden: READ_ONLY, onclick: () => action("purge") }, "Purge"),
          link("/dead?" + qs({ queue }), "← all dead letters of " + queue)),
        el("dl", { class: "record" },
          row("queue", link("/queue?" + qs({ name: j.queue }), j.queue)), row("task", j.task || "?", { id: "job-task" }),
          row("reason", j.reason), row("attempts", String(j.attempts)), row("died at", j.died_at),
          row("error", j.error_type || "-", { id: "job-error-type" })),
        el("h2", {}, "Error message"), el("pre", { id: "job-error" }, j.error_message || "-"),
        el("h2", {}, "Arguments"), el("pre", { id: "job-args" }, JSON.stringify(j.args, null, 2)),
        el("h2", {}, "Keyword arguments"), el("pre", { id: "job-kwargs" }, JSON.stringify(j.kwargs, null, 2)),
        el("h2", {}, "Traceback"), el("pre", { id: "job-traceback" }, j.traceback || "-"));
    }).catch((e) => banner(e.message));
  }

  function workersPage() {
    let offset = parseInt(params.get("offset"), 10) || 0;
    const body = el("div");
    main.replaceChildren(el("h1", {}, "Workers"), body);
    const tick = live(async () => {
      const d = await api("workers", { offset, limit: 50 });
      const now = Date.now() / 1000;
      const rows = d.workers.map((w) => el("tr", { "data-worker": w.id },
        el("td", {}, String(w.id)), el("td", {}, String(w.host || "-")), el("td", { class: "num" }, String(w.pid || "-")),
        el("td", { class: "wrap" }, String(w.queues || "-")), el("td", { class: "num" }, String(w.concurrency ?? "-")),
        el("td", { class: "num", "data-col": "in_flight" }, String(w.in_flight ?? "-")),
        el("td", { class: "num" }, fmtInt(w.succeeded)), el("td", { class: "num" }, fmtInt(w.failed)),
        el("td", { class: "num" }, typeof w.started_at === "number" ? duration(Math.max(0, now - w.started_at)) : "-"),
        el("td", { class: "num" }, typeof w.heartbeat_at === "number" ? duration(Math.max(0, now - w.heartbeat_at)) + " ago" : "-"),
        el("td", {}, w.paused ? el("span", { class: "badge paused" }, "paused") : "no")));
      body.replaceChildren(table(["ID", "Host", "PID", "Queues", "Concurrency", "In flight", "OK", "Failed", "Up", "Last heartbeat", "Paused"],
        rows.length ? rows : [el("tr", {}, el("td", { colspan: 11, class: "muted" }, "no live workers"))], [2, 4, 5, 6, 7, 8, 9]),
      pager(d.total, offset, d.limit, (o) => { offset = o; setQuery({ offset: o }); tick(); }));
    });
  }

  function periodicPage() {
    const body = el("div");
    main.replaceChildren(el("h1", {}, "Periodic tasks"), body);
    live(async () => {
      const d = await api("periodic");
      const rows = d.tasks.map((t) => el("tr", { "data-task": t.name },
        el("td", {}, t.name), el("td", {}, link("/queue?" + qs({ name: t.queue }), t.queue)),
        el("td", {}, t.schedule), el("td", {}, when(t.last_run_s)), el("td", {}, when(t.next_run_s)),
        el("td", {}, t.leader || "none")));
      body.replaceChildren(table(["Task", "Queue", "Schedule", "Last run (UTC)", "Next run (UTC)", "Leader"],
        rows.length ? rows : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no periodic tasks"))]));
    });
  }

  // --- start -------------------------------------------------------------------------

  const navFor = { overview: "overview", queue: "overview", dead: "overview", job: "overview",
    workers: "workers", periodic: "periodic", campaigns: "campaigns", campaign: "campaigns",
    groups: "groups", find: "find", audit: "audit" };
  document.querySelectorAll("nav a").forEach((a) => {
    if (a.dataset.nav === navFor[PAGE]) a.classList.add("active");
  });
  if (meta("auth") === "1") {
    const out = document.getElementById("logout");
    out.hidden = false;
    out.addEventListener("click", async () => {
      await fetch("/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": CSRF } });
      location.href = "/";
    });
  }
  if (READ_ONLY) {
    document.getElementById("where").after(el("span", { class: "badge paused", id: "read-only" }, "read-only"));
  }
  // the operator's pages live in ops.js (loaded first); they draw with these helpers
  const helpers = { el, link, qs, fmtInt, numCell, rate, duration, when, card, table, banner,
    api, post, confirmDialog, live, pager, setQuery, params, main, READ_ONLY };
  const own = { overview: overviewPage, queue: queuePage, dead: deadPage, job: jobPage,
    workers: workersPage, periodic: periodicPage };
  (own[PAGE] || (window.batchqPages || {})[PAGE])(helpers);
})();
