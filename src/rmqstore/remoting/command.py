"""RemotingCommand and its wire format (RocketMQ 4.x remoting).

A frame:

    int32  length            of everything after these 4 bytes (big-endian)
    int32  (serializeType << 24) | headerLength
    header                   JSON (serializeType 0) or ROCKETMQ binary (1)
    body                     length - 4 - headerLength bytes

JSON header: `{"code":..,"extFields":{..},"flag":..,"language":"JAVA","opaque":..,"remark":..,
"serializeTypeCurrentRPC":"JSON","version":293}` - extFields values are all strings; null members are left
out. ROCKETMQ binary header: code int16, language int8, version int16, opaque int32, flag int32, remark
(int32 length + UTF-8), extFields (int32 length + repeated [int16 key length, key, int32 value length,
value]). A response uses its request's serialize type.

Frames over MAX_FRAME_LENGTH (16 MiB, NettyDecoder's frameMaxLength) are refused.
"""
from __future__ import annotations

import itertools
import json
import struct
from typing import Any, Mapping

from .codes import (CURRENT_VERSION, RPC_ONEWAY, RPC_TYPE_RESPONSE, LanguageCode, RequestCode, ResponseCode,
                    SerializeType, code_name)

MAX_FRAME_LENGTH = 16 * 1024 * 1024
_I = struct.Struct(">i")
_II = struct.Struct(">iI")
_BIN_FIXED = struct.Struct(">hbhii")
_LANG_BY_NAME = {m.name: m for m in LanguageCode}
_LANG_NAMES = {m.value: m.name for m in LanguageCode}
_json_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_json_loads = json.loads
_enc = json.encoder.encode_basestring      # C: a JSON string literal, non-ASCII kept (as fastjson writes)
_decoder = json.JSONDecoder()
_raw_decode = _decoder.raw_decode
_scan_once = _decoder.scan_once          # the C scanner: (value, end), StopIteration when there is none
_new_command = object.__new__

_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """A fresh request id (RemotingCommand's requestId counter), wrapping within int32."""
    return next(_opaque_counter) & 0x7FFFFFFF


class RemotingError(Exception):
    """Base of the protocol errors."""


class FrameError(RemotingError):
    """The bytes received are not a valid frame (the connection cannot continue)."""


class FrameTooLarge(FrameError):
    pass


class RemotingCommand:
    __slots__ = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body",
                 "serialize_type", "header")

    def __init__(self, code: int = 0, *, opaque: int | None = None, flag: int = 0, remark: str | None = None,
                 ext_fields: dict[str, str] | None = None, body: bytes | None = None,
                 language: str = "JAVA", version: int = CURRENT_VERSION,
                 serialize_type: int = SerializeType.JSON):
        self.code = int(code)
        self.language = language
        self.version = version
        self.opaque = next_opaque() if opaque is None else opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = ext_fields
        self.body = body
        self.serialize_type = serialize_type
        self.header: bytes | None = None    # a pre-encoded JSON header (hot paths build it themselves)

    # --- constructors -------------------------------------------------------------------------
    @classmethod
    def request(cls, code: int, fields: Mapping[str, Any] | None = None, body: bytes | None = None,
                oneway: bool = False, **kw) -> "RemotingCommand":
        return cls(code, ext_fields=to_ext_fields(fields) if fields is not None else None, body=body,
                   flag=RPC_ONEWAY if oneway else 0, **kw)

    @classmethod
    def response(cls, code: int, remark: str | None = None, fields: Mapping[str, Any] | None = None,
                 body: bytes | None = None, opaque: int = 0, **kw) -> "RemotingCommand":
        return cls(code, opaque=opaque, flag=RPC_TYPE_RESPONSE, remark=remark,
                   ext_fields=to_ext_fields(fields) if fields is not None else None, body=body, **kw)

    def make_response(self, code: int, remark: str | None = None, fields: Mapping[str, Any] | None = None,
                      body: bytes | None = None) -> "RemotingCommand":
        """The response to this request: same opaque and serialize type."""
        return RemotingCommand(code, opaque=self.opaque, flag=RPC_TYPE_RESPONSE, remark=remark,
                               ext_fields=to_ext_fields(fields) if fields is not None else None, body=body,
                               serialize_type=self.serialize_type)

    # --- flags --------------------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)

    def field(self, name: str, default: str | None = None) -> str | None:
        ef = self.ext_fields
        if not ef:
            return default
        return ef.get(name, default)

    @property
    def code_name(self) -> str:
        return code_name(self.code, self.is_response)

    def __repr__(self) -> str:
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        return (f"RemotingCommand({kind} code={self.code_name} opaque={self.opaque} remark={self.remark!r} "
                f"ext={self.ext_fields!r} body={len(self.body) if self.body else 0}B)")

    # --- encoding -----------------------------------------------------------------------------
    def header_json(self) -> dict:
        h: dict[str, Any] = {"code": self.code}
        if self.ext_fields is not None:
            h["extFields"] = self.ext_fields
        h["flag"] = self.flag
        h["language"] = self.language if isinstance(self.language, str) else _LANG_NAMES.get(self.language, "JAVA")
        h["opaque"] = self.opaque
        if self.remark is not None:
            h["remark"] = self.remark
        h["serializeTypeCurrentRPC"] = "ROCKETMQ" if self.serialize_type == SerializeType.ROCKETMQ else "JSON"
        h["version"] = self.version
        return h

    def encode_header(self) -> bytes:
        if self.serialize_type == SerializeType.ROCKETMQ:
            return encode_binary_header(self)
        # The JSON header by hand (members in fastjson's order): about 3x faster than json.dumps.
        ef = self.ext_fields
        lang = self.language
        if not isinstance(lang, str):
            lang = _LANG_NAMES.get(lang, "JAVA")
        parts = ['{"code":', str(int(self.code))]
        if ef is not None:
            if ef:
                parts.append(',"extFields":{')
                parts.append(",".join([_enc(k) + ":" + _enc(v if v.__class__ is str else str(v)) for k, v in ef.items()]))
                parts.append("}")
            else:
                parts.append(',"extFields":{}')
        parts.append(',"flag":%d,"language":%s,"opaque":%d' % (self.flag, _enc(lang), self.opaque))
        if self.remark is not None:
            parts.append(',"remark":')
            parts.append(_enc(self.remark))
        parts.append(',"serializeTypeCurrentRPC":"JSON","version":%d}' % self.version)
        return "".join(parts).encode("utf-8")

    def encode(self) -> bytes:
        header = self.header or self.encode_header()
        body = self.body or b""
        hl = len(header)
        if hl > 0xFFFFFF:
            raise RemotingError(f"header of {hl} bytes does not fit 24 bits")
        return _II.pack(4 + hl + len(body), (int(self.serialize_type) << 24) | hl) + header + body


