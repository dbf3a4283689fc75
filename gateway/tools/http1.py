"""HTTP/1.1 for an HTTP tool's one exchange: the request encoded and checked here, the answer
parsed by llhttp (httptools), in strict mode.

h11, pure Python, took about a tenth of the gateway's CPU per HTTP tool call (an exchange of
a small request and answer cost ~60 µs in h11 against ~3 µs here). What h11 refused stays
refused: a header name or value that is not a token or field value, a request without its
``Host`` or with a ``Content-Length`` that is not its body's, an answer that llhttp's strict
parser refuses (a malformed head, ``Content-Length`` beside ``Transfer-Encoding``, two
different lengths, bad chunk framing), a head past ``MAX_HEAD_BYTES``, a ``101`` nobody asked
for, a transfer coding other than ``chunked`` or named twice, body framing (chunk sizes,
extensions, trailers) past ``MAX_HEAD_BYTES`` without progress, and an HTTP/1.0 answer's
connection is not kept. Trailers are dropped. llhttp goes on parsing bytes that follow an
answer; ``ResponseReader`` keeps none of them and remembers that they came (``spilled``), so
the connection is not reused. Accepted where h11 refused: a ``100`` sent before the answer
with ``Connection: close`` is refused instead (llhttp takes the connection as ending).
"""

from __future__ import annotations

import re

import httpcore
import httptools

