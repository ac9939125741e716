"""SQL92 filtering in the broker (RocketMQ 4.4.0's broker/filter and the SQL92 branches of
ClientManageProcessor and PullMessageProcessor), over rmqstore.filter.

- `enablePropertyFilter=false` (the default): CHECK_CLIENT_CONFIG and pulls of an SQL92 subscription answer
  SYSTEM_ERROR "The broker does not support consumer to filter message by SQL92".
- CHECK_CLIENT_CONFIG (a push consumer's start): the selector compiled; SUBSCRIPTION_PARSE_FAILED (23) with
  RocketMQ's remark when it does not compile.
- Heartbeats register each group's SQL92 subscriptions (ConsumerFilterManager); a push consumer's pulls
  carry no selector and use the registered one: FILTER_DATA_NOT_EXIST (27) when there is none (its
  selector did not compile), FILTER_DATA_NOT_LATEST (28) when the pull's subVersion is newer.
- A pull carrying its selector (a pull consumer's): compiled per pull (cached per text); one that does not
  compile is refused with SUBSCRIPTION_PARSE_FAILED and the compile remark. RocketMQ 4.4.0 delivers every
  message then (its check is an `assert`); rmqstore refuses, as RocketMQ 5's POP does.
- `enableCalcFilterBitMap=true` with `enableConsumeQueueExt=true`: the dispatcher stores each message's bit
  map (every registered group whose selector is TRUE for it) in the consume queue extension, and pulls of
  those groups skip the messages whose bit map misses them without reading them.
"""
from __future__ import annotations

import logging

from ..filter import SQL92, SelectorError, compile_sql92, is_tag_type
from ..filter.consumer_filter import ConsumerFilterManager, ExpressionMessageFilter, build_filter_data
from ..remoting.codes import ResponseCode
from ..store.conf.config_file import as_object, config_dir, dumps_pretty, load_config_file, string_to_file

log = logging.getLogger(__name__)


def not_supported(expression_type: str) -> str:
    return f"The broker does not support consumer to filter message by {expression_type}"


def install(ctx) -> ConsumerFilterManager:
    """The broker's ConsumerFilterManager, loaded from and saved to config/consumerFilter.json (RocketMQ's
    file: a restarted broker serves a push consumer's pulls before its next heartbeat); with
    enableCalcFilterBitMap, the store's dispatcher computes bit maps from it (bitMapLengthConsumeQueueExt is
    then the bloom filter's bit count, as RocketMQ sets it)."""
    cfg = ctx.cfg
    filters = ConsumerFilterManager.for_config(cfg)
    path = getattr(ctx.store, "path", None)
    if path is not None:
        path = config_dir(path) / "consumerFilter.json"
        saved = load_config_file(path, lambda v: as_object(v, "consumerFilter.json"))
        try:
            filters.load_json(saved or {})
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("%s: not RocketMQ's consumerFilter.json layout (%s): starting without saved filter data "
                        "(heartbeats register it again)", path, e)
        filters.on_change = lambda: string_to_file(dumps_pretty(filters.to_json()), path)
    ctx.clients.on_group_gone = filters.unregister
    ext = getattr(ctx.store, "consume_queue_ext", None)
    if cfg.enable_calc_filter_bit_map and ext is not None:
        cfg.bit_map_length_consume_queue_ext = filters.bloom.m
        ext.bit_map_calculator = filters.bit_maps
    return filters


def check_client_config(ctx, sd: dict) -> tuple[int, str | None]:
    """ClientManageProcessor.checkClientConfig: (code, remark) for the body's subscriptionData."""
    et = sd.get("expressionType")
    if is_tag_type(et):
        return ResponseCode.SUCCESS, None
    if not ctx.cfg.enable_property_filter:
        return ResponseCode.SYSTEM_ERROR, not_supported(et)
    if et != SQL92:
        return ResponseCode.SUBSCRIPTION_PARSE_FAILED, None     # no FilterFactory for the type: RocketMQ's NPE
    try:
        compile_sql92(str(sd.get("subString") or ""))
    except SelectorError as e:
        return ResponseCode.SUBSCRIPTION_PARSE_FAILED, e.remark
    return ResponseCode.SUCCESS, None


def register_group(ctx, group: str, subscriptions) -> None:
    """A heartbeat's consumer data: its SQL92 subscriptions registered (ConsumerIdsChangeListener REGISTER)."""
    ctx.filters.register_group(group, subscriptions)


def pull_filter(ctx, group: str, topic: str, sd, with_subscription: bool, sub_version: int):
    """(ExpressionMessageFilter, None) for an SQL92 subscription of a pull, else (None, (code, remark))."""
    if not ctx.cfg.enable_property_filter:
        return None, (ResponseCode.SYSTEM_ERROR, not_supported(sd.expression_type))
    filters: ConsumerFilterManager = ctx.filters
    if with_subscription:
        try:
            data = build_filter_data(topic, group, sd.sub_string, sd.expression_type, sub_version)
        except SelectorError as e:
            log.warning("pull of %s by %s: selector %r does not compile: %s", topic, group, sd.sub_string, e.remark)
            return None, (ResponseCode.SUBSCRIPTION_PARSE_FAILED, e.remark)
        registered = filters.get(topic, group)
        if registered is not None and registered.expression == data.expression:
            data = registered       # the group's bit maps apply to the same selector
        return ExpressionMessageFilter(data.compiled, data, filters.bloom), None
    data = filters.get(topic, group)
    if data is None:
        return None, (ResponseCode.FILTER_DATA_NOT_EXIST,
                      "The broker's consumer filter data is not exist!Your expression may be wrong!")
    if data.client_version < sub_version:
        return None, (ResponseCode.FILTER_DATA_NOT_LATEST, "the consumer's consumer filter data not latest")
    return ExpressionMessageFilter(data.compiled, data, filters.bloom), None