def to_ext_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    """A custom header's fields as extFields: every value a string (booleans as true/false), None left out."""
    out = {}
    for k, v in fields.items():
        if v is None:
            continue
        if v is True:
            out[k] = "true"
        elif v is False:
            out[k] = "false"
        else:
            out[k] = str(v) if not isinstance(v, str) else v
    return out


# --- ROCKETMQ binary header ------------------------------------------------------------------------
def encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = cmd.language
    lang_code = _LANG_BY_NAME[lang].value if isinstance(lang, str) and lang in _LANG_BY_NAME else (
        int(lang) if isinstance(lang, int) else 0)
    parts = [_BIN_FIXED.pack(_to_int16(cmd.code), lang_code, _to_int16(cmd.version), _to_int32(cmd.opaque),
                             _to_int32(cmd.flag))]
    remark = cmd.remark.encode("utf-8") if cmd.remark else b""
    parts.append(_I.pack(len(remark)))
    parts.append(remark)
    ext = b""
    if cmd.ext_fields:
        items = []
        for k, v in cmd.ext_fields.items():
            if k is None or v is None:
                continue
            kb, vb = str(k).encode("utf-8"), str(v).encode("utf-8")
            items.append(struct.pack(">h", len(kb)) + kb + _I.pack(len(vb)) + vb)
        ext = b"".join(items)
    parts.append(_I.pack(len(ext)))
    parts.append(ext)
    return b"".join(parts)


def decode_binary_header(data: bytes | memoryview) -> RemotingCommand:
    data = bytes(data)
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(data, 0)
        p = _BIN_FIXED.size
        rl = _I.unpack_from(data, p)[0]
        p += 4
        if rl < 0 or p + rl > len(data):
            raise FrameError(f"binary header: remark length {rl} out of range")
        remark = data[p:p + rl].decode("utf-8") if rl > 0 else None
        p += rl
        el = _I.unpack_from(data, p)[0]
        p += 4
        if el < 0 or p + el > len(data):
            raise FrameError(f"binary header: extFields length {el} out of range")
        ext = None
        if el > 0:
            ext = {}
            end = p + el
            while p < end:
                kl = struct.unpack_from(">h", data, p)[0]
                p += 2
                if kl < 0 or p + kl > end:
                    raise FrameError("binary header: key length out of range")
                k = data[p:p + kl].decode("utf-8")
                p += kl
                vl = _I.unpack_from(data, p)[0]
                p += 4
                if vl < 0 or p + vl > end:
                    raise FrameError("binary header: value length out of range")
                ext[k] = data[p:p + vl].decode("utf-8")
                p += vl
    except (struct.error, UnicodeDecodeError) as e:
        raise FrameError(f"binary header: {e}") from None
    return RemotingCommand(code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext,
                           language=_LANG_NAMES.get(lang, "OTHER"), version=version,
                           serialize_type=SerializeType.ROCKETMQ)


