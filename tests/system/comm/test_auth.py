import hashlib
import hmac
import os
import stat
import threading
import time

import pytest

from nervex.system.comm.auth import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TOKEN_ENV,
    RequestVerifier,
    load_or_create_token,
    sign_request,
)
from nervex.system.comm.errors import ProtocolError

TOKEN = bytes(range(32))
NOW = 1_700_000_000.0
BODY = b'{"task_id":"t1"}'


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_verifier(**kwargs):
    return RequestVerifier(TOKEN, clock=FakeClock(), not_before=NOW - 3600.0, **kwargs)


def nonce(i: int) -> str:
    return f"{i:032x}"


def signed(i: int = 1, timestamp: float = NOW, method: str = "POST", path: str = "/task/ask", body: bytes = BODY):
    return sign_request(TOKEN, method, path, body, timestamp=timestamp, nonce=nonce(i))


# --- signing ---------------------------------------------------------------------------------------------------------


def test_signature_matches_hand_computed_hmac():
    headers = sign_request(TOKEN, "post", "/task/ask", BODY, timestamp=1700000000.25, nonce="ab" * 16)
    canonical = "POST\n/task/ask\n1700000000.250\n" + "ab" * 16 + "\n" + hashlib.sha256(BODY).hexdigest()
    expected = hmac.new(TOKEN, canonical.encode(), hashlib.sha256).hexdigest()
    assert headers == {TIMESTAMP_HEADER: "1700000000.250", NONCE_HEADER: "ab" * 16, SIGNATURE_HEADER: expected}


def test_fresh_nonce_and_timestamp_per_call():
    first, second = sign_request(TOKEN, "GET", "/x", b""), sign_request(TOKEN, "GET", "/x", b"")
    assert first[NONCE_HEADER] != second[NONCE_HEADER]
    assert len(first[NONCE_HEADER]) == 32 and int(first[NONCE_HEADER], 16) >= 0
    assert abs(float(first[TIMESTAMP_HEADER]) - time.time()) < 5


@pytest.mark.parametrize("path", ["/task?token=abc", "/task/ask?"])
def test_sign_refuses_query_string_without_echoing_it(path):
    with pytest.raises(ValueError, match="query string") as info:
        sign_request(TOKEN, "POST", path, b"")
    assert "abc" not in str(info.value)


@pytest.mark.parametrize("path", ["task", "/a b", "/a%2Fb"])
def test_sign_refuses_paths_that_decoding_would_change(path):
    with pytest.raises(ValueError, match="must start with '/'"):
        sign_request(TOKEN, "POST", path, b"")


def test_short_token_refused():
    with pytest.raises(ValueError, match="at least 32 bytes"):
        sign_request(b"short", "GET", "/x", b"")
    with pytest.raises(ValueError, match="at least 32 bytes"):
        RequestVerifier(b"short")


# --- verifying -------------------------------------------------------------------------------------------------------


def test_valid_request_accepted():
    make_verifier().verify("POST", "/task/ask", "", signed(), BODY)


def test_header_lookup_ignores_case():
    headers = {key.lower(): value for key, value in signed().items()}
    make_verifier().verify("POST", "/task/ask", "", headers, BODY)


