"""The export's pieces: its caps, the slot of a stream that never started, its failure line."""

from __future__ import annotations

import csv
import gc
import io
import json

from gateway.api.audit import _guarded, _held_until_closed
from gateway.audit.export import ExportSlots, csv_text, failure_line


def test_a_tenant_and_the_process_each_have_a_cap_and_released_slots_come_back():
    slots = ExportSlots(per_tenant=2, per_process=3, stall_timeout_s=60)
    a1, a2 = slots.take("acme"), slots.take("acme")
    assert a1 is not None and a2 is not None
    assert slots.take("acme") is None  # the tenant's cap
    g1 = slots.take("globex")
    assert g1 is not None
    assert slots.take("globex") is None  # the process's cap, though globex has one left
    a1.release()
    a1.release()  # a second release gives nothing back twice
    assert slots.in_use == 2
    assert slots.take("globex") is not None
    assert slots.take("acme") is None


async def test_a_stream_never_started_gives_its_slot_back_when_collected():
    slots = ExportSlots(per_tenant=1, per_process=1, stall_timeout_s=60)
    slot = slots.take("acme")
    assert slot is not None

    async def chunks():
        yield b"row\n"

    stream = _held_until_closed(_guarded(chunks(), slot, "jsonl"), slot)
    assert slots.take("acme") is None
    del stream
    gc.collect()
    assert slots.in_use == 0
    assert slots.take("acme") is not None


async def test_a_stream_read_to_its_end_gives_its_slot_back():
    slots = ExportSlots(per_tenant=1, per_process=1, stall_timeout_s=60)
    slot = slots.take("acme")
    assert slot is not None

    async def chunks():
        yield b"row\n"

    assert [chunk async for chunk in _held_until_closed(_guarded(chunks(), slot, "jsonl"), slot)] == [b"row\n"]
    assert slots.in_use == 0


def test_the_failure_line_in_each_format():
    line = failure_line("jsonl", code="INTERNAL_ERROR", message="The export failed.", error_id="err_1")
    assert line.endswith(b"\n")
    assert json.loads(line) == {
        "error": {"code": "INTERNAL_ERROR", "message": "The export failed.", "error_id": "err_1"}
    }
    row = failure_line("csv", code="INTERNAL_ERROR", message="The export failed, sorry.", error_id="err_1")
    assert list(csv.reader(io.StringIO(row.decode()))) == [
        ["#error", "INTERNAL_ERROR", "err_1", "The export failed, sorry."]
    ]


def test_only_text_that_a_spreadsheet_would_run_is_prefixed():
    for value in ("=1+1", "+1", "-1", "@A1", "\t=1", "\r=1"):
        assert csv_text(value) == "'" + value
    for value in ("call_1", "1-2", "", " =1", "'=1"):
        assert csv_text(value) == value
