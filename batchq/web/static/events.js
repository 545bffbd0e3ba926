// batchq web console: the live feed of job events (batchq.ops.events). Loaded after ops.js,
// before app.js; polls /api/events and appends what is new, every value put on the page
// as text, never parsed as HTML.
"use strict";

(function () {
  const pages = window.batchqPages || (window.batchqPages = {});
  const KEEP = 500;  // rows kept on the page

  pages.events = function (h) {
    const p = new URLSearchParams(location.search);
    const queues = p.getAll("queue");
    const state = h.el("p", { id: "events-state", class: "muted" }, "");
    const body = h.el("tbody", { id: "events-rows" });
    const head = h.el("thead", {}, h.el("tr", {}, ...["Time", "Queue", "Event", "Job", "Task",
      "Attempt", "Group", "Campaign", "Error"].map((t) => h.el("th", {}, t))));
    h.main.replaceChildren(h.el("h1", {}, "Job events"), state,
      h.el("table", { id: "events" }, head, body));
    let since = null;
    h.live(async () => {
      const ps = new URLSearchParams();
      for (const q of queues) ps.append("queue", q);
      if (since) ps.set("since", JSON.stringify(since));
      const d = await h.api("events" + (ps.toString() ? "?" + ps.toString() : ""));
      since = d.next;
      const off = Object.entries(d.enabled).filter(([, on]) => !on).map(([q]) => q);
      state.textContent = off.length ? `events are off for ${off.join(", ")} (batchq events -q QUEUE --enable)` : "";
      for (const e of d.events) {
        const gap = e.kind === "gap";
        body.prepend(h.el("tr", { class: gap ? "gap" : "", "data-kind": e.kind, "data-job": e.job_id },
          h.el("td", {}, gap ? "" : new Date(e.at_ms).toISOString().replace("T", " ").replace("Z", "")),
          h.el("td", {}, e.queue),
          h.el("td", { "data-col": "kind" }, gap ? `gap: ${e.missed < 0 ? "some" : e.missed} events trimmed before they were read` : e.kind),
          h.el("td", { "data-col": "job" }, e.job_id || ""),
          h.el("td", {}, e.task || ""),
          h.el("td", { class: "num" }, e.attempt === null ? "" : String(e.attempt)),
          h.el("td", {}, e.group === null ? (e.kind.startsWith("hold") || e.kind === "held" ? "(queue)" : "") : e.group),
          h.el("td", {}, e.campaign || ""),
          h.el("td", { class: "wrap" }, e.error || "")));
      }
      while (body.children.length > KEEP) body.lastElementChild.remove();
    });
  };
})();
