"""`rmqstore admin SUBCOMMAND`: mqadmin's commands, over the network, against `rmqstore serve` or a RocketMQ
4.x broker, through rmqstore.client.Admin. Names and options are mqadmin's (-n name server, -b broker
address, -t topic, -g group, -c cluster); so is the output, as far as it is a table.

    rmqstore admin clusterList -n 127.0.0.1:9876
    rmqstore admin topicStatus -n 127.0.0.1:9876 -t TopicA
    rmqstore admin consumerProgress -n 127.0.0.1:9876 -g my_group

Against a broker with plain ACL every request is signed with --accessKey/--secretKey, else
$ROCKETMQ_ACCESS_KEY/$ROCKETMQ_SECRET_KEY, else accessKey/secretKey of $ROCKETMQ_HOME/conf/tools.yml
(mqadmin's file).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Callable

EXIT_OK, EXIT_ERROR = 0, 2


def _ts(ms: int) -> str:
    """UtilAll.timeMillisToHumanString2."""
    if ms <= 0:
        return "N/A"
    t = time.localtime(ms / 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", t) + f",{ms % 1000:03d}"


def _first_figure(rates: str | None) -> float:
    parts = (rates or "").split(" ")
    try:
        return float(parts[0]) if parts and parts[0] else 0.0
    except ValueError:
        return 0.0


# --- the commands (each: fn(admin, args, out)) ----------------------------------------------------------
def cluster_list(admin, args, out) -> int:
    info = admin.cluster_info()
    out.write("%-16s  %-22s  %-4s  %-22s %-16s %19s %19s %10s %5s %6s\n" % (
        "#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)",
        "#PCWait(ms)", "#Hour", "#SPACE"))
    for cluster, names in sorted((info.get("clusterAddrTable") or {}).items()):
        for name in sorted(names):
            bd = (info.get("brokerAddrTable") or {}).get(name) or {}
            for bid, addr in sorted((int(k), v) for k, v in (bd.get("brokerAddrs") or {}).items()):
                kv = admin.broker_runtime_stats(addr)
                early = int(kv.get("earliestMessageTimeStamp") or 0)
                hours = (time.time() * 1000 - early) / 3600_000 if early > 0 else 0.0
                out.write("%-16s  %-22s  %-4s  %-22s %-16s %19s %19s %10s %5s %6s\n" % (
                    cluster, name, bid, addr, kv.get("brokerVersionDesc", ""),
                    "%9.2f(%s,%sms)" % (_first_figure(kv.get("putTps")), kv.get("sendThreadPoolQueueSize"),
                                         kv.get("sendThreadPoolQueueHeadWaitTimeMills")),
                    "%9.2f(%s,%sms)" % (_first_figure(kv.get("getTransferedTps")), kv.get("pullThreadPoolQueueSize"),
                                         kv.get("pullThreadPoolQueueHeadWaitTimeMills")),
                    kv.get("pageCacheLockTimeMills"), "%2.2f" % hours,
                    "%.4f" % float(kv.get("commitLogDiskRatio") or 0)))
    return EXIT_OK


def topic_list(admin, args, out) -> int:
    for t in admin.topic_list():
        out.write(t + "\n")
    return EXIT_OK


def topic_route(admin, args, out) -> int:
    route = admin.topic_route(args.topic)
    if route is None:
        print(f"No topic route info in name server for the topic: {args.topic}", file=sys.stderr)
        return EXIT_ERROR
    out.write(json.dumps(route, indent=4, sort_keys=True) + "\n")
    return EXIT_OK


def topic_status(admin, args, out) -> int:
    stats = admin.topic_stats(args.topic)
    out.write("%-32s  %-4s  %-20s  %-20s    %s\n" % ("#Broker Name", "#QID", "#Min Offset", "#Max Offset",
                                                    "#Last Updated"))
    for mq in sorted(stats, key=lambda q: (q.broker_name, q.queue_id)):
        o = stats[mq]
        out.write("%-32s  %-4d  %-20d  %-20d    %s\n" % (mq.broker_name, mq.queue_id, o["minOffset"], o["maxOffset"],
                                                        _ts(o["lastUpdateTimestamp"]) if o["lastUpdateTimestamp"] else ""))
    return EXIT_OK


def broker_status(admin, args, out) -> int:
    for k, v in sorted(admin.broker_runtime_stats(args.broker_addr).items()):
        out.write("%-32s: %s\n" % (k, v))
    return EXIT_OK


def get_broker_config(admin, args, out) -> int:
    addrs = [args.broker_addr] if args.broker_addr else admin.master_addrs(args.cluster)
    for addr in addrs:
        out.write(f"============{addr}============\n")
        for k, v in sorted(admin.broker_config(addr).items()):
            out.write("%-50s=  %s\n" % (k, v))
        out.write("\n")
    return EXIT_OK


def consumer_progress(admin, args, out) -> int:
    cs = admin.consume_stats(args.group, args.topic)
    out.write("%-32s  %-32s  %-4s  %-20s  %-20s  %-20s %-20s  %s\n" % (
        "#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Client IP", "#Diff", "#LastTime"))
    diff_total = 0
    for mq in sorted(cs["offsetTable"], key=lambda q: (q.topic, q.broker_name, q.queue_id)):
        o = cs["offsetTable"][mq]
        diff = o["brokerOffset"] - o["consumerOffset"]
        diff_total += diff
        out.write("%-32s  %-32s  %-4d  %-20d  %-20d  %-20s %-20d  %s\n" % (
            mq.topic, mq.broker_name, mq.queue_id, o["brokerOffset"], o["consumerOffset"], "N/A", diff,
            _ts(o["lastTimestamp"])))
    out.write("\nConsume TPS: %.2f\nDiff Total: %d\n" % (cs["consumeTps"], diff_total))
    return EXIT_OK


def consumer_connection(admin, args, out) -> int:
    cc = admin.consumer_connection(args.group)
    for i, c in enumerate(cc["connectionSet"], 1):
        out.write("%03d  %-32s %-22s %-8s %s\n" % (i, c["clientId"], c["clientAddr"], c["language"], c["version"]))
    out.write("\nBelow is subscription:\n")
    for i, (topic, sd) in enumerate(sorted(cc["subscriptionTable"].items()), 1):
        out.write("%03d  Topic: %-40s SubExpression: %s\n" % (i, topic, sd.get("subString")))
    out.write("\nConsumeType: %s\nMessageModel: %s\nConsumeFromWhere: %s\n" % (
        cc["consumeType"], cc["messageModel"], cc["consumeFromWhere"]))
    return EXIT_OK


def format_running_info(info: dict) -> str:
    """ConsumerRunningInfo.formatString."""
    lines = ["#Consumer Properties#"]
    lines += ["%-40s: %s" % (k, v) for k, v in sorted((info.get("properties") or {}).items())]
    lines += ["", "", "#Consumer Subscription#"]
    for i, sd in enumerate(info.get("subscriptionSet") or [], 1):
        lines.append("%03d Topic: %-40s ClassFilter: %-8s SubExpression: %s" % (
            i, sd.get("topic"), str(bool(sd.get("classFilterMode"))).lower(), sd.get("subString")))
    mqs = sorted((info.get("mqTable") or {}).items(), key=lambda kv: (kv[0]["topic"], kv[0]["brokerName"],
                                                                     kv[0]["queueId"]))
    lines += ["", "", "#Consumer Offset#", "%-32s  %-32s  %-4s  %-20s" % ("#Topic", "#Broker Name", "#QID",
                                                                          "#Consumer Offset")]
    lines += ["%-32s  %-32s  %-4d  %-20d" % (q["topic"], q["brokerName"], q["queueId"], p["commitOffset"])
              for q, p in mqs]
    lines += ["", "", "#Consumer MQ Detail#", "%-32s  %-32s  %-4s  %-20s" % ("#Topic", "#Broker Name", "#QID",
                                                                             "#ProcessQueueInfo")]
    lines += ["%-32s  %-32s  %-4d  ProcessQueueInfo [%s]" % (
        q["topic"], q["brokerName"], q["queueId"], ", ".join(f"{k}={v}" for k, v in p.items())) for q, p in mqs]
    lines += ["", "", "#Consumer RT&TPS#", "%-32s  %14s %14s %14s %14s %18s %25s" % (
        "#Topic", "#Pull RT", "#Pull TPS", "#Consume RT", "#ConsumeOK TPS", "#ConsumeFailed TPS",
        "#ConsumeFailedMsgsInHour")]
    for topic, st in sorted((info.get("statusTable") or {}).items()):
        lines.append("%-32s  %14.2f %14.2f %14.2f %14.2f %18.2f %25d" % (
            topic, st["pullRT"], st["pullTPS"], st["consumeRT"], st["consumeOKTPS"], st["consumeFailedTPS"],
            st["consumeFailedMsgs"]))
    return "\n".join(lines) + "\n"


def consumer_status(admin, args, out) -> int:
    """ConsumerStatusSubCommand: with -i one client's running info; without, a line per online client."""
    if args.client_id:
        out.write(format_running_info(admin.consumer_running_info(args.group, args.client_id)))
        return EXIT_OK
    cc = admin.consumer_connection(args.group)
    infos = {}
    for i, c in enumerate(sorted(cc["connectionSet"], key=lambda c: c["clientId"]), 1):
        info = infos[c["clientId"]] = admin.consumer_running_info(args.group, c["clientId"])
        out.write("%03d  %-40s %-20s %s\n" % (i, c["clientId"], info["properties"].get("PROP_CLIENT_VERSION", ""),
                                                 f"{len(info.get('mqTable') or {})} queues"))
    subs = {json.dumps(sorted(json.dumps(sd, sort_keys=True) for sd in (i.get("subscriptionSet") or [])))
            for i in infos.values()}
    if len(subs) == 1:
        out.write("\n\nSame subscription in the same group of consumer\n\nRebalance OK\n")
    elif subs:
        out.write("\n\nWARN: Different subscription in the same group of consumer!!!")
    return EXIT_OK


