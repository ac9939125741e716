"""Read RocketMQ frames out of a pcap capture (classic libpcap format, Ethernet / Linux cooked / raw IPv4
links): TCP segments are reassembled per direction by sequence number, then split into frames.

    for f in read_frames("small.pcap"):
        print(f.src, f.dst, f.command)

Used by the tests to replay the Java client's requests of a real capture.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from .command import RemotingCommand, decode_frame

_LINK_ETHERNET, _LINK_RAW, _LINK_SLL, _LINK_RAW2 = 1, 101, 113, 12


@dataclass
class CapturedFrame:
    index: int            # order of the frame's first byte in the capture
    src: tuple[str, int]
    dst: tuple[str, int]
    raw: bytes            # the whole frame, length prefix included
    command: RemotingCommand


def _packets(data: bytes):
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        raise ValueError("not a pcap file (pcapng is not supported)")
    linktype = struct.unpack(e + "I", data[20:24])[0]
    pos = 24
    while pos + 16 <= len(data):
        _, _, incl, _ = struct.unpack(e + "IIII", data[pos:pos + 16])
        pos += 16
        yield linktype, data[pos:pos + incl]
        pos += incl


def _tcp_segments(path: str | Path):
    data = Path(path).read_bytes()
    for n, (link, pkt) in enumerate(_packets(data)):
        if link == _LINK_ETHERNET:
            if len(pkt) < 14 or pkt[12:14] != b"\x08\x00":
                continue
            ip = pkt[14:]
        elif link == _LINK_SLL:
            if len(pkt) < 16 or pkt[14:16] != b"\x08\x00":
                continue
            ip = pkt[16:]
        elif link in (_LINK_RAW, _LINK_RAW2):
            ip = pkt
        else:
            raise ValueError(f"unsupported link type {link}")
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0xF) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        src = ".".join(map(str, ip[12:16]))
        dst = ".".join(map(str, ip[16:20]))
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        off = (tcp[12] >> 4) * 4
        flags = tcp[13]
        yield n, (src, sport), (dst, dport), seq, flags, tcp[off:]


def _reassemble(path: str | Path) -> dict[tuple, dict]:
    """Every TCP direction's bytes in sequence order: {(src, dst): {"buf": bytes, "starts": [(stream
    position, packet number)]}} (a SYN starts the direction anew)."""
    streams: dict[tuple, dict] = {}
    for n, src, dst, seq, flags, payload in _tcp_segments(path):
        key = (src, dst)
        st = streams.get(key)
        if flags & 0x02:          # SYN: the stream starts after it
            streams[key] = {"next": (seq + 1) & 0xFFFFFFFF, "buf": bytearray(), "ooo": {}, "starts": [], "base": 0}
            continue
        if not payload:
            continue
        if st is None:            # the capture began mid-connection: start at the first segment seen
            st = streams[key] = {"next": seq, "buf": bytearray(), "ooo": {}, "starts": [], "base": 0}
        if seq != st["next"]:
            st["ooo"][seq] = (n, payload)
            continue
        chunks = [(n, payload)]
        while True:
            for pn, p in chunks:
                st["starts"].append((st["base"] + len(st["buf"]), pn))
                st["buf"] += p
            st["next"] = (st["next"] + sum(len(p) for _, p in chunks)) & 0xFFFFFFFF
            nxt = st["ooo"].pop(st["next"], None)
            if nxt is None:
                break
            chunks = [nxt]
    return streams


def read_streams(path: str | Path) -> dict[tuple, bytes]:
    """Every TCP direction's bytes, {((src ip, port), (dst ip, port)): bytes}: for protocols that are not
    remoting frames (the HA link's offsets and commitlog frames)."""
    return {k: bytes(st["buf"]) for k, st in _reassemble(path).items()}


def read_frames(path: str | Path) -> list[CapturedFrame]:
    """Every whole frame of every TCP direction, in capture order of their first segment."""
    streams = _reassemble(path)
    out: list[CapturedFrame] = []
    for (src, dst), st in streams.items():
        buf = bytes(st["buf"])
        starts = st["starts"]
        pos = 0
        si = 0
        while pos + 4 <= len(buf):
            length = struct.unpack(">i", buf[pos:pos + 4])[0]
            if length < 4 or pos + 4 + length > len(buf):
                break
            while si + 1 < len(starts) and starts[si + 1][0] <= pos:
                si += 1
            raw = buf[pos:pos + 4 + length]
            out.append(CapturedFrame(starts[si][1] if starts else 0, src, dst, raw, decode_frame(raw[4:])))
            pos += 4 + length
    out.sort(key=lambda f: f.index)
    return out
