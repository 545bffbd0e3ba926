"""Delivery receipts from the job events: one row per message sent, in your own database.

The handler stores the provider's message id as its progress message
(``batchq.current_job().progress(100, message=provider_id)``); this process follows the
queue's events and, for each ``succeeded`` (or ``dead``) job, writes a delivery record
into sqlite together with the id of the event, in one transaction. After a restart it
resumes from that id: each message is recorded exactly once.

    python receipts.py MODULE:APP QUEUE DB.sqlite [--stop-after N]
"""

from __future__ import annotations

import argparse
import logging
import sqlite3

from batchq.tasks.loading import load_app

log = logging.getLogger("receipts")

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    job_id TEXT PRIMARY KEY, provider_id TEXT, status TEXT, error TEXT, at_ms INTEGER);
CREATE TABLE IF NOT EXISTS cursor (queue TEXT PRIMARY KEY, last_id TEXT NOT NULL);
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("app")
    p.add_argument("queue")
    p.add_argument("db")
    p.add_argument("--stop-after", type=int, default=0, help="records written, 0: never")
    args = p.parse_args()
    app = load_app(args.app)
    db = sqlite3.connect(args.db)
    db.executescript(SCHEMA)
    row = db.execute("SELECT last_id FROM cursor WHERE queue = ?", (args.queue,)).fetchone()
    written = 0
    for ev in app.events([args.queue], since=row[0] if row else "0", follow=True):
        if ev.kind == "gap":
            # the stream was trimmed past our last id: these receipts need a backfill
            log.warning("%s events missed on %s", ev.missed, ev.queue)
            continue
        if ev.kind not in ("succeeded", "dead") or ev.task != "send_sms":
            continue
        provider_id = app.job_info(ev.job_id).message if ev.kind == "succeeded" else None
        with db:  # the record and the cursor in one transaction
            db.execute("INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?)",
                       (ev.job_id, provider_id, ev.kind, ev.error, ev.at_ms))
            db.execute("INSERT OR REPLACE INTO cursor VALUES (?, ?)", (args.queue, ev.id))
        written += 1
        if args.stop_after and written >= args.stop_after:
            break
    db.close()
    app.close()


if __name__ == "__main__":
    main()
