// batchq web console: the circuit breakers page (state in Redis, trips, re-routed jobs;
// open and close). Loaded after ops.js, before app.js; every value from Redis is put on
// the page as text, never parsed as HTML.
"use strict";

(function () {
  const pages = window.batchqPages || (window.batchqPages = {});
  const BADGE = { closed: "running", open: "bad", half_open: "paused" };

  pages.breakers = function (h) {
    const body = h.el("div", { id: "breakers" });
    h.main.replaceChildren(h.el("h1", {}, "Circuit breakers"), body);
    async function act(verb, name) {
      if (!(await h.confirmDialog(verb === "open"
        ? `Open breaker ${name}? The jobs of its tasks are held or re-routed to their fallback until it closes.`
        : `Close breaker ${name}? Its tasks' jobs reach the provider again.`))) return;
      try {
        await h.post("breaker/" + verb, { name });
        h.banner(`Breaker ${name} ${verb === "open" ? "opened" : "closed"}`, "info");
      } catch (e) { h.banner(e.message); }
      tick();
    }
    const tick = h.live(async () => {
      const d = await h.api("breakers");
      const rows = d.breakers.map((b) => h.el("tr", { "data-breaker": b.name },
        h.el("td", { "data-col": "name" }, b.name),
        h.el("td", { "data-col": "state" }, h.el("span", { class: "badge " + (BADGE[b.state] || ""), id: "breaker-state-" + b.name }, b.state)),
        h.el("td", { "data-col": "left" }, b.open_left_s ? h.duration(b.open_left_s) : "-"),
        h.el("td", { class: "num", "data-col": "failures" }, `${b.failures} of ${b.threshold} in ${b.within_s}s`),
        h.el("td", { class: "num", "data-col": "probes" }, b.state === "half_open" ? `${b.probes} (${b.succeeded} of ${b.half_open_jobs} ok)` : "-"),
        h.el("td", { class: "num", "data-col": "trips", id: "breaker-trips-" + b.name }, h.fmtInt(b.trips)),
        h.el("td", { class: "wrap", "data-col": "tasks" }, b.tasks.length ? b.tasks.map((t) =>
          `${t.task}${t.fallback ? " → " + t.fallback + ": " + h.fmtInt(t.rerouted) + " re-routed" : ""}`).join("; ") : "-"),
        h.el("td", {}, h.READ_ONLY ? null : (b.state === "closed"
          ? h.el("button", { class: "danger", id: "breaker-open-" + b.name, onclick: () => act("open", b.name) }, "Open")
          : h.el("button", { class: "primary", id: "breaker-close-" + b.name, onclick: () => act("close", b.name) }, "Close")))));
      body.replaceChildren(h.table(["Name", "State", "Open for", "Failures", "Probes", "Trips", "Tasks", ""],
        rows.length ? rows : [h.el("tr", {}, h.el("td", { colspan: 8, class: "muted" }, "the app declares no circuit breakers"))], [3, 4, 5]));
    });
  };
})();
