import json
import logging
import secrets
import socket
import time
from typing import Dict, List, Tuple

import pytest
import requests

from nervex.system.comm.auth import sign_request
from nervex.system.comm.client import Client
from nervex.system.comm.errors import ProtocolError
from nervex.system.comm.server import Server

TOKEN = secrets.token_bytes(32)
ROUTE_CAP = 1024
BIG_CAP = 8192  # the largest route cap: waitress itself refuses bodies over it


class Recorder:
    """Handlers that count their calls, so a test can assert a refused request had no effect."""

    def __init__(self) -> None:
        self.calls: List[object] = []
        self.busy_left = 0

    def echo(self, body: object) -> Dict[str, object]:
        self.calls.append(body)
        return {"echo": body}

    def created(self, body: object) -> Tuple[int, Dict[str, object]]:
        self.calls.append(body)
        return 201, {"created": True}

    def busy_then_ok(self, body: object) -> Dict[str, object]:
        self.calls.append(body)
        if self.busy_left > 0:
            self.busy_left -= 1
            raise ProtocolError(429, "too busy", retry_after=0.2)
        return {"ok": True}

    def missing(self, body: object) -> Dict[str, object]:
        self.calls.append(body)
        raise ProtocolError(404, "unknown task id", field="task_id")

    def boom(self, body: object) -> Dict[str, object]:
        self.calls.append(body)
        raise RuntimeError("secret detail 42")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def server(recorder):
    srv = Server("test", TOKEN, max_body=ROUTE_CAP)
    srv.route("/echo", ["POST"], recorder.echo)
    srv.route("/big", ["POST"], recorder.echo, max_body=BIG_CAP)
    srv.route("/created", ["POST"], recorder.created)
    srv.route("/busy", ["POST"], recorder.busy_then_ok)
    srv.route("/missing", ["POST"], recorder.missing)
    srv.route("/boom", ["POST"], recorder.boom)
    srv.route("/status", ["GET"], lambda body: {"body": body})
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def post_signed(srv: Server, path: str, body: bytes, token: bytes = TOKEN, **sign_kwargs) -> requests.Response:
    headers = sign_request(token, "POST", path, body, **sign_kwargs)
    return requests.post(srv.url + path, data=body, headers=headers, timeout=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def raw_request(port: int, head_lines: List[str], body: bytes = b"") -> Tuple[int, Dict[str, str], bytes]:
    """Send bytes as given (e.g. a hand-made chunked body) and read the response until the server closes."""
    head = "\r\n".join(head_lines + ["Host: 127.0.0.1", "Connection: close", "", ""]).encode("latin-1")
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + body)
        while True:
            try:
                received = sock.recv(65536)
            except ConnectionResetError:  # a server refusing an unread body may reset after its response
                if not data:
                    raise
                break
            if not received:
                break
            data += received
    head_block, _, payload = data.partition(b"\r\n\r\n")
    lines = head_block.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, payload


def signed_head(path: str, body: bytes) -> List[str]:
    return [f"POST {path} HTTP/1.1"] + [
        f"{key}: {value}" for key, value in sign_request(TOKEN, "POST", path, body).items()
    ]


# --- authentication --------------------------------------------------------------------------------------------------


def test_signed_requests_reach_their_handlers(server, recorder):
    with Client(server.url, TOKEN, deadline_s=5) as client:
        assert client.post("/echo", {"task_id": "t1", "n": [1, 2]}) == {"echo": {"task_id": "t1", "n": [1, 2]}}
        assert client.post("/created", {"x": 1}) == {"created": True}
        assert client.get("/status") == {"body": None}
    assert recorder.calls == [{"task_id": "t1", "n": [1, 2]}, {"x": 1}]


def test_handler_status_is_sent(server):
    response = post_signed(server, "/created", b"{}")
    assert response.status_code == 201 and response.json() == {"created": True}


