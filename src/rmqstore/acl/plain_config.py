"""plain_acl.yml, read as RocketMQ's PlainPermissionLoader.load reads it, into a PlainAclConfig; every error
names the file and the line, and no error or warning text ever holds a secret key.

    globalWhiteRemoteAddresses: [ADDRESS_PATTERN, ...]
    accounts:
    - accessKey: KEY              # more than 6 characters
      secretKey: SECRET           # more than 6 characters
      whiteRemoteAddress: PATTERN # optional: requests from here skip the signature and permission checks
      admin: false
      defaultTopicPerm: DENY      # for topics not in topicPerms
      defaultGroupPerm: SUB       # for groups not in groupPerms
      topicPerms: [TOPIC=PERM, ...]
      groupPerms: [GROUP=PERM, ...]

PERM is DENY, PUB, SUB, PUB|SUB (SUB|PUB); anything else counts as DENY (with a warning). Groups are kept
as their retry topic `%RETRY%GROUP` in one resource map with the topics (a topic entry wins over a group
entry of the same name, as RocketMQ parses groupPerms first). A later account with the same accessKey
replaces the earlier one (warned). Unknown keys are ignored (warned; `dataVersion` of RocketMQ 5's file
silently).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import yaml

from ..errors import RmqStoreError
from .address import AddressPattern, AddressPatternError, parse_address_pattern
from .permission import PERM_NAMES, is_known_perm, parse_perm, retry_topic
from .signature import HmacSha1

MAX_FILE_BYTES = 8 << 20
MIN_KEY_LENGTH = 7            # RocketMQ: "length should longer than 6"

_ACCOUNT_KEYS = frozenset({"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                           "defaultGroupPerm", "topicPerms", "groupPerms"})
_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"


class AclConfigError(RmqStoreError):
    """plain_acl.yml cannot be used: `path:line: reason`."""

    def __init__(self, path: str, line: int | None, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{self.path}:{line}: {reason}" if line else f"{self.path}: {reason}")


@dataclass(frozen=True)
class PlainAccount:
    access_key: str
    secret_key: bytes = field(repr=False)          # UTF-8; never printed
    white_remote_address: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    resource_perms: Mapping[str, int]              # topic -> perm, %RETRY%group -> perm
    line: int
    mac: HmacSha1 = field(init=False, repr=False, compare=False)     # HmacSHA1 under secret_key

    def __post_init__(self):
        object.__setattr__(self, "mac", HmacSha1(self.secret_key))


@dataclass(frozen=True)
class PlainAclConfig:
    path: str
    global_white: tuple[AddressPattern, ...]
    accounts: Mapping[str, PlainAccount]
    warnings: tuple[str, ...] = ()


class _Reader:
    def __init__(self, path: str):
        self.path = path
        self.warnings: list[str] = []

    def fail(self, node, reason: str):
        raise AclConfigError(self.path, _line(node), reason)

    def warn(self, node, text: str) -> None:
        self.warnings.append(f"{self.path}:{_line(node)}: {text}")

    def string(self, node, what: str) -> str | None:
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL):
            return None
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, f"{what} must be a single value")
        return node.value

    def strings(self, node, what: str) -> list[tuple[str, object]]:
        """A list of scalars as (text, node); null is an empty list."""
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL):
            return []
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, f"{what} must be a list")
        out = []
        for item in node.value:
            s = self.string(item, f"an item of {what}")
            if s is not None:
                out.append((s, item))
        return out

    def boolean(self, node, what: str) -> bool:
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL):
            return False
        if isinstance(node, yaml.ScalarNode):
            v = node.value.strip().lower()
            if node.tag == _BOOL or v in ("true", "false"):
                if v in ("true", "yes", "on", "y"):
                    return True
                if v in ("false", "no", "off", "n"):
                    return False
        self.fail(node, f"{what} must be true or false")

    def mapping(self, node, what: str) -> dict[str, tuple[object, object]]:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping of keys to values")
        out: dict[str, tuple[object, object]] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                self.fail(k, f"a key of {what} must be a name")
            out[k.value] = (k, v)
        return out

    def address(self, node, text, what: str) -> AddressPattern:
        try:
            return parse_address_pattern(text)
        except AddressPatternError as e:
            self.fail(node, f"{what}: {e}")

    def perm(self, node, text, what: str) -> int:
        if not is_known_perm(text):
            self.warn(node, f"{what} {str(text).strip()!r} is not one of {', '.join(PERM_NAMES)}: taken as DENY")
        return parse_perm(text)

    def resources(self, node, what: str, into: dict[str, int], groups: bool) -> None:
        for item, item_node in self.strings(node, what):
            parts = [p for p in item.split("=") if p]          # StringUtils.split: no empty parts
            if len(parts) != 2 or not parts[0].strip():
                self.fail(item_node, f"{what} item {item!r} is not NAME=PERM")
            name = parts[0].strip()
            into[retry_topic(name) if groups else name] = self.perm(item_node, parts[1], f"{what} of {name!r}:")

    def account(self, node) -> PlainAccount:
        m = self.mapping(node, "an account")
        for key, (k, _v) in m.items():
            if key not in _ACCOUNT_KEYS:
                self.warn(k, f"unknown account key {key!r} ignored")

        def get(key):
            return m[key][1] if key in m else None
        ak = self.string(get("accessKey"), "accessKey")
        sk = self.string(get("secretKey"), "secretKey")
        if ak is None or len(ak) < MIN_KEY_LENGTH:
            self.fail(m["accessKey"][1] if "accessKey" in m else node,
                      f"accessKey must be longer than 6 characters (it has {len(ak or '')})")
        if sk is None or len(sk) < MIN_KEY_LENGTH:
            self.fail(m["secretKey"][1] if "secretKey" in m else node,
                      f"secretKey of {ak!r} must be longer than 6 characters")
        perms: dict[str, int] = {}
        self.resources(get("groupPerms"), "groupPerms", perms, groups=True)
        self.resources(get("topicPerms"), "topicPerms", perms, groups=False)
        wra_node = get("whiteRemoteAddress")
        return PlainAccount(
            access_key=ak, secret_key=sk.encode("utf-8", "replace"),
            white_remote_address=self.address(wra_node, self.string(wra_node, "whiteRemoteAddress"),
                                              "whiteRemoteAddress"),
            admin=self.boolean(get("admin"), "admin"),
            default_topic_perm=self.perm(get("defaultTopicPerm") or node,
                                         self.string(get("defaultTopicPerm"), "defaultTopicPerm"),
                                         "defaultTopicPerm"),
            default_group_perm=self.perm(get("defaultGroupPerm") or node,
                                         self.string(get("defaultGroupPerm"), "defaultGroupPerm"),
                                         "defaultGroupPerm"),
            resource_perms=MappingProxyType(perms), line=_line(node))


def _line(node) -> int | None:
    mark = getattr(node, "start_mark", None)
    return mark.line + 1 if mark is not None else None


def parse_plain_acl(text: str | bytes, path: str | Path = "plain_acl.yml") -> PlainAclConfig:
    """The rules of a plain_acl.yml text; AclConfigError (file:line: reason) when it cannot be used."""
    path = str(path)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise AclConfigError(path, text.count(b"\n", 0, e.start) + 1, "not UTF-8 text") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        # problem and context only: the snippet PyYAML quotes could hold a secret key
        # a token left open (a quote) is reported where it starts; anything else where parsing stopped
        first = e.context_mark if isinstance(e, yaml.scanner.ScannerError) and e.context_mark else e.problem_mark
        reason = "; ".join(x for x in (e.context, e.problem) if x) or "not YAML"
        if e.problem_mark is not None and first is not e.problem_mark:
            reason += f" (line {e.problem_mark.line + 1})"
        raise AclConfigError(path, first.line + 1 if first else None, f"not valid YAML: {reason}") from None
    except yaml.YAMLError as e:
        raise AclConfigError(path, None, f"not valid YAML: {type(e).__name__}") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and not root.value.strip()):
        raise AclConfigError(path, None, "the file has no data (RocketMQ refuses it too)")
    r = _Reader(path)
    top = r.mapping(root, "the file")
    for key, (k, _v) in top.items():
        if key not in _TOP_KEYS:
            r.warn(k, f"unknown key {key!r} ignored")
    white = []
    if "globalWhiteRemoteAddresses" in top:
        for text_, node in r.strings(top["globalWhiteRemoteAddresses"][1], "globalWhiteRemoteAddresses"):
            white.append(r.address(node, text_, "globalWhiteRemoteAddresses"))
    accounts: dict[str, PlainAccount] = {}
    if "accounts" in top:
        node = top["accounts"][1]
        if not (isinstance(node, yaml.ScalarNode) and node.tag == _NULL):
            if not isinstance(node, yaml.SequenceNode):
                r.fail(node, "accounts must be a list")
            for item in node.value:
                acc = r.account(item)
                if acc.access_key in accounts:
                    r.warn(item, f"accessKey {acc.access_key!r} is given again (line "
                                 f"{accounts[acc.access_key].line}): this later account is used")
                accounts[acc.access_key] = acc
    return PlainAclConfig(path, tuple(white), MappingProxyType(accounts), tuple(r.warnings))


def read_plain_acl(path: str | Path) -> bytes:
    """The file's bytes (AclConfigError when it cannot be read or is implausibly large)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise AclConfigError(str(p), None, f"cannot read the plain ACL file: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise AclConfigError(str(p), None, f"larger than {MAX_FILE_BYTES} bytes")
    return data


def load_plain_acl(path: str | Path) -> PlainAclConfig:
    return parse_plain_acl(read_plain_acl(path), path)