def _to_int16(v: int) -> int:
    v &= 0xFFFF
    return v - 0x10000 if v & 0x8000 else v


def _to_int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v & 0x80000000 else v


# --- decoding ---------------------------------------------------------------------------------------
def decode_json_header(data: bytes | memoryview) -> RemotingCommand:
    try:
        text = str(data, "utf-8")
        h, end = _scan_once(text, 0)
        if end != len(text) and text[end:].strip():
            raise ValueError("extra data after the header")
    except StopIteration as e:
        raise FrameError(f"JSON header: Expecting value: char {e.value}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise FrameError(f"JSON header: {e}") from None
    if h.__class__ is not dict:
        raise FrameError("JSON header is not an object")
    get = h.get
    code, opaque, flag, version = get("code", 0), get("opaque", 0), get("flag", 0), get("version", 0)
    if not (code.__class__ is int and opaque.__class__ is int and flag.__class__ is int and version.__class__ is int):
        raise FrameError("JSON header: code, opaque, flag and version must be integers")
    ext = get("extFields")
    if ext is not None:
        if ext.__class__ is not dict:
            raise FrameError("JSON header: extFields is not an object")
        for v in ext.values():
            if v.__class__ is not str:
                ext = {str(k): _ext_str(v) for k, v in ext.items() if v is not None}
                break
    remark = get("remark")
    if remark is not None and remark.__class__ is not str:
        remark = str(remark)
    lang = get("language", "JAVA")
    cmd = _new_command(RemotingCommand)
    cmd.code = code
    cmd.language = lang if lang.__class__ is str else "OTHER"
    cmd.version = version
    cmd.opaque = opaque
    cmd.flag = flag
    cmd.remark = remark
    cmd.ext_fields = ext
    cmd.body = None
    cmd.serialize_type = SerializeType.JSON
    cmd.header = None
    return cmd


def _ext_str(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """A frame's content (after the 4-byte length) to a command."""
    n = len(frame)
    if n < 4:
        raise FrameError(f"frame of {n} bytes is too short for the header length")
    ori = _I.unpack_from(frame, 0)[0]
    stype = (ori >> 24) & 0xFF
    hl = ori & 0xFFFFFF
    if hl > n - 4:
        raise FrameError(f"header length {hl} exceeds the frame ({n - 4} bytes after it)")
    header = frame[4:4 + hl]
    if stype == 0:
        cmd = decode_json_header(header)
    elif stype == 1:
        cmd = decode_binary_header(header)
    else:
        raise FrameError(f"unknown serialize type {stype}")
    if n > 4 + hl:
        cmd.body = bytes(frame[4 + hl:])
    return cmd


class FrameDecoder:
    """Incremental frame splitter: feed() bytes, get whole commands; bounded by max_frame."""

    def __init__(self, max_frame: int = MAX_FRAME_LENGTH):
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        buf = self._buf
        if buf:
            buf += data
            src = buf
        else:
            src = data          # nothing buffered: frames are read straight from data (no copy)
        out = []
        pos = 0
        n = len(src)
        unpack = _I.unpack_from
        max_frame = self.max_frame
        try:
            while n - pos >= 4:
                length = unpack(src, pos)[0]
                if length < 4:
                    raise FrameError(f"frame length {length} is below the minimum of 4")
                if length > max_frame:
                    raise FrameTooLarge(f"frame length {length} exceeds the maximum of {max_frame}")
                end = pos + 4 + length
                if end > n:
                    break
                ori = unpack(src, pos + 4)[0]
                hl = ori & 0xFFFFFF
                hend = pos + 8 + hl
                if hend > end:
                    raise FrameError(f"header length {hl} exceeds the frame ({length - 4} bytes after it)")
                if ori >> 24 == 0:
                    cmd = decode_json_header(src[pos + 8:hend])
                    if hend < end:
                        cmd.body = bytes(src[hend:end])
                    out.append(cmd)
                else:
                    out.append(decode_frame(src[pos + 4:end]))
                pos = end
        except FrameError:
            self._buf = bytearray()     # the stream cannot be resynchronised: drop what is buffered
            raise
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < n:
            buf += src[pos:]            # a partial frame: kept for the next feed
        return out


__all__ = ["RemotingCommand", "FrameDecoder", "FrameError", "FrameTooLarge", "RemotingError", "decode_frame",
           "encode_binary_header", "decode_binary_header", "to_ext_fields", "next_opaque", "MAX_FRAME_LENGTH",
           "RequestCode", "ResponseCode", "SerializeType", "LanguageCode"]