MAX_HEAD_BYTES = 100 * 1024
"""Most bytes an answer's head (interim answers included) may take (httpcore's figure for h11)."""
FRAMING_PER_BODY_BYTE = 16
"""Bytes of chunk framing (sizes, extensions, trailers) a body may come with per byte of it,
past ``MAX_HEAD_BYTES``: one-byte chunks take 5, an extension more."""

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_NOT_IN_A_FIELD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""Control characters but HTAB: what may not appear in a field value (RFC 9110 5.5), CR and LF above all."""
_WHITESPACE = (b" ", b"\t")
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_NO_BODY_STATUSES = frozenset({204, 304})
_HTTP1_VERSIONS = frozenset({"1.0", "1.1"})
_INTERIM_WITHOUT_BODY = frozenset({100, 102, 103})
"""The 1xx answers llhttp reads without a body (101 ends HTTP/1.1 on the connection)."""


def encode_request(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes | None) -> bytes:
    """The request's bytes. Raises ``httpcore.LocalProtocolError`` for anything h11 would refuse
    to send: the values come from the tools file and the call, and a CR or LF in one would
    split the request."""
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        raise httpcore.LocalProtocolError("the request line is not valid HTTP/1.1")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    hosts = 0
    lengths: list[bytes] = []
    for name, value in headers:
        if (not _TOKEN.fullmatch(name) or _NOT_IN_A_FIELD_VALUE.search(value)
                or value[:1] in _WHITESPACE or value[-1:] in _WHITESPACE):
            raise httpcore.LocalProtocolError("a request header is not valid HTTP/1.1")
        lowered = name.lower()
        if lowered == b"host":
            hosts += 1
        elif lowered == b"content-length":
            lengths.append(value)
        elif lowered == b"transfer-encoding":
            raise httpcore.LocalProtocolError("a tool's request is sent with its Content-Length")
        parts += (name, b": ", value, b"\r\n")
    size = len(body) if body else 0
    if hosts != 1 or len(lengths) > 1 or (lengths and lengths[0] != str(size).encode()) or (size and not lengths):
        raise httpcore.LocalProtocolError("a request needs one Host and the Content-Length of its body")
    parts.append(b"\r\n")
    if body:
        parts.append(body)
    return b"".join(parts)


class ResponseReader:
    """The final answer to one request, fed its connection's bytes: interim (1xx) answers
    skipped, the head, the body as it comes, and whether it is complete.

    Raises ``httpcore.RemoteProtocolError`` for an answer llhttp refuses, a head past
    ``MAX_HEAD_BYTES``, a ``101`` or a transfer coding other than ``chunked``. What frames the
    body (chunk sizes and extensions, trailers) may take ``MAX_HEAD_BYTES`` between two pieces
    of progress, and ``FRAMING_PER_BODY_BYTE`` per body byte in all (so that one-byte chunks
    with long extensions cannot keep a call reading); trailers are parsed and dropped, never
    taken for headers. Bytes after the answer are not parsed into it: ``spilled`` says they
    came (llhttp skips a bare CRLF after an answer in the same read: read and dropped)."""

    __slots__ = ("_parser", "_head_bytes", "_framing_bytes", "_framing_total", "_progress", "headers", "status",
                 "body", "complete", "spilled", "fed", "_keep_alive")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._head_bytes = 0
        self._framing_bytes = 0
        """Bytes since the last piece of progress (a chunk begun or ended, body) that were not body."""
        self._framing_total = 0
        self._progress = False
        self.headers: list[tuple[bytes, bytes]] = []
        """Names in lower case; values without the whitespace around them."""
        self.status: int | None = None
        """Set when the final answer's head is complete."""
        self.body = bytearray()
        """One buffer, not a list of pieces: a body of one-byte chunks would cost ~90 times its size."""
        self.complete = False
        self.spilled = False
        self.fed = False
        self._keep_alive = False

    def feed(self, data: bytes) -> None:
        self.fed = True
        if self.complete:
            self.spilled = True
            return
        in_head = self.status is None
        if in_head:
            self._head_bytes += len(data)
        body_before = len(self.body)
        self._progress = False
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserUpgrade, httptools.HttpParserError) as exc:
            if not self.complete:
                message = ("the service switched protocols unasked" if isinstance(exc, httptools.HttpParserUpgrade)
                           else "the service's answer is not valid HTTP/1.1")
                raise httpcore.RemoteProtocolError(message) from None
            self.spilled = True  # anything after a whole answer: the answer stands, the connection goes
        if self.status is None and self._head_bytes > MAX_HEAD_BYTES:
            raise httpcore.RemoteProtocolError("the service's answer has too long a head")
        if not in_head and not self.complete:
            # One read (at most 64 KiB) may end a piece and start another: what it holds
            # beyond body counts only when nothing moved on in it.
            framing = len(data) - (len(self.body) - body_before)
            self._framing_bytes = 0 if self._progress else self._framing_bytes + framing
            self._framing_total += framing
            if (self._framing_bytes > MAX_HEAD_BYTES
                    or self._framing_total > MAX_HEAD_BYTES + FRAMING_PER_BODY_BYTE * len(self.body)):
                raise httpcore.RemoteProtocolError("the service's answer frames its body with too many bytes")

    def end_of_stream(self) -> None:
        """The connection ended: complete an answer whose body runs to the end of the
        connection; raise for any other that is not complete."""
        if self.complete:
            return
        if not self.fed:
            raise httpcore.RemoteProtocolError("Server disconnected without sending a response.")
        if self.status is not None and self._runs_to_close():
            self.complete = True
            self.spilled = True  # nothing more can come on it
            return
        raise httpcore.RemoteProtocolError("the service closed the connection mid-answer")

    def keep_alive(self) -> bool:
        """The answer is complete, nothing followed it, and both sides may go on."""
        return self.complete and not self.spilled and self._keep_alive

    def _runs_to_close(self) -> bool:
        if self.status in _NO_BODY_STATUSES:
            return False
        return not any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers)

    # httptools' callbacks

    def on_message_begin(self) -> None:
        if self.complete:
            self.spilled = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.status is None:  # a trailer (after the head) is dropped
            self.headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        if self._parser.get_http_version() not in _HTTP1_VERSIONS:
            raise _Refused  # llhttp reads any digit.digit; an HTTP/1.1 exchange is answered in 1.x
        status = self._parser.get_status_code()
        if status < 200:
            if status not in _INTERIM_WITHOUT_BODY:
                # llhttp would read a body for another 1xx (its framing headers, else to the
                # connection's end): refused rather than let the answer hide in it.
                raise _Refused
            return  # interim: its headers are dropped when it completes
        codings = [value for name, value in self.headers if name == b"transfer-encoding"]
        if codings and (len(codings) > 1 or codings[0].lower() != b"chunked"):
            # llhttp would read such a body to the connection's end; h11 refused it, and so do we.
            raise _Refused
        # Asked now: llhttp forgets the answer's connection headers once it is complete. An
        # HTTP/1.0 answer's connection is not kept, whatever it says (as h11 does).
        self._keep_alive = self._parser.should_keep_alive() and self._parser.get_http_version() == "1.1"
        self.status = status

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body += body
            self._progress = True

    def on_chunk_header(self) -> None:
        self._progress = True

    def on_chunk_complete(self) -> None:
        self._progress = True

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if self.status is None:
            self.headers = []
            return
        self.complete = True


class _Refused(Exception):
    """Raised in a callback: llhttp stops there, and ``feed`` refuses the answer."""
