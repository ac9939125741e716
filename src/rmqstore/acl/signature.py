"""The signatures of plain ACL: RocketMQ 4.x remoting (AclClientRPCHook / AclSigner) and RocketMQ 5 gRPC
(the `authorization` metadata), both sides. Pure functions; the secret never leaves them.

Remoting: content = the values of every ext field but `Signature`, in the Java String order of their names
(UTF-16 code units; for ASCII names byte order: `AccessKey` before `a`), concatenated with no separator,
UTF-8, then the body; Signature = Base64(HmacSHA1(secretKey, content)).

gRPC: `authorization: MQv2-HMAC-SHA1 Credential=AK[/...], SignedHeaders=x-mq-date-time, Signature=HEX`, HEX =
lower-case hex of HmacSHA1(secretKey, the x-mq-date-time value).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Mapping

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
GRPC_METHOD = "MQv2-HMAC-SHA1"


@dataclass(frozen=True)
class SessionCredentials:
    """An account's keys on the client side (RocketMQ's SessionCredentials)."""
    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self):
        if not self.access_key or not self.secret_key:
            raise ValueError("an access key and a secret key are both needed to sign requests")


class HmacSha1:
    """HmacSHA1 under one key, the key's inner and outer SHA-1 states computed once (RFC 2104): a third of
    hmac.digest's time per message. Never shows the key."""
    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes):
        if len(key) > 64:
            key = hashlib.sha1(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha1(key.translate(_IPAD))
        self._outer = hashlib.sha1(key.translate(_OPAD))

    def digest(self, *parts: bytes) -> bytes:
        """The MAC of the parts' concatenation."""
        i = self._inner.copy()
        for p in parts:
            i.update(p)
        o = self._outer.copy()
        o.update(i.digest())
        return o.digest()

    def base64(self, *parts: bytes) -> str:
        return binascii.b2a_base64(self.digest(*parts), newline=False).decode("ascii")

    def __repr__(self) -> str:
        return "HmacSha1(<key>)"


_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def _java_order(keys) -> list[str]:
    keys = list(keys)
    if "".join(keys).isascii():
        return sorted(keys)
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


def remoting_fields_bytes(ext_fields: Mapping[str, str] | None, skip: frozenset = frozenset()) -> bytes:
    """The ext-field part of what a remoting signature covers: the values but Signature's (and skip's), in
    the Java order of their names, UTF-8."""
    if not ext_fields:
        return b""
    values = [ext_fields[k] for k in _java_order(ext_fields) if k != SIGNATURE and k not in skip]
    return "".join(values).encode("utf-8", "replace")


def remoting_content(ext_fields: Mapping[str, str] | None, body: bytes | None,
                     skip: frozenset = frozenset()) -> bytes:
    """What a remoting signature covers (see the module doc); fields named in skip are left out."""
    head = remoting_fields_bytes(ext_fields, skip)
    return head + body if body else head


def hmac_sha1(secret: bytes, content: bytes) -> bytes:
    return hmac.digest(secret, content, "sha1")


def remoting_signature(secret: bytes, content: bytes) -> str:
    return base64.b64encode(hmac.digest(secret, content, "sha1")).decode("ascii")


def signature_equals(expected: str, given: str | None) -> bool:
    """Timing-safe comparison of two signatures (given may be anything a peer sent)."""
    if given is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8", "replace"), given.encode("utf-8", "replace"))


def sign_fields(fields: dict[str, str], body: bytes | None, credentials: SessionCredentials) -> dict[str, str]:
    """AclClientRPCHook.doBeforeRequest on an ext-field dict (changed in place and returned): AccessKey (and
    SecurityToken) added, Signature over every field sent."""
    fields.pop(SIGNATURE, None)
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields[SIGNATURE] = remoting_signature(credentials.secret_key.encode("utf-8"), remoting_content(fields, body))
    return fields


class RemotingSigner:
    """A client-side RPC hook: signs a RemotingCommand before it is encoded (its ext fields and body).
    For rmqstore's clients, and for a broker's own requests to other brokers and name servers (a slave's
    SlaveSynchronize requests, REGISTER_BROKER)."""

    def __init__(self, credentials: SessionCredentials):
        self.credentials = credentials
        self._mac = HmacSha1(credentials.secret_key.encode("utf-8"))

    @property
    def access_key(self) -> str:
        return self.credentials.access_key

    def __call__(self, cmd) -> None:
        if cmd.header is not None:
            raise ValueError("a pre-encoded request header cannot be signed: build it from ext fields")
        fields = cmd.ext_fields
        if fields is None:
            fields = cmd.ext_fields = {}
        c = self.credentials
        fields.pop(SIGNATURE, None)
        fields[ACCESS_KEY] = c.access_key
        if c.security_token is not None:
            fields[SECURITY_TOKEN] = c.security_token
        fields[SIGNATURE] = self._mac.base64(remoting_fields_bytes(fields), cmd.body or b"")

    def __repr__(self) -> str:
        return f"RemotingSigner(access_key={self.credentials.access_key!r})"


# --- gRPC ------------------------------------------------------------------------------------------------
class AuthorizationError(ValueError):
    pass


def parse_authorization(header: str) -> tuple[str, str | None]:
    """(access key, signature as Base64) of an `authorization` value (RocketMQ 5's AuthorizationHeader:
    the method up to the first space, then `K=V` items split on `,`)."""
    method, sep, rest = header.partition(" ")
    if not sep:
        raise AuthorizationError("authorization header is incorrect")
    access_key, signature = None, None
    for item in rest.split(","):
        k, eq, v = item.strip().partition("=")
        if not eq:
            raise AuthorizationError("authorization keyValues length is incorrect")
        if k == "Credential":
            access_key = v.split("/")[0]
        elif k == "Signature":
            try:
                signature = base64.b64encode(binascii.unhexlify(v)).decode("ascii")
            except (binascii.Error, ValueError):
                raise AuthorizationError("authorization signature is not hex") from None
    if access_key is None:
        raise AuthorizationError("authorization header has no Credential")
    return access_key, signature


def grpc_signature_hex(secret_key: str, date_time: str) -> str:
    return hmac.digest(secret_key.encode("utf-8"), date_time.encode("utf-8"), "sha1").hex()


def grpc_authorization(credentials: SessionCredentials, date_time: str) -> str:
    """The `authorization` value a RocketMQ 5 client sends."""
    return (f"{GRPC_METHOD} Credential={credentials.access_key}, SignedHeaders={DATE_TIME}, "
            f"Signature={grpc_signature_hex(credentials.secret_key, date_time)}")
