"""Permissions of plain ACL (RocketMQ's acl.common.Permission): the bits, their names in plain_acl.yml, the
check of a needed permission against an owned one, and the request codes that need an admin account."""
from __future__ import annotations

import enum

from ..remoting.codes import RETRY_GROUP_TOPIC_PREFIX, RequestCode


class Perm(enum.IntFlag):
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


# the same bits as plain ints (the checks run per request: IntFlag arithmetic costs a few microseconds)
DENY, ANY, PUB, SUB = 1, 2, 4, 8
_BY_NAME = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}
PERM_NAMES = tuple(_BY_NAME)

# Request codes only an `admin: true` account may send (Permission.ADMIN_CODE, the same in 4.4.0 and 5.x).
ADMIN_CODES = frozenset(map(int, (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG,
                                  RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                  RequestCode.DELETE_SUBSCRIPTIONGROUP)))

# The name server's writes: with ACL on, only a peer of globalWhiteRemoteAddresses or an admin account's
# signed request (RocketMQ 4.4.0's name server checks nothing).
NAMESRV_WRITE_CODES = frozenset(map(int, (RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER,
                                          RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG,
                                          RequestCode.DELETE_TOPIC_IN_NAMESRV, RequestCode.WIPE_WRITE_PERM_OF_BROKER)))


def parse_perm(text) -> int:
    """A permission as plain_acl.yml writes it; anything unknown (None, ANY, lower case) is DENY."""
    if text is None:
        return DENY
    return _BY_NAME.get(str(text).strip(), DENY)


def is_known_perm(text) -> bool:
    return text is None or str(text).strip() in _BY_NAME


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission: an owned DENY refuses; ANY needs PUB or SUB; else a common bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group: str) -> str:
    """The resource name a consumer group is checked as (%RETRY%group)."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def is_group(resource: str) -> bool:
    return resource.startswith(RETRY_GROUP_TOPIC_PREFIX)


def describe(resource: str) -> str:
    """PlainAccessResource.printStr: `group:G` for %RETRY%G, else `topic:T`."""
    if is_group(resource):
        return "group:" + resource[len(RETRY_GROUP_TOPIC_PREFIX):]
    return "topic:" + resource
