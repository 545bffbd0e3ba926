"""batchq.store.codec: entry bytes, ids, encode errors, dead records (no Redis)."""

from __future__ import annotations

import os
import re

import msgpack
import pytest

from batchq.store import codec, ids
from batchq.store.codec import DecodeError, Job

pytestmark = pytest.mark.unit

ENQ_MS = 1_700_000_000_123


def make(jid: str, task: str = "send", args: list[object] | None = None,
         kwargs: dict[str, object] | None = None, prio: int = 0, max_attempts: int = 3,
         ms: int = ENQ_MS) -> bytes:
    return (codec.header(prio, max_attempts) + jid.encode() + b":"
            + codec.encode_body(task, args or [], kwargs or {}, ms))


# --- header and round trip -------------------------------------------------------------


def test_header_is_priority_zero_attempts_and_max_attempts():
    assert codec.header(0, 1) == b"0:0:1:"
    assert codec.header(9, 25) == b"9:0:25:"


def test_entry_round_trip():
    args = [1, "two", 3.5, None, True, b"\x00\xff", [1, [2]], {"nested": ["x"]}]
    kwargs = {"to": "a@example.com", "count": 2**63 - 1, "empty": {}, "ünï": "cödé"}
    raw = make("abc123", "mail.send", args, kwargs, prio=7, max_attempts=4)
    job = codec.decode_entry(raw, "emails")
    assert isinstance(job, Job)
    assert job.id == "abc123"
    assert job.task == "mail.send"
    assert job.args == args
    assert job.kwargs == kwargs
    assert job.priority == 7
    assert job.attempt == 0
    assert job.max_attempts == 4
    assert job.queue == "emails"
    assert job.enqueued_ms == ENQ_MS
    assert job.raw == raw
    assert job.lease == b"abc123:0"


def test_ready_time_is_the_enqueue_time_for_a_ready_job():
    job = codec.decode_entry(make("r"), "q")
    assert job.ready_ms == job.enqueued_ms == ENQ_MS


def test_delayed_job_carries_its_due_time():
    raw = (codec.header(0, 3) + b"dl:"
           + codec.encode_body("t", [1], {"a": 2}, ENQ_MS, due_ms=ENQ_MS + 60_000))
    assert msgpack.unpackb(raw.split(b":", 4)[4]) == ["t", [1], {"a": 2}, ENQ_MS,
                                                       ENQ_MS + 60_000]
    job = codec.decode_entry(raw, "q")
    assert (job.task, job.args, job.kwargs) == ("t", [1], {"a": 2})
    assert job.enqueued_ms == ENQ_MS
    assert job.ready_ms == ENQ_MS + 60_000


def test_tuple_args_come_back_as_lists():
    job = codec.decode_entry(make("t1", args=[(1, 2)]), "q")
    assert job.args == [[1, 2]]


def test_dicts_with_int_keys_round_trip():
    # msgpack encodes them; a job that enqueues fine must decode for the worker too
    raw = make("ik", args=[{1: "a", 2: "b"}], kwargs={"by_id": {10: 1.5}})
    job = codec.decode_entry(raw, "q")
    assert job.args == [{1: "a", 2: "b"}]
    assert job.kwargs == {"by_id": {10: 1.5}}


def test_parse_header_matches_the_entry():
    raw = make("pid", prio=3, max_attempts=9)
    p, a, m, jid, body = codec.parse_header(raw)
    assert (p, a, m, jid) == (3, 0, 9, "pid")
    assert msgpack.unpackb(body) == ["send", [], {}, ENQ_MS]


def test_attempt_in_a_popped_entry_is_read():
    popped = b"0:3:5:x:" + make("x", max_attempts=5).split(b":", 4)[4]
    job = codec.decode_entry(popped, "q")
    assert (job.attempt, job.max_attempts, job.lease) == (3, 5, b"x:3")


def test_job_lease_defaults_to_id_and_attempt():
    assert Job("j1", "t", [], {}, attempt=2).lease == b"j1:2"
    assert Job("j1", "t", [], {}, attempt=2, lease=b"other:7").lease == b"other:7"


# --- ids -------------------------------------------------------------------------------