def test_unsigned_request_401_and_no_side_effect(server, recorder):
    response = requests.post(server.url + "/echo", data=b"{}", timeout=5)
    assert response.status_code == 401
    assert response.json() == {"error": response.json()["error"], "field": "header.X-Nervex-Timestamp"}
    assert "missing header" in response.json()["error"]
    assert recorder.calls == []


def test_wrong_token_401_and_no_side_effect(server, recorder):
    response = post_signed(server, "/echo", b"{}", token=secrets.token_bytes(32))
    assert response.status_code == 401 and "bad signature" in response.json()["error"]
    assert recorder.calls == []


def test_query_string_400_without_echo_and_no_side_effect(server, recorder):
    headers = sign_request(TOKEN, "POST", "/echo", b"{}")
    response = requests.post(server.url + "/echo?token=s3cret", data=b"{}", headers=headers, timeout=5)
    assert response.status_code == 400 and response.json()["field"] == "query_string"
    assert "s3cret" not in response.text
    assert recorder.calls == []


def test_expired_timestamp_401_and_no_side_effect(server, recorder):
    response = post_signed(server, "/echo", b"{}", timestamp=time.time() - 3600)
    assert response.status_code == 401 and "expired or clock skew" in response.json()["error"]
    assert recorder.calls == []


def test_replayed_request_401_and_handler_called_once(server, recorder):
    headers = sign_request(TOKEN, "POST", "/echo", b'{"a":1}')
    first = requests.post(server.url + "/echo", data=b'{"a":1}', headers=headers, timeout=5)
    replay = requests.post(server.url + "/echo", data=b'{"a":1}', headers=headers, timeout=5)
    assert first.status_code == 200 and replay.status_code == 401
    assert "replayed nonce" in replay.json()["error"]
    assert recorder.calls == [{"a": 1}]


def test_healthz_open_and_reveals_nothing(server):
    response = requests.get(server.url + "/healthz", timeout=5)
    assert response.status_code == 200 and response.content == b'{"ok":true}'
    assert set(response.headers) == {"Content-Length", "Content-Type", "Date"}  # no Server header


def test_unknown_path_and_unsigned_options_are_json_errors(server, recorder):
    assert requests.post(server.url + "/nope", data=b"{}", timeout=5).json() == {"error": "404 Not Found"}
    options = requests.options(server.url + "/echo", timeout=5)
    assert options.status_code == 405 and "POST" in options.headers["Allow"]
    assert recorder.calls == []


# --- bodies ----------------------------------------------------------------------------------------------------------


def test_body_over_route_cap_413(server, recorder):
    body = json.dumps({"pad": "x" * 2000}).encode()
    response = post_signed(server, "/echo", body)
    assert response.status_code == 413 and f"{ROUTE_CAP}-byte cap of /echo" in response.json()["error"]
    assert post_signed(server, "/big", body).status_code == 200  # the same body fits another route's cap
    assert recorder.calls == [{"pad": "x" * 2000}]


@pytest.mark.parametrize("path, cap", [("/echo", ROUTE_CAP), ("/big", BIG_CAP)])
def test_body_exactly_at_cap_accepted_one_more_byte_refused(server, recorder, path, cap):
    def body_of(size: int) -> bytes:
        return b'{"p":"' + b"x" * (size - 8) + b'"}'

    assert len(body_of(cap)) == cap
    assert post_signed(server, path, body_of(cap)).status_code == 200
    assert post_signed(server, path, body_of(cap + 1)).status_code == 413
    assert recorder.calls == [{"p": "x" * (cap - 8)}]


def test_content_length_over_server_cap_413_without_reading_body(server):
    start = time.monotonic()
    status, _, _ = raw_request(server.port, ["POST /echo HTTP/1.1", "Content-Length: 1000000000"])  # body never sent
    assert status == 413 and time.monotonic() - start < 3


