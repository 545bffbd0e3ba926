// batchq web console: the operator's pages (campaigns, customers and limits, one job,
// the audit log). Loaded before app.js, which calls the page with its helpers. As in
// app.js, every value from Redis is put on the page as text (text nodes, textContent,
// attribute values), never parsed as HTML; no inline script or style.
"use strict";

(function () {
  const pages = {};

  function pct(n, total) { return total ? Math.floor(1000 * n / total) / 10 : 0; }

  // a progress bar whose width is set through the CSSOM (the CSP allows no style attribute)
  function progressBar(h, done, total, id) {
    const fill = h.el("span", { class: "fill" });
    fill.style.width = pct(done, total) + "%";
    return h.el("span", { class: "progress", id, title: `${done} of ${total}` }, fill);
  }

  function stateBadge(h, state, id) {
    const cls = { open: "running", sealed: "running", done: "done", cancelled: "paused",
      ready: "running", waiting: "paused", blocked: "paused", idle: "", dead: "bad",
      succeeded: "done", reserved: "running", delayed: "", unknown: "" }[state] || "";
    return h.el("span", { class: "badge " + cls, id }, state || "-");
  }

  // a card whose value is words or a date, not one number: a smaller font
  function textCard(h, label, value, id, note) {
    const c = h.card(label, value, id, note);
    c.querySelector(".value").classList.add("text");
    return c;
  }

  function num(h, v) { return v === null || v === undefined ? "-" : h.fmtInt(v); }
  function eta(h, s) { return s === null || s === undefined ? "-" : h.duration(s); }
  function iso(v) { return v ? String(v).replace("T", " ") : "-"; }

  // --- campaigns -------------------------------------------------------------------

  pages.campaigns = function (h) {
    const body = h.el("div");
    h.main.replaceChildren(h.el("h1", {}, "Campaigns"), body);
    h.live(async () => {
      const d = await h.api("campaigns", { limit: 50 });
      const rows = d.campaigns.map((c) => h.el("tr", { "data-campaign": c.id },
        h.el("td", { "data-col": "id" }, h.link("/campaign?" + h.qs({ id: c.id }), c.id)),
        h.el("td", { "data-col": "state" }, stateBadge(h, c.state)),
        h.el("td", { "data-col": "progress" }, progressBar(h, c.finished, c.total),
          h.el("span", { class: "muted" }, ` ${h.fmtInt(c.finished)}/${h.fmtInt(c.total)}`)),
        h.numCell(c.pending, "pending"), h.numCell(c.succeeded, "succeeded"),
        h.numCell(c.dead, "dead", "dead-count"), h.numCell(c.cancelled, "cancelled"),
        h.numCell(c.expired, "expired"),
        h.el("td", { class: "num", "data-col": "rate", title: c.rate_source }, h.rate(c.rate_per_s)),
        h.el("td", { class: "num", "data-col": "eta" }, eta(h, c.eta_s)),
        h.el("td", { "data-col": "created" }, h.when(c.created_at)),
        h.el("td", { "data-col": "finished" }, h.when(c.finished_at))));
      body.replaceChildren(h.table(["Campaign", "State", "Progress", "Pending", "Succeeded",
        "Dead", "Cancelled", "Expired", "Done/s", "ETA", "Created (UTC)", "Finished (UTC)"],
      rows.length ? rows : [h.el("tr", {}, h.el("td", { colspan: 12, class: "muted" }, "no campaigns"))],
      [3, 4, 5, 6, 7, 8, 9]));
    });
  };

  pages.campaign = function (h) {
    const id = h.params.get("id") || "";
    const state = h.el("span", { id: "campaign-state", class: "badge" }, "…");
    const cancel = h.el("button", { id: "cancel-campaign", class: "danger", hidden: true }, "Cancel campaign");
    const cards = h.el("div", { class: "cards" });
    const bar = h.el("div", { class: "bigbar" });
    const queues = h.el("div");
    h.main.replaceChildren(
      h.el("h1", {}, "Campaign ", h.el("span", { id: "campaign-id" }, id), state),
      h.el("div", { class: "toolbar" }, cancel, h.link("/campaigns", "← all campaigns")),
      cards, bar, h.el("h2", {}, "Queues and their groups"), queues);
    let last = null;
    cancel.addEventListener("click", async () => {
      if (!last) return;
      const text = `Cancel campaign ${id}? Up to ${h.fmtInt(last.pending)} pending jobs ` +
        "will not run (jobs already running finish).";
      if (!(await h.confirmDialog(text))) return;
      try {
        const res = await h.post("campaign/cancel", { id, confirmed: true });
        h.banner(`Campaign ${id} cancelled: ${h.fmtInt(res.not_started)} jobs not started will not run`, "info");
      } catch (e) { h.banner(e.message); }
      tick();
    });
    const tick = h.live(async () => {
      const c = await h.api("campaign", { id });
      last = c;
      state.textContent = c.state;
      state.className = "badge " + ({ done: "done", cancelled: "paused" }[c.state] || "running");
      cancel.hidden = h.READ_ONLY || !(c.state === "open" || c.state === "sealed");
      cards.replaceChildren(
        h.card("Done", `${pct(c.finished, c.total)}%`, "done-pct", `${h.fmtInt(c.finished)} of ${h.fmtInt(c.total)}`),
        h.card("Pending", h.fmtInt(c.pending), "pending"), h.card("Succeeded", h.fmtInt(c.succeeded), "succeeded"),
        h.card("Dead", h.fmtInt(c.dead), "dead"), h.card("Cancelled", h.fmtInt(c.cancelled), "cancelled"),
        h.card("Expired", h.fmtInt(c.expired), "expired"),
        h.card("Done/s", h.rate(c.rate_per_s), "rate", c.rate_source === "1m" ? "last minute" : "average"),
        h.card("ETA", eta(h, c.eta_s), "eta"),
        textCard(h, "Created (UTC)", h.when(c.created_at), "created"),
        textCard(h, "Finished (UTC)", h.when(c.finished_at), "finished"));
      bar.replaceChildren(progressBar(h, c.finished, c.total, "campaign-progress"));
      queues.replaceChildren(...c.per_queue.map((q) => h.el("section", { "data-queue": q.queue },
        h.el("h3", {}, h.link("/groups?" + h.qs({ queue: q.queue }), q.queue),
          q.flag ? h.el("span", { class: "muted" }, " " + q.flag) : null),
        q.total === undefined ? null : h.table(["Total", "Pending", "Succeeded", "Dead", "Cancelled", "Expired"],
          [h.el("tr", {}, h.numCell(q.total, "total"), h.numCell(q.pending, "pending"),
            h.numCell(q.succeeded, "succeeded"), h.numCell(q.dead, "dead"), h.numCell(q.cancelled, "cancelled"),
            h.numCell(q.expired, "expired"))],
          [0, 1, 2, 3, 4, 5]),
        h.table(["Group with ready jobs", "Pending", "Running", "State"],
          q.groups.length ? q.groups.map((g) => h.el("tr", { "data-group": g.group },
            h.el("td", {}, g.group), h.numCell(g.pending, "pending"), h.numCell(g.running, "running"),
            h.el("td", {}, stateBadge(h, g.state), g.until_s ? " " + h.duration(g.until_s) : "")))
            : [h.el("tr", {}, h.el("td", { colspan: 4, class: "muted" }, "no group has ready jobs"))], [1, 2]))));
    });
  };

  // --- customers (groups) and limits -------------------------------------------------

  function describe(lim) {
    if (!lim) return "none";
    const bits = [];
    if (lim.rate_per_s !== null) bits.push(`rate ${lim.rate_per_s}/s`);
    if (lim.burst !== null) bits.push(`burst ${lim.burst}`);
    if (lim.concurrency !== null) bits.push(`concurrency ${lim.concurrency}`);
    if (lim.max_pending !== null) bits.push(`quota ${lim.max_pending}`);
    if (lim.weight !== null) bits.push(`weight ${lim.weight}`);
    return bits.join(", ") || "none";
  }

  function field(h, id, label, attrs) {
    return h.el("label", { class: "field" }, h.el("span", {}, label),
      h.el("input", Object.assign({ id, name: id, autocomplete: "off" }, attrs || {})));
  }

  pages.groups = function (h) {
    let queue = h.params.get("queue") || "";
    const pick = h.el("select", { id: "queue-pick" });
    const head = h.el("div", { class: "cards" });
    const body = h.el("div");
    const val = (id) => document.getElementById(id).value.trim();
    const numOrNull = (id) => (val(id) === "" ? null : Number(val(id)));
    const limitForm = h.el("form", { id: "limit-form", class: "form", hidden: h.READ_ONLY },
      h.el("h3", {}, "Limit"),
      field(h, "limit-group", "Group", { placeholder: "empty: the queue; * : every group" }),
      field(h, "limit-rate", "Rate/s", { inputmode: "decimal" }), field(h, "limit-burst", "Burst", { inputmode: "numeric" }),
      field(h, "limit-concurrency", "Concurrency", { inputmode: "numeric" }),
      field(h, "limit-quota", "Quota", { inputmode: "numeric" }), field(h, "limit-weight", "Weight", { inputmode: "decimal" }),
      h.el("div", { class: "buttons" }, h.el("button", { type: "submit", id: "limit-set", class: "primary" }, "Set limit"),
        h.el("button", { type: "button", id: "limit-rm", class: "danger" }, "Remove limit")));
    const holdForm = h.el("form", { id: "hold-form", class: "form", hidden: h.READ_ONLY },
      h.el("h3", {}, "Hold"),
      field(h, "hold-group", "Group", { placeholder: "empty: the whole queue" }),
      field(h, "hold-seconds", "Seconds", { inputmode: "decimal", value: "60" }),
      h.el("div", { class: "buttons" }, h.el("button", { type: "submit", id: "hold", class: "primary" }, "Hold"),
        h.el("button", { type: "button", id: "release" }, "Release")));
    h.main.replaceChildren(h.el("h1", {}, "Customers and limits of ", pick), head,
      h.el("div", { class: "forms" }, limitForm, holdForm), h.el("h2", {}, "Groups"), body);

    async function act(path, body, done) {
      try {
        const res = await h.post(path, Object.assign({ queue }, body));
        h.banner(done(res), "info");
      } catch (e) { h.banner(e.message); }
      tick();
    }
    const group = (id) => val(id) || null;
    limitForm.addEventListener("submit", (e) => {
      e.preventDefault();
      act("limit/set", { group: group("limit-group"), rate_per_s: numOrNull("limit-rate"),
        burst: numOrNull("limit-burst"), concurrency: numOrNull("limit-concurrency"),
        max_pending: numOrNull("limit-quota"), weight: numOrNull("limit-weight") },
      (r) => `Limit of ${r.group === null ? "the queue" : r.group}: ${r.describe}`);
    });
    document.getElementById("limit-rm").addEventListener("click", () =>
      act("limit/rm", { group: group("limit-group") },
        (r) => (r.removed ? "Removed the limit of " : "There was no limit on ") + (r.group === null ? "the queue" : r.group)));
    holdForm.addEventListener("submit", (e) => {
      e.preventDefault();
      act("hold", { group: group("hold-group"), seconds: numOrNull("hold-seconds") },
        (r) => `Held ${r.group === null ? "the queue" : r.group} for ${r.held_s}s` +
          (r.in_force_s > r.held_s + 1 ? ` (a longer hold stays: ${Math.round(r.in_force_s)}s left)` : ""));
    });
    const release = (g) => act("release", { group: g },
      (r) => r.released ? `Released ${r.group === null ? "the queue" : r.group}` : `${r.group === null ? "The queue" : r.group} was not held`);
    document.getElementById("release").addEventListener("click", () => release(group("hold-group")));
    function choose(g, lim) {  // a row's group into both forms
      document.getElementById("limit-group").value = g;
      document.getElementById("hold-group").value = g;
      const set = (id, v) => { document.getElementById(id).value = v === null || v === undefined ? "" : v; };
      set("limit-rate", lim && lim.rate_per_s); set("limit-burst", lim && lim.burst);
      set("limit-concurrency", lim && lim.concurrency); set("limit-quota", lim && lim.max_pending);
      set("limit-weight", lim && lim.weight);
    }

    pick.addEventListener("change", () => { queue = pick.value; h.setQuery({ queue }); tick(); });
    async function fillPicker() {
      const d = await h.api("overview", { limit: 200 });
      const names = d.queues.map((q) => q.name);
      if (!queue) queue = (d.queues.find((q) => q.ready) || d.queues[0] || { name: "default" }).name;
      if (!names.includes(queue)) names.unshift(queue);
      pick.replaceChildren(...names.map((n) => h.el("option", { value: n, selected: n === queue }, n)));
    }

    const tick = h.live(async () => {
      if (!pick.options.length) await fillPicker();
      const d = await h.api("groups", { queue });
      const hold = d.hold;
      head.replaceChildren(
        textCard(h, "Queue", d.paused ? "paused" : "running", "queue-state"),
        textCard(h, "Queue limit", describe(d.limit), "queue-limit", d.running === null ? null : `${h.fmtInt(d.running)} running`),
        textCard(h, "Every group (*)", describe(d.default_limit), "default-limit"),
        textCard(h, "Queue hold", hold.held ? `${h.duration(hold.until_s)} left` : "none", "queue-hold",
          hold.held ? `by ${hold.why || "unknown"}` : `${h.fmtInt(hold.groups_held)} groups held`),
        textCard(h, "Group limits", h.fmtInt(d.limits_total), "limits-total", "stored"));
      const rows = d.groups.map((g) => {
        const lim = g.limit || {};
        const cell = (v, col) => h.el("td", { class: "num" + (g.source === "*" ? " inherited" : ""), "data-col": col },
          v === null || v === undefined ? "-" : String(v));
        return h.el("tr", { "data-group": g.group },
          h.el("td", { "data-col": "group" }, h.el("a", { href: "#", class: "pick-group",
            onclick: (e) => { e.preventDefault(); choose(g.group, g.source === "own" ? g.limit : null); } }, g.group)),
          h.numCell(g.ready, "ready"), h.numCell(g.running, "running"), h.numCell(g.pending, "pending"),
          cell(lim.rate_per_s, "rate"), cell(lim.burst, "burst"), cell(lim.concurrency, "concurrency"),
          cell(lim.max_pending, "quota"), cell(lim.weight, "weight"),
          h.el("td", { "data-col": "source" }, g.source === "own" ? "own" : g.source === "*" ? "from *" : "-"),
          h.el("td", { "data-col": "state" }, stateBadge(h, g.state)),
          h.el("td", { "data-col": "held" }, g.held ? `${h.duration(g.until_s)} (${g.why || "?"})` : "-"),
          h.el("td", { class: "num", "data-col": "share" }, g.share === null ? "-" : `${Math.round(100 * g.share)}%`),
          h.el("td", {}, g.held && !h.READ_ONLY
            ? h.el("button", { class: "release-group", "data-group": g.group, onclick: () => release(g.group) }, "Release")
            : null));
      });
      body.replaceChildren(h.table(["Group", "Ready", "Running", "Pending", "Rate/s", "Burst", "Concurrency",
        "Quota", "Weight", "Limits", "State", "Held (why)", "Share of running", ""],
      rows.length ? rows : [h.el("tr", {}, h.el("td", { colspan: 14, class: "muted" }, "no groups with ready jobs or limits"))],
      [1, 2, 3, 4, 5, 6, 7, 8, 12]));
    });
  };

  // --- one job -----------------------------------------------------------------------

  // what the handler reported (current_job().progress): a bar for a percentage, the
  // number as text either way (a count of items may pass 100)
  function progressCell(h, v) {
    if (v === null || v === undefined) return null;
    const text = String(Math.round(Number(v) * 100) / 100);
    if (!(v >= 0 && v <= 100)) return text;
    return h.el("span", {}, h.el("progress", { max: 100, value: v, id: "job-progress-bar" }), " " + text + " %");
  }

  pages.find = function (h) {
    let id = h.params.get("id") || "";
    const input = h.el("input", { type: "search", id: "job-id-input", placeholder: "Job id", value: id });
    const out = h.el("div", { id: "job-found" });
    const form = h.el("form", { id: "find-form", class: "toolbar" }, input, h.el("button", { type: "submit" }, "Find"));
    h.main.replaceChildren(h.el("h1", {}, "Find a job"), form, out);
    let tick = null;
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      id = input.value.trim();
      h.setQuery({ id });
      if (!tick) tick = h.live(draw); else tick();
    });
    async function act(verb) {
      try {
        const res = await h.post("job/" + verb, { id });
        h.banner(verb === "cancel" ? (res.cancelled ? "Cancelled: it will not run" : `Not cancelled: the job is ${res.state}`)
          : `Retried: the job is ${res.state}`, "info");
      } catch (e) { h.banner(e.message); }
      tick();
    }
    async function draw() {
      if (!id) return;
      const j = await h.api("job", { id });
      const row = (k, v, rid) => [h.el("dt", {}, k), h.el("dd", { id: rid }, v === null || v === undefined ? "-" : v)];
      const tools = h.el("div", { class: "toolbar" },
        j.actions.includes("cancel") && !h.READ_ONLY ? h.el("button", { id: "job-cancel", class: "danger", onclick: () => act("cancel") }, "Cancel") : null,
        j.actions.includes("retry") && !h.READ_ONLY ? h.el("button", { id: "job-retry", class: "primary", onclick: () => act("retry") }, "Retry") : null);
      out.replaceChildren(...[tools, h.el("dl", { class: "record" },
        row("id", j.id, "found-id"), row("status", stateBadge(h, j.state, "job-state")),
        row("queue", j.queue ? h.link("/queue?" + h.qs({ name: j.queue }), j.queue) : null, "job-queue"),
        row("task", j.task, "job-task"),
        row("attempts", j.attempts === null ? null : `${j.attempts}${j.max_attempts ? " of " + j.max_attempts : ""}`, "job-attempts"),
        row("group", j.group && j.queue ? h.link("/groups?" + h.qs({ queue: j.queue }), j.group) : j.group, "job-group"),
        row("campaign", j.campaign ? h.link("/campaign?" + h.qs({ id: j.campaign }), j.campaign) : null, "job-campaign"),
        row("progress", progressCell(h, j.progress), "job-progress"),
        row("message", j.message, "job-message"),
        row("enqueued", iso(j.enqueued_at), "job-enqueued"), row("due", iso(j.due_at)),
        row("started", iso(j.started_at), "job-started"), row("finished", iso(j.finished_at), "job-finished"),
        row("died", iso(j.died_at), "job-died"), row("cancelled", iso(j.cancelled_at), "job-cancelled"),
        row("result stored", j.result_stored ? `yes (${h.fmtInt(j.result_bytes)} bytes)` : "no", "job-result")),
      j.error ? h.el("h2", {}, "Last error") : null,
      j.error ? h.el("pre", { id: "job-last-error" }, `${j.error.type ? j.error.type + ": " : ""}${j.error.message}\n(${j.error.reason})`) : null,
      j.state === "unknown" ? h.el("p", { class: "muted", id: "job-unknown" }, "No such job here: never enqueued, or settled long enough ago that Redis keeps nothing of it.") : null]
        .filter(Boolean));  // replaceChildren would write a null as the text "null"
    }
    if (id) tick = h.live(draw);
  };

  // --- the audit log -----------------------------------------------------------------

  pages.audit = function (h) {
    const body = h.el("div");
    const stack = [null];  // "before" of each page shown; null: the newest
    h.main.replaceChildren(h.el("h1", {}, "Audit log"), body);
    const tick = h.live(async () => {
      const before = stack[stack.length - 1];
      const d = await h.api("audit", before ? { limit: 100, before } : { limit: 100 });
      const rows = d.entries.map((e) => h.el("tr", { "data-entry": e.id },
        h.el("td", { "data-col": "when" }, h.when(e.ts_ms / 1000)), h.el("td", { "data-col": "who" }, e.who),
        h.el("td", { "data-col": "action" }, e.action), h.el("td", { class: "wrap", "data-col": "target" }, e.target),
        h.el("td", { class: "wrap", "data-col": "detail" }, e.detail || "-"),
        h.el("td", { class: "wrap", "data-col": "result" }, e.result === "ok" ? h.el("span", { class: "badge running" }, "ok")
          : h.el("span", { class: "error" }, e.result))));
      body.replaceChildren(h.table(["When (UTC)", "Who", "Action", "Target", "Detail", "Result"],
        rows.length ? rows : [h.el("tr", {}, h.el("td", { colspan: 6, class: "muted" }, "nothing recorded"))]),
      h.el("div", { class: "pager" },
        h.el("button", { id: "prev", disabled: stack.length < 2, onclick: () => { stack.pop(); tick(); } }, "‹ Newer"),
        h.el("button", { id: "next", disabled: !d.next_before, onclick: () => { stack.push(d.next_before); tick(); } }, "Older ›")));
    });
  };

  window.batchqPages = pages;
})();
