"""SASL gate (SCRAM-SHA-256/512, PLAIN) for the Kafka TLS suite.

The pinned test broker (Tansu 0.6.0) implements SCRAM-SHA-256/512 only
with users that an already authenticated client creates
(AlterUserScramCredentials), and its in-memory storage starts with none,
so no client can ever log in. This gate sits between the TLS terminator
and the broker and performs the broker side of Kafka's SASL exchange
itself: ApiVersions is forwarded, SaslHandshake and SaslAuthenticate are
answered here (SCRAM per RFC 5802 / RFC 7677, the server keeping only the
salted keys; PLAIN per RFC 4616), and once the client has proven the password every byte is
relayed to the broker unchanged. A wrong password or an unknown user gets
SASL_AUTHENTICATION_FAILED (58) and a closed connection, as from Kafka.

usage: python3 sasl_gate.py LISTEN_PORT BROKER_PORT MECHANISM USER
The password comes from the environment variable SASL_GATE_PASSWORD, so
it is not on any command line. Prints `listening` once it accepts.
"""

import base64
import hashlib
import hmac
import os
import socket
import struct
import sys
import threading

LISTEN, UPSTREAM, MECHANISM, USER = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    sys.argv[3],
    sys.argv[4],
)
# PLAIN is checked against a SHA-512 of the password; SCRAM keeps only
# the salted keys.
HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512", "PLAIN": "sha512"}[
    MECHANISM
]
ITERATIONS = 4096
SALT = os.urandom(16)
_salted = hashlib.pbkdf2_hmac(
    HASH, os.environ["SASL_GATE_PASSWORD"].encode(), SALT, ITERATIONS
)
STORED_KEY = hashlib.new(HASH, hmac.digest(_salted, b"Client Key", HASH)).digest()
SERVER_KEY = hmac.digest(_salted, b"Server Key", HASH)
PLAIN_DIGEST = hashlib.sha512(os.environ["SASL_GATE_PASSWORD"].encode()).digest()
del _salted

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
NONE, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = (
    0,
    33,
    34,
    58,
)


class AuthFailed(Exception):
    pass


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def read_frame(sock):
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


def send_frame(sock, body):
    sock.sendall(struct.pack(">i", len(body)) + body)


def uvarint(data, pos):
    shift = value = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def put_uvarint(n):
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def parse_request(frame):
    """(api_key, version, correlation id, body offset) of a request."""
    api_key, version, correlation = struct.unpack(">hhi", frame[:8])
    (client_len,) = struct.unpack(">h", frame[8:10])
    pos = 10 + max(client_len, 0)
    if api_key == SASL_AUTHENTICATE and version >= 2:
        tags, pos = uvarint(frame, pos)
        assert tags == 0, "tagged fields in the request header"
    return api_key, version, correlation, pos


def auth_bytes(frame, version, pos):
    if version >= 2:
        n, pos = uvarint(frame, pos)
        return frame[pos : pos + n - 1]
    (n,) = struct.unpack(">i", frame[pos : pos + 4])
    return frame[pos + 4 : pos + 4 + n]


def authenticate_response(correlation, version, error, message, payload):
    if version >= 2:
        out = struct.pack(">i", correlation) + b"\x00" + struct.pack(">h", error)
        if message is None:
            out += b"\x00"
        else:
            out += put_uvarint(len(message.encode()) + 1) + message.encode()
        out += put_uvarint(len(payload) + 1) + payload
        return out + struct.pack(">q", 0) + b"\x00"
    out = struct.pack(">ih", correlation, error)
    if message is None:
        out += struct.pack(">h", -1)
    else:
        out += struct.pack(">h", len(message.encode())) + message.encode()
    out += struct.pack(">i", len(payload)) + payload
    if version >= 1:
        out += struct.pack(">q", 0)
    return out


def attributes(message):
    return dict(part.split("=", 1) for part in message.split(","))


class Plain:
    """RFC 4616: one message, `authzid NUL user NUL password`."""

    def __init__(self):
        self.step = 0

    def next(self, payload):
        _authzid, user, password = payload.split(b"\0")
        ok = hmac.compare_digest(hashlib.sha512(password).digest(), PLAIN_DIGEST)
        if user.decode() != USER or not ok:
            raise AuthFailed("invalid credentials")
        self.step = 2
        return b""


class Scram:
    def __init__(self):
        self.step = 0

    def next(self, payload):
        text = payload.decode()
        if self.step == 0:
            if not text.startswith("n,,"):
                raise AuthFailed("channel binding requested")
            self.client_first_bare = text[3:]
            attrs = attributes(self.client_first_bare)
            self.user = attrs["n"]
            self.nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
            self.server_first = "r=%s,s=%s,i=%d" % (
                self.nonce,
                base64.b64encode(SALT).decode(),
                ITERATIONS,
            )
            self.step = 1
            return self.server_first.encode()
        if self.step == 1:
            without_proof, _, proof = text.rpartition(",p=")
            attrs = attributes(without_proof)
            if attrs.get("r") != self.nonce:
                raise AuthFailed("nonce mismatch")
            auth_message = ",".join(
                [self.client_first_bare, self.server_first, without_proof]
            ).encode()
            signature = hmac.digest(STORED_KEY, auth_message, HASH)
            client_key = bytes(
                a ^ b for a, b in zip(base64.b64decode(proof), signature)
            )
            ok = hmac.compare_digest(
                hashlib.new(HASH, client_key).digest(), STORED_KEY
            )
            if self.user != USER or not ok:
                raise AuthFailed("invalid credentials")
            self.step = 2
            server_signature = hmac.digest(SERVER_KEY, auth_message, HASH)
            return ("v=" + base64.b64encode(server_signature).decode()).encode()
        raise AuthFailed("exchange already finished")


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client):
    upstream = None
    try:
        upstream = socket.create_connection(("127.0.0.1", UPSTREAM))
        scram = None
        while True:
            frame = read_frame(client)
            api_key, version, correlation, pos = parse_request(frame)
            if api_key == API_VERSIONS:
                send_frame(upstream, frame)
                send_frame(client, read_frame(upstream))
            elif api_key == SASL_HANDSHAKE:
                (n,) = struct.unpack(">h", frame[pos : pos + 2])
                requested = frame[pos + 2 : pos + 2 + n].decode()
                error = NONE if requested == MECHANISM else UNSUPPORTED_SASL_MECHANISM
                mechanism = MECHANISM.encode()
                send_frame(
                    client,
                    struct.pack(">ihi", correlation, error, 1)
                    + struct.pack(">h", len(mechanism))
                    + mechanism,
                )
                if error != NONE:
                    return
                scram = Plain() if MECHANISM == "PLAIN" else Scram()
            elif api_key == SASL_AUTHENTICATE and scram is not None:
                try:
                    reply = scram.next(auth_bytes(frame, version, pos))
                except (AuthFailed, KeyError, ValueError, UnicodeDecodeError):
                    send_frame(
                        client,
                        authenticate_response(
                            correlation,
                            version,
                            SASL_AUTHENTICATION_FAILED,
                            "Authentication failed during authentication due to "
                            "invalid credentials with SASL mechanism " + MECHANISM,
                            b"",
                        ),
                    )
                    return
                send_frame(
                    client, authenticate_response(correlation, version, NONE, None, reply)
                )
                if scram.step == 2:
                    break
            else:
                # Anything else before authentication: a real broker closes.
                return
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)
        upstream = None
    except (EOFError, OSError, AssertionError, struct.error):
        pass
    finally:
        for sock in (client, upstream):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


def main():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", LISTEN))
    listener.listen(64)
    print("listening", flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client,), daemon=True).start()


main()