def test_small_chunked_body_accepted_whole(server, recorder):
    body = json.dumps({"pad": "y" * 600}).encode()
    head = signed_head("/echo", body) + ["Transfer-Encoding: chunked"]
    status, _, payload = raw_request(server.port, head, chunk(body[:100]) + chunk(body[100:]) + b"0\r\n\r\n")
    assert status == 200 and json.loads(payload) == {"echo": {"pad": "y" * 600}}
    assert recorder.calls == [{"pad": "y" * 600}]


def test_chunked_body_over_route_cap_413_not_truncated(server, recorder):
    body = b"z" * (ROUTE_CAP + 500)  # under the server-wide cap: refused by the route's own check
    head = signed_head("/echo", body) + ["Transfer-Encoding: chunked"]
    status, _, payload = raw_request(server.port, head, chunk(body[:700]) + chunk(body[700:]) + b"0\r\n\r\n")
    assert status == 413 and "cap of /echo" in json.loads(payload)["error"]
    assert recorder.calls == []


def test_chunked_body_over_server_cap_413(server, recorder):
    body = b"z" * (BIG_CAP + 500)
    head = signed_head("/big", body) + ["Transfer-Encoding: chunked"]
    parts = b"".join(chunk(body[i : i + 1000]) for i in range(0, len(body), 1000)) + b"0\r\n\r\n"
    status, _, _ = raw_request(server.port, head, parts)
    assert status == 413
    assert recorder.calls == []


@pytest.mark.parametrize("body", [b"{not json", b'{"a": NaN}', b"\xff\xfe", b"[" * 4000 + b"]" * 4000])
def test_malformed_json_400_and_no_side_effect(server, recorder, body):
    response = post_signed(server, "/big", body)
    assert response.status_code == 400 and response.json()["error"].startswith("malformed JSON body")
    assert recorder.calls == []


# --- errors ----------------------------------------------------------------------------------------------------------


def test_handler_protocol_error_reaches_client_with_field(server, recorder):
    with Client(server.url, TOKEN, deadline_s=5) as client, pytest.raises(ProtocolError) as info:
        client.post("/missing", {"task_id": "t9"})
    assert (info.value.status, info.value.message, info.value.field) == (404, "unknown task id", "task_id")
    assert len(recorder.calls) == 1  # a 404 is not retried


def test_500_hides_exception_text_and_logs_it(server, recorder, caplog):
    with caplog.at_level(logging.ERROR, logger="nervex.system.comm.server"):
        response = post_signed(server, "/boom", b'{"k":1}')
    assert response.status_code == 500 and "secret detail" not in response.text
    assert any("secret detail 42" in (record.exc_text or "") for record in caplog.records)
    with Client(server.url, TOKEN, deadline_s=5) as client, pytest.raises(ProtocolError) as info:
        client.post("/boom", {})
    assert info.value.status == 500 and len(recorder.calls) == 2  # not retried


def test_429_with_retry_after_is_retried_then_succeeds(server, recorder):
    recorder.busy_left = 2
    response = post_signed(server, "/busy", b"{}")
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    assert response.json() == {"error": "too busy", "retry_after": 0.2}
    recorder.busy_left = 2
    start = time.monotonic()
    with Client(server.url, TOKEN, deadline_s=5) as client:
        assert client.post("/busy", {"n": 1}) == {"ok": True}
    assert len(recorder.calls) == 4  # 1 above + 2 refused + 1 accepted, each try signed afresh
    assert 0.4 <= time.monotonic() - start < 3


def test_client_gives_up_with_503_at_its_deadline():
    client = Client(f"http://127.0.0.1:{free_port()}", TOKEN, deadline_s=1.0, max_retries=1000, backoff_cap_s=0.2)
    start = time.monotonic()
    with client, pytest.raises(ProtocolError, match="unreachable after") as info:
        client.get("/status")
    elapsed = time.monotonic() - start
    assert info.value.status == 503 and 0.5 <= elapsed <= 1.5
    assert "ConnectionError" in info.value.message