SUBSCRIPTION_GROUP_FIELDS = ("groupName", "consumeEnable", "consumeFromMinEnable", "consumeBroadcastEnable",
                             "retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly",
                             "notifyConsumerIdsChangedEnable")     # SubscriptionGroupConfig's, in its order


def get_consumer_config(admin, args, out) -> int:
    """GetConsumerConfigSubCommand (mqadmin after 4.4.0): the group's SubscriptionGroupConfig on each broker."""
    info = admin.cluster_info()
    cluster_of = {b: c for c, names in (info.get("clusterAddrTable") or {}).items() for b in names}
    for name, bd in sorted((info.get("brokerAddrTable") or {}).items()):
        addrs = {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
        if not addrs:
            continue
        table = admin.subscription_groups(addrs.get(0, addrs[min(addrs)])).get("subscriptionGroupTable") or {}
        sgc = table.get(args.group)
        if sgc is None:
            continue
        out.write("=============================%s:%s=============================\n" % (cluster_of.get(name, ""), name))
        for f in SUBSCRIPTION_GROUP_FIELDS:
            v = sgc.get(f, "")
            out.write("%-40s=  %s\n" % (f, str(v).lower() if isinstance(v, bool) else v))
    return EXIT_OK


def clean_expired_cq(admin, args, out) -> int:
    ok = admin.clean_expired_consume_queue(args.broker_addr, args.cluster)
    out.write("success" if ok else "false")
    return EXIT_OK


def clean_unused_topic(admin, args, out) -> int:
    ok = admin.clean_unused_topic(args.broker_addr, args.cluster)
    out.write("success" if ok else "false")
    return EXIT_OK


def producer_connection(admin, args, out) -> int:
    for i, c in enumerate(admin.producer_connection(args.group, args.topic)["connectionSet"], 1):
        out.write("%04d  %-32s %-22s %-8s %s\n" % (i, c["clientId"], c["clientAddr"], c["language"], c["version"]))
    return EXIT_OK


def _sum_24h(bsd: dict) -> int:
    """StatsAllSubCommand.compute24HourSum."""
    for k in ("statsDay", "statsHour", "statsMinute"):
        if bsd[k]["sum"]:
            return bsd[k]["sum"]
    return 0


def _topic_figures(admin, addrs: list[str], name: str, key: str) -> tuple[float, int]:
    tps, day = 0.0, 0
    for addr in addrs:
        try:
            bsd = admin.view_broker_stats(addr, name, key)
        except Exception:        # no traffic yet: the broker has no such stats item (statsAll skips it)
            continue
        tps += bsd["statsMinute"]["tps"]
        day += _sum_24h(bsd)
    return tps, day


def stats_all(admin, args, out) -> int:
    out.write("%-32s  %-32s %12s %11s %11s %14s %14s\n" % ("#Topic", "#Consumer Group", "#Accumulation", "#InTPS",
                                                          "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour"))
    topics = [args.topic] if args.topic else admin.topic_list()
    for topic in topics:
        if topic.startswith("%RETRY%") or topic.startswith("%DLQ%"):
            continue
        try:
            addrs = admin._topic_masters(topic)
        except Exception:
            continue
        in_tps, in_day = _topic_figures(admin, addrs, "TOPIC_PUT_NUMS", topic)
        groups = sorted(admin.query_topic_consume_by_who(topic))
        if not groups and (not args.active or in_day > 0):
            out.write("%-32s  %-32s %12d %11.2f %11s %14d %14s\n" % (topic, "", 0, in_tps, "", in_day, "NO_CONSUMER"))
        for group in groups:
            out_tps, out_day = _topic_figures(admin, addrs, "GROUP_GET_NUMS", f"{topic}@{group}")
            table = admin.consume_stats(group, topic)["offsetTable"]
            acc = max(0, sum(o["brokerOffset"] - o["consumerOffset"] for o in table.values()))
            if not args.active or in_day > 0 or out_day > 0:
                out.write("%-32s  %-32s %12d %11.2f %11.2f %14d %14d\n" % (topic, group, acc, in_tps, out_tps,
                                                                          in_day, out_day))
    return EXIT_OK


def broker_consume_stats(admin, args, out) -> int:
    bcs = admin.broker_consume_stats(args.broker_addr, args.order)
    out.write("%-32s  %-32s  %-32s  %-4s  %-20s  %-20s  %-20s  %s\n" % (
        "#Topic", "#Group", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime"))
    from ..client.admin import _mq
    for entry in bcs.get("consumeStatsList") or []:
        for group, stats in entry.items():
            for cs in stats:
                for key, o in sorted(cs["offsetTable"].items(), key=lambda kv: (kv[0]["topic"], kv[0]["queueId"])):
                    mq = _mq(key)
                    out.write("%-32s  %-32s  %-32s  %-4d  %-20d  %-20d  %-20d  %s\n" % (
                        mq.topic, group, mq.broker_name, mq.queue_id, o["brokerOffset"], o["consumerOffset"],
                        o["brokerOffset"] - o["consumerOffset"], _ts(o["lastTimestamp"])))
    out.write("\nDiff Total: %d\n" % bcs.get("totalDiff", 0))
    return EXIT_OK


def update_topic(admin, args, out) -> int:
    admin.create_topic(args.topic, args.write_queue_nums, args.perm, read_queue_nums=args.read_queue_nums,
                       cluster=args.cluster, order=args.order, broker_addr=args.broker_addr)
    out.write(f"create topic to {args.broker_addr or args.cluster or 'every master'} success.\n")
    return EXIT_OK


def delete_topic(admin, args, out) -> int:
    admin.delete_topic(args.topic, args.cluster)
    out.write(f"delete topic [{args.topic}] from cluster [{args.cluster}] success.\n")
    return EXIT_OK


def update_sub_group(admin, args, out) -> int:
    for addr in [args.broker_addr] if args.broker_addr else admin.master_addrs(args.cluster):
        admin.create_subscription_group(addr, args.group, retryQueueNums=args.retry_queue_nums,
                                        retryMaxTimes=args.retry_max_times)
        out.write(f"create subscription group to {addr} success.\n")
    return EXIT_OK


def delete_sub_group(admin, args, out) -> int:
    for addr in [args.broker_addr] if args.broker_addr else admin.master_addrs(args.cluster):
        admin.delete_subscription_group(addr, args.group)
        out.write(f"delete subscription group [{args.group}] from broker [{addr}] success.\n")
    return EXIT_OK


def _print_message(m, out) -> None:
    for k, v in (("OffsetID", m.offset_msg_id), ("Topic", m.topic), ("Tags", f"[{m.tags}]"), ("Keys", f"[{' '.join(m.keys)}]"),
                 ("Queue ID", m.queue_id), ("Queue Offset", m.queue_offset), ("CommitLog Offset", m.commit_log_offset),
                 ("Reconsume Times", m.reconsume_times), ("Born Timestamp", _ts(m.born_timestamp)),
                 ("Store Timestamp", _ts(m.store_timestamp)), ("Born Host", m.born_host), ("Store Host", m.store_host),
                 ("System Flag", m.sys_flag), ("Properties", m.properties)):
        out.write("%-20s %s\n" % (k + ":", v))
    out.write("%-20s %s\n" % ("Message Body:", m.body.decode("utf-8", "replace")))


def query_msg_by_key(admin, args, out) -> int:
    out.write("%-50s %4s %40s\n" % ("#Message ID", "#QID", "#Offset"))
    for m in admin.query_message(args.topic, args.key, 64):
        out.write("%-50s %4d %40d\n" % (m.msg_id, m.queue_id, m.queue_offset))
    return EXIT_OK


def query_msg_by_id(admin, args, out) -> int:
    _print_message(admin.view_message(args.msg_id), out)
    return EXIT_OK


def query_msg_by_unique_key(admin, args, out) -> int:
    m = admin.query_message_by_uniq_key(args.topic, args.msg_id)
    if m is None:
        print(f"no message of topic {args.topic} with unique key {args.msg_id}", file=sys.stderr)
        return EXIT_ERROR
    _print_message(m, out)
    return EXIT_OK


def reset_offset_by_time(admin, args, out) -> int:
    ts = -1 if args.timestamp == "now" else int(args.timestamp)
    table = admin.reset_offset_by_time(args.group, args.topic, ts, args.force)
    out.write("%-40s  %-40s  %-40s\n" % ("#brokerName", "#queueId", "#offset"))
    for mq in sorted(table, key=lambda q: (q.broker_name, q.queue_id)):
        out.write("%-40s  %-40d  %-40d\n" % (mq.broker_name, mq.queue_id, table[mq]))
    return EXIT_OK


def update_broker_config(admin, args, out) -> int:
    for addr in [args.broker_addr] if args.broker_addr else admin.master_addrs(args.cluster):
        admin.update_broker_config(addr, {args.key: args.value})
        out.write(f"update broker config success, {addr}\n")
    return EXIT_OK


# --- the table ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubCommand:
    name: str
    help: str
    run: Callable
    options: tuple[str, ...]          # which of the shared options it takes; a trailing ! marks required


SUBCOMMANDS = (
    SubCommand("clusterList", "list the clusters' brokers with their TPS, version and disk use", cluster_list, ()),
    SubCommand("topicList", "list the topics the name server knows", topic_list, ()),
    SubCommand("topicRoute", "print a topic's route (brokers, queues)", topic_route, ("topic!",)),
    SubCommand("topicStatus", "print each queue's min and max offset and last update time", topic_status,
               ("topic!",)),
    SubCommand("brokerStatus", "print a broker's runtime statistics", broker_status, ("broker_addr!",)),
    SubCommand("getBrokerConfig", "print a broker's configuration", get_broker_config, ("broker_addr", "cluster")),
    SubCommand("consumerProgress", "print a consumer group's offsets and lag per queue", consumer_progress,
               ("group!", "topic")),
    SubCommand("consumerConnection", "print a consumer group's connections and subscriptions",
               consumer_connection, ("group!",)),
    SubCommand("consumerStatus", "ask a group's online clients for their running info (through the broker)",
               consumer_status, ("group!", "client_id")),
    SubCommand("getConsumerConfig", "print a group's subscription group config on each broker",
               get_consumer_config, ("group!",)),
    SubCommand("cleanExpiredCQ", "remove consume queues whose messages all left the commitlog", clean_expired_cq,
               ("broker_addr", "cluster")),
    SubCommand("cleanUnusedTopic", "remove consume queues of topics the broker has no config for",
               clean_unused_topic, ("broker_addr", "cluster")),
    SubCommand("producerConnection", "print a producer group's connections", producer_connection,
               ("group!", "topic!")),
    SubCommand("statsAll", "per topic and consumer group: accumulation, TPS, messages in 24 h", stats_all,
               ("topic", "active")),
    SubCommand("brokerConsumeStats", "every group's offsets and lag on a broker", broker_consume_stats,
               ("broker_addr!", "order")),
    SubCommand("updateTopic", "create or update a topic", update_topic,
               ("topic!", "broker_addr", "cluster", "read_queue_nums", "write_queue_nums", "perm", "order")),
    SubCommand("deleteTopic", "delete a topic from the brokers and the name server", delete_topic,
               ("topic!", "cluster")),
    SubCommand("updateSubGroup", "create or update a subscription group", update_sub_group,
               ("group!", "broker_addr", "cluster", "retry_queue_nums", "retry_max_times")),
    SubCommand("deleteSubGroup", "delete a subscription group", delete_sub_group, ("group!", "broker_addr", "cluster")),
    SubCommand("resetOffsetByTime", "reset a group's offsets of a topic to a time (ms, or now)", reset_offset_by_time,
               ("group!", "topic!", "timestamp!", "force")),
    SubCommand("updateBrokerConfig", "change a broker setting at run time", update_broker_config,
               ("key!", "value!", "broker_addr", "cluster")),
    SubCommand("queryMsgByKey", "find messages by key", query_msg_by_key, ("topic!", "key!")),
    SubCommand("queryMsgById", "print a message by its offset message id", query_msg_by_id, ("msg_id!",)),
    SubCommand("queryMsgByUniqueKey", "print a message by its unique key (the client's msgId)",
               query_msg_by_unique_key, ("msg_id!", "topic!")),
)

_OPTIONS = {
    "topic": (("-t", "--topic"), {"help": "topic name"}),
    "group": (("-g", "--group"), {"dest": "group", "help": "consumer or producer group"}),
    "broker_addr": (("-b", "--brokerAddr"), {"dest": "broker_addr", "help": "broker address host:port"}),
    "cluster": (("-c", "--clusterName"), {"dest": "cluster", "help": "cluster name"}),
    "key": (("-k", "--key"), {"dest": "key", "help": "message key (queryMsgByKey) or config key"}),
    "value": (("-v", "--value"), {"dest": "value", "help": "config value"}),
    "timestamp": (("-s", "--timestamp"), {"dest": "timestamp", "help": "ms since the epoch, or now"}),
    "force": (("-f", "--force"), {"type": lambda s: s.lower() == "true", "default": True}),
    "client_id": (("-i", "--clientId"), {"dest": "client_id", "help": "the consumer's client id"}),
    "msg_id": (("-i", "--msgId"), {"dest": "msg_id", "help": "message id"}),
    "read_queue_nums": (("-r", "--readQueueNums"), {"dest": "read_queue_nums", "type": int, "default": 8}),
    "write_queue_nums": (("-w", "--writeQueueNums"), {"dest": "write_queue_nums", "type": int, "default": 8}),
    "perm": (("-p", "--perm"), {"type": int, "default": 6, "help": "permission (2 write, 4 read, 6 both)"}),
    "order": (("-o", "--order"), {"type": lambda s: s.lower() == "true", "default": False}),
    "active": (("-a", "--activeTopic"), {"dest": "active", "action": "store_true", "help": "active topics only"}),
    "retry_queue_nums": (("-q", "--retryQueueNums"), {"dest": "retry_queue_nums", "type": int, "default": 1}),
    "retry_max_times": (("-m", "--retryMaxTimes"), {"dest": "retry_max_times", "type": int, "default": 16}),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="admin_command", metavar="SUBCOMMAND")
    sub.required = True
    for sc in SUBCOMMANDS:
        sp = sub.add_parser(sc.name, help=sc.help, description=sc.help)
        sp.add_argument("-n", "--namesrvAddr", dest="namesrv", default="127.0.0.1:9876",
                        help="name server address host:port (default 127.0.0.1:9876)")
        sp.add_argument("--accessKey", dest="access_key", help="plain ACL access key (or $ROCKETMQ_ACCESS_KEY)")
        sp.add_argument("--secretKey", dest="secret_key", help="plain ACL secret key (or $ROCKETMQ_SECRET_KEY)")
        for opt in sc.options:
            name = opt.rstrip("!")
            flags, kw = _OPTIONS[name]
            sp.add_argument(*flags, required=opt.endswith("!"), **kw)
        sp.set_defaults(_admin=sc)


def run(args: argparse.Namespace, cfg=None, out=None) -> int:
    from ..acl import tool_credentials
    from ..client import Admin, MQClientError
    sc: SubCommand = args._admin
    for name in ("topic", "group", "broker_addr", "cluster", "order", "active", "client_id", "access_key",
                 "secret_key"):
        if not hasattr(args, name):
            setattr(args, name, None)
    try:
        credentials = tool_credentials(args.access_key, args.secret_key)
    except ValueError as e:
        print(f"rmqstore admin {sc.name}: {e}", file=sys.stderr)
        return EXIT_ERROR
    admin = Admin(args.namesrv, credentials=credentials).start()
    try:
        return sc.run(admin, args, out or sys.stdout)
    except MQClientError as e:
        print(f"rmqstore admin {sc.name}: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        admin.shutdown()
