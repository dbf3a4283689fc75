"""CoalescingTransport (gateway.http_server): what is written in one turn of the event loop
reaches the socket's transport in one write at its end; nothing is lost, reordered or held
past a close, and a large body still meets the transport's flow control."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http_server import FLUSH_AT_BYTES, CoalescingTransport


class FakeTransport:
    """Records what reaches the socket's transport."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def write_eof(self) -> None:
        self.events.append("eof")

    def can_write_eof(self) -> bool:
        return True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol
        self.events.append("protocol")

    def get_protocol(self) -> Any:
        return self.protocol

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5)}.get(name, default)

    def pause_reading(self) -> None:
        self.events.append("pause")

    def resume_reading(self) -> None:
        self.events.append("resume")

    def is_reading(self) -> bool:
        return True


async def next_turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.fixture
async def pair() -> tuple[CoalescingTransport, FakeTransport]:
    fake = FakeTransport()
    return CoalescingTransport(fake, asyncio.get_running_loop()), fake  # type: ignore[arg-type]


async def test_writes_of_one_turn_leave_together_when_it_ends(pair):
    transport, fake = pair
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"ok")
    assert fake.writes == []
    assert transport.get_write_buffer_size() == 7 + 40
    await next_turn()
    assert fake.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    transport.write(b"next")
    await next_turn()
    assert fake.writes[1:] == [b"next"]


async def test_a_write_past_the_threshold_goes_at_once_so_flow_control_applies(pair):
    transport, fake = pair
    transport.write(b"head")
    transport.write(b"x" * FLUSH_AT_BYTES)
    assert fake.writes == [b"head" + b"x" * FLUSH_AT_BYTES]
    transport.write(b"tail")
    await next_turn()
    assert fake.writes[1:] == [b"tail"]


async def test_a_mutable_buffer_is_copied_when_written(pair):
    transport, fake = pair
    data = bytearray(b"abc")
    transport.write(data)
    transport.write(memoryview(b"def"))
    data[:] = b"zzz"
    await next_turn()
    assert fake.writes == [b"abcdef"]


async def test_empty_writes_send_nothing(pair):
    transport, fake = pair
    transport.write(b"")
    await next_turn()
    assert fake.writes == []


@pytest.mark.parametrize(("end", "event"), [("close", "close"), ("write_eof", "eof")])
async def test_closing_or_ending_writes_what_is_held_first(pair, end, event):
    transport, fake = pair
    transport.write(b"last words")
    getattr(transport, end)()
    assert fake.events == ["write", event]
    assert fake.writes == [b"last words"]
    await next_turn()
    assert fake.writes == [b"last words"]  # the pending turn-end flush finds nothing


async def test_handing_the_connection_to_another_protocol_writes_what_is_held_first(pair):
    transport, fake = pair
    transport.write(b"101 switching")
    transport.set_protocol("other")  # type: ignore[arg-type]
    assert fake.events == ["write", "protocol"]
    assert transport.get_protocol() == "other"


async def test_abort_drops_what_is_held_as_the_transport_drops_its_buffer(pair):
    transport, fake = pair
    transport.write(b"never sent")
    transport.abort()
    await next_turn()
    assert fake.writes == []
    assert fake.events == ["abort"]


async def test_what_is_held_when_the_transport_starts_closing_is_still_written_in_order(pair):
    # A client that ends its side after its request: the transport closes, yet still sends.
    transport, fake = pair
    transport.write(b"held")
    fake.closing = True
    transport.write(b"after")
    await next_turn()
    assert fake.writes == [b"held", b"after"]
    assert transport.is_closing()


async def test_a_write_the_transport_refuses_as_closed_is_dropped_and_any_other_refusal_is_raised(pair):
    transport, fake = pair

    def refuse(data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    fake.write = refuse  # type: ignore[method-assign]
    transport.write(b"held")
    fake.closing = True
    transport.flush()  # the connection is gone: dropped, nothing raised

    transport.write(b"after")  # written at once while closing (an earlier pipelined answer): dropped too

    fake.closing = False
    transport.write(b"held")
    with pytest.raises(RuntimeError):
        transport.flush()  # an open transport refusing a write is not hidden


async def test_everything_else_is_the_transports(pair):
    transport, fake = pair
    assert transport.get_extra_info("peername") == ("127.0.0.1", 5)
    assert transport.get_extra_info("socket", "none") == "none"
    transport.pause_reading()
    transport.resume_reading()
    assert transport.is_reading() and transport.can_write_eof()
    assert fake.events == ["pause", "resume"]