def test_client_gives_up_after_max_retries():
    client = Client(f"http://127.0.0.1:{free_port()}", TOKEN, deadline_s=30.0, max_retries=2, backoff_base_s=0.01)
    with client, pytest.raises(ProtocolError, match="unreachable after 3 tries"):
        client.post("/echo", {})


def test_a_stop_ends_a_retrying_call_within_the_grace_and_a_busy_server_is_still_retried_during_it(server, recorder):
    """``should_stop``: a call retrying an unreachable server gives up ``STOP_GRACE_S`` after the stop is seen, not
    at its 30 s deadline, and still retries within that second; without a stop the same call keeps retrying."""
    from nervex.system.comm.client import STOP_GRACE_S

    stop_at = time.monotonic() + 0.5
    client = Client(
        f"http://127.0.0.1:{free_port()}",
        TOKEN,
        deadline_s=30.0,
        max_retries=1000,
        backoff_cap_s=0.2,
        should_stop=lambda: time.monotonic() >= stop_at,
    )
    start = time.monotonic()
    with client, pytest.raises(ProtocolError, match=r"unreachable after \d+ tries in .* s \(stopping\)") as info:
        client.post("/echo", {})
    elapsed = time.monotonic() - start
    assert info.value.status == 503 and 0.5 + STOP_GRACE_S - 0.3 <= elapsed <= 0.5 + STOP_GRACE_S + 1.0, elapsed
    # a stop seen before the first failure still leaves the grace: a busy server (429, retry after 0.2 s) answers
    recorder.busy_left = 2
    with Client(server.url, TOKEN, deadline_s=30.0, should_stop=lambda: True) as stopping:
        assert stopping.post("/busy", {"n": 2}) == {"ok": True}
    assert len(recorder.calls) == 3
    # and without a stop the unreachable call is still retrying well after the grace
    unstoppable = Client(f"http://127.0.0.1:{free_port()}", TOKEN, deadline_s=2.5, max_retries=1000, backoff_cap_s=0.2)
    start = time.monotonic()
    with unstoppable, pytest.raises(ProtocolError, match="unreachable after") as info:
        unstoppable.post("/echo", {})
    assert "(stopping)" not in info.value.message and time.monotonic() - start >= 2.0


def test_client_refuses_query_string_in_path(server):
    with Client(server.url, TOKEN, deadline_s=5) as client, pytest.raises(ValueError, match="query string"):
        client.get("/status?token=x")


# --- lifecycle -------------------------------------------------------------------------------------------------------


def test_default_bind_is_loopback(server):
    assert server.host == "127.0.0.1" and server.url == f"http://127.0.0.1:{server.port}"
    assert server._server.socket.getsockname()[0] == "127.0.0.1"


def test_port_in_use_names_host_and_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        srv = Server("second", TOKEN, port=port)
        try:
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: address already in use"):
                srv.start()
        finally:
            srv.stop()


def test_non_loopback_host_warns_and_loopback_does_not(caplog):
    with caplog.at_level(logging.WARNING, logger="nervex.system.comm.server"):
        Server("exposed", TOKEN, host="0.0.0.0")  # not started: nothing binds
        Server("local", TOKEN, host="localhost")
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "0.0.0.0" in warnings[0] and "no TLS" in warnings[0]


def test_stop_is_idempotent_and_quick_with_open_keepalive_connection(recorder):
    srv = Server("lifecycle", TOKEN)
    srv.route("/echo", ["POST"], recorder.echo)
    srv.stop()  # before start: nothing to do
    with srv:
        session = requests.Session()
        assert session.post(srv.url + "/echo", data=b"1", headers=sign_request(TOKEN, "POST", "/echo", b"1")).ok
        with pytest.raises(RuntimeError, match="before start"):
            srv.route("/late", ["POST"], recorder.echo)
        start = time.monotonic()
        srv.stop()
        assert time.monotonic() - start < 2
        srv.stop()
    with pytest.raises(requests.ConnectionError):
        session.post(f"http://127.0.0.1:{srv.port}/echo", data=b"1", timeout=2)
    session.close()