def test_new_ids_are_unique_and_url_safe():
    ids = [codec.new_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    pattern = re.compile(r"[A-Za-z0-9_-]+")
    for i in ids:
        assert ":" not in i
        assert pattern.fullmatch(i), i
    # a 4-character queue reference (codec.queue_ref), 13 random, a hex counter
    assert max(map(len, ids)) <= 24
    assert codec.new_id(codec.queue_ref("emails")).startswith(codec.queue_ref("emails"))
    assert codec.ref_of(codec.new_id(codec.queue_ref("q"))) == codec.queue_ref("q")


def test_ids_differ_in_a_forked_child():
    before = [codec.new_id() for _ in range(1000)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: send its ids back and leave without running pytest teardown
        try:
            os.close(r)
            data = "\n".join(codec.new_id() for _ in range(1000)).encode()
            with os.fdopen(w, "wb") as out:
                out.write(data)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as inp:
        child = inp.read().decode().split("\n")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = [codec.new_id() for _ in range(1000)]

    assert len(child) == 1000
    parent = set(before) | set(after)
    assert not parent & set(child)
    assert len(set(child)) == 1000
    # a fresh random prefix, not just a different counter
    assert child[0][:12] != before[0][:12]
    assert after[0][:12] == before[0][:12]


# --- encode errors ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [set(), object(), {1, 2}, 2**64])
def test_unencodable_positional_argument_is_named(bad):
    with pytest.raises(TypeError) as info:
        codec.encode_body("reports.build", [1, "ok", bad], {}, ENQ_MS)
    msg = str(info.value)
    assert "reports.build" in msg
    assert "positional argument 2" in msg
    assert type(bad).__name__ in msg


def test_unencodable_value_nested_in_an_argument_names_its_position():
    with pytest.raises(TypeError, match="positional argument 0"):
        codec.encode_body("t", [[1, {"x": set()}]], {}, ENQ_MS)


@pytest.mark.parametrize("bad", [set(), object()])
def test_unencodable_keyword_argument_is_named(bad):
    with pytest.raises(TypeError) as info:
        codec.encode_body("t", [1], {"fine": 1, "payload": bad}, ENQ_MS)
    msg = str(info.value)
    assert "keyword argument 'payload'" in msg
    assert type(bad).__name__ in msg


def test_encode_error_is_not_chained_to_msgpack_internals():
    with pytest.raises(TypeError) as info:
        codec.encode_body("t", [object()], {}, ENQ_MS)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# --- decode errors ---------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b"",
    b"garbage",
    b"0:0:3:id",  # no body
    b"x:0:3:id:" + msgpack.packb(["t", [], {}, 1]),  # priority not a number
    b"0:y:3:id:" + msgpack.packb(["t", [], {}, 1]),  # attempt not a number
    b"0:0:3:\xff\xfe:" + msgpack.packb(["t", [], {}, 1]),  # id not ascii
    b"0:0:3:id:\xc1",  # 0xc1 is never valid msgpack
    b"0:0:3:id:" + msgpack.packb(["t", [], {}, 1]) + b"\x01",  # trailing bytes
    b"0:0:3:id:" + msgpack.packb("not a list"),
    b"0:0:3:id:" + msgpack.packb(["t", [], {}]),  # three fields
    b"0:0:3:id:" + msgpack.packb([1, [], {}, 1]),  # task not a string
    b"0:0:3:id:" + msgpack.packb(["t", "args", {}, 1]),  # args not a list
    b"0:0:3:id:" + msgpack.packb(["t", [], [], 1]),  # kwargs not a dict
])
def test_bad_bytes_raise_decode_error(raw):
    with pytest.raises(DecodeError):
        codec.decode_entry(raw, "q")


def test_decode_error_is_a_value_error():
    assert issubclass(DecodeError, ValueError)


@pytest.mark.parametrize("raw", [b"garbage", b"10:0:3:id:x", b"0:0:3:\xff:x", b"0:a:3:id:x"])
def test_parse_header_rejects_bad_headers(raw):
    with pytest.raises(DecodeError):
        codec.parse_header(raw)


# --- reset_attempt / lease_of ------------------------------------------------------------


def test_reset_attempt_sets_the_attempt_back_to_zero():
    fresh = make("r1", args=["a"], prio=6, max_attempts=4)
    body = fresh.split(b":", 4)[4]
    used = b"6:4:4:r1:" + body
    assert codec.reset_attempt(used) == fresh
    assert codec.reset_attempt(fresh) == fresh


@pytest.mark.parametrize("raw", [b"garbage", b"", b"0:0:3:\xff:x"])
def test_reset_attempt_of_malformed_bytes_is_none(raw):
    assert codec.reset_attempt(raw) is None


def test_lease_of_reads_id_and_attempt_even_with_a_bad_body():
    assert codec.lease_of(b"3:2:5:abc:\xc1\xc1") == ("abc", b"abc:2")
    raw = make("good")
    assert codec.lease_of(raw) == ("good", b"good:0")


def test_lease_of_malformed_header_raises():
    with pytest.raises(DecodeError):
        codec.lease_of(b"garbage")


# --- dead records ----------------------------------------------------------------------


def test_dead_record_round_trip():
    raw = make("dead1", args=[1])
    data = codec.encode_dead_record("dead1", "error", raw, error_type="ValueError",
                                    error_message="bad value", traceback="Traceback...\n")
    assert codec.decode_dead_record(data) == {
        "id": "dead1",
        "reason": "error",
        "error_type": "ValueError",
        "error_message": "bad value",
        "traceback": "Traceback...\n",
        "raw": raw,
    }


def test_dead_record_keeps_non_utf8_raw_bytes():
    raw = b"\xff\x00garbage\xc1"
    rec = codec.decode_dead_record(codec.encode_dead_record("raw-1", "decode_error", raw))
    assert rec["raw"] == raw
    assert isinstance(rec["raw"], bytes)
    assert rec["error_type"] == rec["error_message"] == rec["traceback"] == ""


def test_dead_record_with_missing_fields_is_tolerated():
    rec = codec.decode_dead_record(msgpack.packb({"id": "x", "reason": "lease_expired"}))
    assert rec == {"id": "x", "reason": "lease_expired"}


@pytest.mark.parametrize("data", [b"\xc1", msgpack.packb([1, 2]), msgpack.packb("s")])
def test_corrupt_dead_record_decodes_as_corrupt_record(data):
    rec = codec.decode_dead_record(data)
    assert rec["reason"] == "corrupt_record"
    assert rec["raw"] == data


def test_ids_are_letters_and_digits_so_a_command_line_never_reads_one_as_a_flag() -> None:
    import string

    allowed = set(string.ascii_letters + string.digits)
    for _ in range(200):
        ids._reseed()
        jid = codec.new_id()
        assert set(jid) <= allowed, jid
    ids._reseed()
