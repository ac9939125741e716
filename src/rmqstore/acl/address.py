"""Remote address patterns of plain_acl.yml (RocketMQ's RemoteAddressStrategyFactory), matched against the
client's IP (the peer address without its port):

    (blank)               never matches
    *                     every address
    192.168.1.{1,2,3}     the listed last parts
    192.168.1.1,10.0.0.2  the listed addresses
    192.168.1.*  192.168.1.10-20  192.168.*.*  192.168.3-5.*   a range in the 4th (or the 3rd) part
    192.168.1.1           one address

A pattern that is none of these (a part above 255, a range without a start, too few parts) is refused with
AddressPatternError; a peer that is not an IPv4 address matches only `*` and the exact forms.
"""
from __future__ import annotations

from dataclasses import dataclass


class AddressPatternError(ValueError):
    pass


def _octet(s: str) -> int:
    s = s.strip()
    if not s.isdigit() or int(s) > 255:
        raise AddressPatternError(f"{s!r} is not a number in 0..255")
    return int(s)


def _parts(s: str) -> list[str]:
    return [p for p in s.split(".") if p]       # StringUtils.split: no empty parts


def _verify(address: str, count: int = 4) -> None:
    parts = _parts(address)
    if len(parts) != 4:
        raise AddressPatternError(f"address {address!r} does not have 4 parts")
    for p in parts[:count]:
        _octet(p)


@dataclass(frozen=True)
class AddressPattern:
    text: str
    kind: str                         # never, all, set, range, one
    addresses: frozenset = frozenset()
    head: str = ""
    index: int = 0                    # the part the range is in (2 or 3)
    start: int = 0
    end: int = 0

    def match(self, ip: str | None) -> bool:
        kind = self.kind
        if kind == "all":
            return True
        if kind == "never" or not ip:
            return False
        if kind == "one" or kind == "set":
            return ip in self.addresses
        if not ip.startswith(self.head):
            return False
        rest = ip[len(self.head):]
        value = rest if self.index == 3 else rest[:rest.rfind(".")] if "." in rest else ""
        return value.isdigit() and len(value) <= 3 and self.start <= int(value) <= self.end


NEVER = AddressPattern("", "never")


def parse_address_pattern(text) -> AddressPattern:
    if text is None or not str(text).strip():
        return NEVER
    s = str(text).strip()
    if s == "*":
        return AddressPattern(s, "all")
    if s.endswith("}"):
        parts = _parts(s)
        if len(parts) < 4 or not parts[3].startswith("{"):
            raise AddressPatternError(f"{s!r}: the {{...}} list must be the 4th part")
        prefix = s[:s.index("{")]
        items = [prefix + x.strip() for x in s[s.index("{") + 1:-1].split(",") if x.strip()]
        for a in items:
            _verify(a)
        return AddressPattern(s, "set", frozenset(items))
    if "," in s:
        items = [x.strip() for x in s.split(",") if x.strip()]
        for a in items:
            _verify(a)
        return AddressPattern(s, "set", frozenset(items))
    if "*" in s or "-" in s:
        parts = _parts(s)
        if len(parts) != 4:
            raise AddressPatternError(f"range {s!r} does not have 4 parts")
        for index in (2, 3):
            value = parts[index].strip()
            if value == "*":
                start, end = 0, 255
            elif "-" in value:
                if value.startswith("-"):
                    raise AddressPatternError(f"range {s!r}: {value!r} has no start")
                bounds = [b for b in value.split("-") if b]
                if len(bounds) != 2:
                    raise AddressPatternError(f"range {s!r}: {value!r} is not START-END")
                start, end = _octet(bounds[0]), _octet(bounds[1])
                if start > end:
                    raise AddressPatternError(f"range {s!r}: start {start} is above end {end}")
            else:
                continue
            if end <= 0:
                continue
            for p in parts[:index]:
                _octet(p)
            head = ".".join(p.strip() for p in parts[:index]) + "."
            return AddressPattern(s, "range", head=head, index=index, start=start, end=end)
        raise AddressPatternError(f"range {s!r}: no * or START-END in the 3rd or 4th part")
    _verify(s)
    return AddressPattern(s, "one", frozenset({s}))


def peer_ip(remote: str | None) -> str:
    """The IP of a peer address: `1.2.3.4:5678` -> `1.2.3.4`, `ipv4:1.2.3.4:5678` (gRPC) -> `1.2.3.4`,
    `[::1]:5678` / `ipv6:[::1]:5678` -> `::1`."""
    if not remote:
        return ""
    r = remote
    for scheme in ("ipv4:", "ipv6:"):
        if r.startswith(scheme):
            r = r[len(scheme):]
    if r.startswith("["):
        return r[1:r.find("]")] if "]" in r else r[1:]
    host, sep, _port = r.rpartition(":")
    return host if sep else r