TAMPERS = {
    # name: (method, path, body, header overrides)
    "method changed": ("GET", "/task/ask", BODY, {}),
    "path changed": ("POST", "/task/done", BODY, {}),
    "body changed": ("POST", "/task/ask", b'{"task_id":"t2"}', {}),
    "body emptied": ("POST", "/task/ask", b"", {}),
    "timestamp changed": ("POST", "/task/ask", BODY, {TIMESTAMP_HEADER: f"{NOW + 1:.3f}"}),
    "nonce changed": ("POST", "/task/ask", BODY, {NONCE_HEADER: nonce(2)}),
    "signature of another token": ("POST", "/task/ask", BODY, {SIGNATURE_HEADER: "0" * 64}),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_each_tamper_fails_with_401(name):
    method, path, body, overrides = TAMPERS[name]
    headers = {**signed(), **overrides}
    with pytest.raises(ProtocolError, match="bad signature") as info:
        make_verifier().verify(method, path, "", headers, body)
    assert info.value.status == 401 and info.value.field == f"header.{SIGNATURE_HEADER}"


def test_method_case_does_not_matter():
    make_verifier().verify("post", "/task/ask", "", signed(method="POST"), BODY)


@pytest.mark.parametrize("header", [TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
def test_missing_header_401_names_it(header):
    headers = signed()
    del headers[header]
    with pytest.raises(ProtocolError, match=f"missing header {header}") as info:
        make_verifier().verify("POST", "/task/ask", "", headers, BODY)
    assert info.value.status == 401 and info.value.field == f"header.{header}"


@pytest.mark.parametrize(
    "header, value",
    [
        (TIMESTAMP_HEADER, "nan"),
        (TIMESTAMP_HEADER, "1.7e9"),
        (TIMESTAMP_HEADER, " 1700000000"),
        (NONCE_HEADER, "xyz"),
        (NONCE_HEADER, "A" * 32),
        (SIGNATURE_HEADER, "00"),
    ],
)
def test_malformed_header_401(header, value):
    headers = {**signed(), header: value}
    with pytest.raises(ProtocolError, match=f"malformed header {header}") as info:
        make_verifier().verify("POST", "/task/ask", "", headers, BODY)
    assert info.value.status == 401


@pytest.mark.parametrize("offset", [-60.5, 60.5, -3600.0, 3600.0])
def test_timestamp_outside_window_401(offset):
    with pytest.raises(ProtocolError, match="expired or clock skew") as info:
        make_verifier(window_s=60.0).verify("POST", "/task/ask", "", signed(timestamp=NOW + offset), BODY)
    assert info.value.status == 401 and info.value.field == f"header.{TIMESTAMP_HEADER}"


@pytest.mark.parametrize("offset", [-59.5, 59.5])
def test_timestamp_inside_window_accepted(offset):
    make_verifier(window_s=60.0).verify("POST", "/task/ask", "", signed(timestamp=NOW + offset), BODY)


def test_replayed_nonce_401():
    verifier = make_verifier()
    verifier.verify("POST", "/task/ask", "", signed(), BODY)
    with pytest.raises(ProtocolError, match="replayed nonce") as info:
        verifier.verify("POST", "/task/ask", "", signed(), BODY)
    assert info.value.status == 401


def test_rejected_request_does_not_burn_its_nonce():
    verifier = make_verifier()
    with pytest.raises(ProtocolError):
        verifier.verify("POST", "/task/ask", "", {**signed(), SIGNATURE_HEADER: "0" * 64}, BODY)
    verifier.verify("POST", "/task/ask", "", signed(), BODY)
    assert verifier.cached_nonces == 1


def test_query_string_400_names_it_without_value():
    with pytest.raises(ProtocolError, match="query strings are not accepted") as info:
        make_verifier().verify("POST", "/task/ask", "token=s3cret", signed(), BODY)
    assert info.value.status == 400 and info.value.field == "query_string"
    assert "s3cret" not in str(info.value)


def test_nonces_older_than_two_windows_are_evicted():
    clock = FakeClock()
    verifier = RequestVerifier(TOKEN, window_s=60.0, clock=clock, not_before=NOW - 3600.0)
    for i in range(5):
        verifier.verify("POST", "/task/ask", "", signed(i), BODY)
    clock.now = NOW + 119.0  # a request stamped NOW + 60 would still pass until NOW + 120
    verifier.verify("POST", "/task/ask", "", signed(5, timestamp=clock.now), BODY)
    assert verifier.cached_nonces == 6
    clock.now = NOW + 121.0
    verifier.verify("POST", "/task/ask", "", signed(6, timestamp=clock.now), BODY)
    assert verifier.cached_nonces == 2  # nonce 5 (arrived at +119) and nonce 6


def test_full_cache_stays_bounded_and_still_refuses_replays():
    clock = FakeClock()
    verifier = RequestVerifier(TOKEN, max_nonces=10, clock=clock, not_before=NOW - 3600.0)
    for i in range(25):
        clock.now = NOW + i * 0.1
        verifier.verify("POST", "/task/ask", "", signed(i, timestamp=clock.now), BODY)
        assert verifier.cached_nonces <= 10
    assert verifier.cached_nonces == 10
    # nonce 0 was dropped while fresh; replaying it is refused (retryable for an honest client), never accepted
    with pytest.raises(ProtocolError, match="resend with a fresh signature") as info:
        verifier.verify("POST", "/task/ask", "", signed(0, timestamp=NOW), BODY)
    assert info.value.status == 503
    # a fresh signature passes
    verifier.verify("POST", "/task/ask", "", signed(99, timestamp=clock.now), BODY)


def test_concurrent_replays_accept_exactly_one():
    verifier = RequestVerifier(TOKEN)
    headers = sign_request(TOKEN, "POST", "/task/ask", BODY)
    barrier = threading.Barrier(8)
    outcomes = []

    def attempt():
        barrier.wait()
        try:
            verifier.verify("POST", "/task/ask", "", headers, BODY)
            outcomes.append("ok")
        except ProtocolError as error:
            outcomes.append(error.status)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes, key=str) == [401] * 7 + ["ok"]


# --- the token -------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_env_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_token_file_created_0600_and_reused(tmp_path, no_env_token):
    token = load_or_create_token(str(tmp_path / "run"))
    path = tmp_path / "run" / "run_token"
    assert len(token) == 32 and path.read_bytes() == token
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create_token(str(tmp_path / "run")) == token


def test_token_file_readable_by_others_refused(tmp_path, no_env_token):
    path = tmp_path / "run_token"
    path.write_bytes(os.urandom(32))
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600") as info:
        load_or_create_token(str(tmp_path))
    assert str(path) in str(info.value) and "0644" in str(info.value)


def test_token_file_of_wrong_length_refused(tmp_path, no_env_token):
    path = tmp_path / "run_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x" * 40)
    os.close(fd)
    with pytest.raises(ValueError, match="holds 40 bytes, expected 32") as info:
        load_or_create_token(str(tmp_path))
    assert str(path) in str(info.value)


def test_reader_waits_for_a_racing_creator_to_finish_writing(tmp_path, no_env_token):
    path = tmp_path / "run_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # created, not yet written
    expected = os.urandom(32)
    writer = threading.Timer(0.2, lambda: (os.write(fd, expected), os.close(fd)))
    writer.start()
    try:
        assert load_or_create_token(str(tmp_path)) == expected
    finally:
        writer.join(5)


def test_concurrent_creators_agree(tmp_path, no_env_token):
    barrier = threading.Barrier(8)
    tokens = []

    def create():
        barrier.wait()
        tokens.append(load_or_create_token(str(tmp_path)))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(tokens) == 8 and len(set(tokens)) == 1
    assert (tmp_path / "run_token").read_bytes() == tokens[0]


def test_env_token_used(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "ab" * 32)
    assert load_or_create_token(str(tmp_path)) == bytes.fromhex("ab" * 32)
    assert not (tmp_path / "run_token").exists()


@pytest.mark.parametrize("value", ["ab" * 31, "not-hex-" * 10, ""])
def test_bad_env_token_refused_without_echoing_it(tmp_path, monkeypatch, value):
    monkeypatch.setenv(TOKEN_ENV, value)
    with pytest.raises(ValueError, match="must be a hex string of at least 32 bytes") as info:
        load_or_create_token(str(tmp_path))
    if value:
        assert value not in str(info.value)


def test_a_request_stamped_before_the_verifier_existed_is_a_retryable_503():
    """A restarted server has forgotten the nonces it accepted: a captured request, stamped before the restart, is
    refused (503: an honest client signs again) even inside the window; a fresh signature passes."""
    clock = FakeClock(NOW)
    verifier = RequestVerifier(TOKEN, clock=clock)  # not_before: now
    assert verifier.not_before == NOW
    with pytest.raises(ProtocolError) as info:
        verifier.verify("POST", "/task/ask", "", signed(1, timestamp=NOW - 5.0), BODY)
    assert info.value.status == 503 and "before this server started" in info.value.message
    verifier.verify("POST", "/task/ask", "", signed(2, timestamp=NOW), BODY)
