"""The `topics` command's client subcommands (docs/CLI.md): produce, consume, watch,
topics, routers and queues, all through :class:`topics.client.Client`.

:func:`add_subcommands` adds them to the `topics` argparse parser (src/topics/cli.py)
and :func:`run` carries a parsed command out. Every command takes `--url` and
`--token` (else ``$TOPICS_URL`` / ``$TOPICS_TOKEN``, else http://127.0.0.1:4000
and no token). A failure prints one line on stderr and exits 1; a usage error
exits 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import IO, Any

from topics.client import _core
from topics.client.errors import ConnectionFailed, TopicsError
from topics.client.models import (
    CaughtUp,
    Event,
    Job,
    Record,
    Tombstone,
    TopicDeleted,
)
from topics.client.sync import Client

__all__ = ["add_subcommands", "run", "CLIENT_COMMANDS", "EXIT_OK", "EXIT_FAIL", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, Client], int]


class UsageError(Exception):
    """A command line that cannot be carried out (exit 2)."""


class BadInput(Exception):
    """Input (stdin) that cannot be sent (exit 1)."""


class Refused(Exception):
    """A command the CLI will not carry out as given, e.g. one that would replace an
    existing topic's config without `--replace` (exit 1)."""


# -- output ------------------------------------------------------------------------------


def _out() -> IO[str]:
    return sys.stdout


def _line(text: str) -> None:
    out = _out()
    out.write(text + "\n")
    out.flush()


def _json_line(obj: Any) -> None:
    _line(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def _json_pretty(obj: Any) -> None:
    _line(json.dumps(obj, ensure_ascii=False, indent=2))


def _note(text: str) -> None:
    print(f"topics: {text}", file=sys.stderr, flush=True)


def iso_ms(ts: int) -> str:
    """`ts` (ms since the epoch) as UTC ISO 8601 with milliseconds and a `Z`."""
    dt = datetime.fromtimestamp(ts / 1000, UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _data_text(data: Any) -> str:
    if isinstance(data, str):
        return data
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def record_text(rec: Record, *, with_topic: bool = False) -> str:
    """One record in the text format: ``[topic ]#seq time [tag=..] [node=..] data``."""
    parts = [f"{rec.topic} #{rec.seq}" if with_topic else f"#{rec.seq}", iso_ms(rec.ts)]
    if rec.tag is not None:
        parts.append(f"tag={rec.tag}")
    if rec.node is not None:
        parts.append(f"node={rec.node}")
    parts.append(_data_text(rec.data))
    if rec.meta is not None:
        parts.append(f"meta={_data_text(rec.meta)}")
    return " ".join(parts)


def tombstone_text(t: Tombstone, *, with_topic: bool = False) -> str:
    """A tombstone in the text format: one line saying which seqs are gone and why."""
    n = t.missed
    where = f"{t.topic}: " if with_topic else ""
    return (
        f"--- {where}tombstone: {n} record{'s' * (n != 1)} lost, seqs {t.gap_from}-{t.gap_to} "
        f"({t.reason}); reading on from {t.earliest_seq} ---"
    )


def event_json(
    ev: Record | Tombstone | TopicDeleted, *, with_topic: bool = False
) -> dict[str, Any]:
    """An event as a JSON line: a record object, ``{"tombstone": {...}}``, or
    ``{"deleted": true}``; with `with_topic` each carries ``"topic"`` first."""
    head: dict[str, Any] = {"topic": ev.topic} if with_topic else {}
    if isinstance(ev, Record):
        return {**head, **ev.to_json()}
    if isinstance(ev, Tombstone):
        return {**head, "tombstone": ev.to_json()}
    return {**head, "deleted": True}


def _print_event(ev: Event, fmt: str, with_topic: bool) -> None:
    if isinstance(ev, CaughtUp):
        return
    if fmt == "json":
        _json_line(event_json(ev, with_topic=with_topic))
    elif isinstance(ev, Record):
        _line(record_text(ev, with_topic=with_topic))
    elif isinstance(ev, Tombstone):
        _line(tombstone_text(ev, with_topic=with_topic))
    else:
        _line(f"--- {ev.topic}: topic deleted ---")


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        _line("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


# -- argument helpers -----------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A `key=value` value: JSON when it parses (numbers, true/false, null, quoted
    strings, objects), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_pairs(pairs: list[str], *, known: tuple[str, ...] | None = None) -> dict[str, Any]:
    """`key=value` arguments as a dict (values by :func:`parse_value`)."""
    out: dict[str, Any] = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise UsageError(f"{p!r} is not key=value")
        if known is not None and key not in known:
            raise UsageError(f"unknown config field {key!r} (known: {', '.join(known)})")
        out[key] = parse_value(value)
    return out


def _nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return v


def _positive(text: str) -> int:
    v = _nonneg(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return v


def _seq_arg(text: str) -> tuple[int, str]:
    """`SEQ` or `SEQ:LEASE_ID` of the queue commands."""
    seq, _, lease = text.partition(":")
    try:
        return int(seq), lease
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not SEQ or SEQ:LEASE_ID") from None


# -- produce --------------------------------------------------------------------------------


def _stdin_lines(stream: IO[str], linger_s: float) -> Iterator[str | None]:
    """Lines of `stream` without their ends; None after `linger_s` without input (so
    a slow writer's records go out without waiting for a full batch)."""
    try:
        fd = stream.fileno()
        select.select([fd], [], [], 0)
    except (OSError, ValueError, AttributeError, TypeError):
        for line in stream:
            yield line.rstrip("\r\n")
        return
    buf = b""
    while True:
        ready, _w, _x = select.select([fd], [], [], linger_s if linger_s > 0 else None)
        if not ready:
            yield None
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            yield raw.decode("utf-8").rstrip("\r")
    if buf:
        yield buf.decode("utf-8").rstrip("\r")


def _record_of(line: str, as_json: bool, n: int) -> dict[str, Any]:
    if not as_json:
        return {"data": line}
    try:
        value = json.loads(line)
    except ValueError as e:
        raise BadInput(f"stdin line {n} is not JSON ({e})") from None
    return _core.record_body(value)


def cmd_produce(args: argparse.Namespace, client: Client) -> int:
    batch: list[dict[str, Any]] = []
    sent = batches = 0
    first: int | None = None
    last: int | None = None
    create = False if args.no_create else None

    def flush() -> None:
        nonlocal sent, batches, first, last
        if not batch:
            return
        r = client.append(args.topic, batch, node=args.node, create=create)
        sent += r.count
        batches += 1
        first = r.first_seq if first is None else first
        last = r.last_seq
        batch.clear()

    def summary() -> str:
        seqs = (
            "" if first is None else f": seq {first}" if first == last else f": seqs {first}-{last}"
        )
        return (
            f"produced {sent} record{'s' * (sent != 1)} to {args.topic}{seqs} "
            f"({batches} batch{'es' * (batches != 1)})"
        )

    n = 0
    try:
        for line in _stdin_lines(sys.stdin, args.linger_ms / 1000):
            if line is None:
                flush()
                continue
            n += 1
            if not line.strip():
                continue
            try:
                rec = _record_of(line, args.json, n)
            except BadInput:
                flush()  # everything before the bad line goes out
                raise
            if args.tag is not None and "tag" not in rec:
                rec["tag"] = args.tag
            batch.append(rec)
            if len(batch) >= args.batch:
                flush()
        flush()
    except UnicodeDecodeError:
        if sent and not args.quiet:
            _note(f"{summary()} before the error")
        raise BadInput(f"stdin line {n + 1} is not UTF-8") from None
    except (BadInput, TopicsError):
        if sent and not args.quiet:
            _note(f"{summary()} before the error")
        raise
    if not args.quiet:
        _line(summary())
    return EXIT_OK


# -- consume and watch ------------------------------------------------------------------------


def _start(args: argparse.Namespace) -> int | None:
    """The cursor to start from, or None for "the head" (only new records)."""
    if args.from_seq is not None:
        return int(args.from_seq)
    if args.from_beginning:
        return 0
    return None


def _positions(cursors: dict[str, int]) -> str:
    """`a at 3, b at 7`: where each topic stopped, for `--from-seq` to carry on."""
    return ", ".join(f"{t} at {s}" for t, s in sorted(cursors.items()))


def _ended(watch_ended_by: str | None, cursors: dict[str, int]) -> None:
    if watch_ended_by == "shutdown":
        _note(f"the server is shutting down; stopped ({_positions(cursors)})")


def cmd_consume(args: argparse.Namespace, client: Client) -> int:
    start = _start(args)
    fmt = args.format
    if not args.follow:
        reader = client.read(
            args.topic,
            0 if start is None else start,
            node=args.node,
            include_tags=not args.no_tags,
            include_meta=not args.no_meta,
            max_records=args.limit,
        )
        for ev in reader:
            _print_event(ev, fmt, False)
        return EXIT_OK
    return _follow(client, [args.topic], start, args, with_topic=False)


def cmd_watch(args: argparse.Namespace, client: Client) -> int:
    return _follow(client, list(dict.fromkeys(args.topics)), _start(args), args, with_topic=True)


def _follow(
    client: Client,
    topics: list[str],
    start: int | None,
    args: argparse.Namespace,
    *,
    with_topic: bool,
) -> int:
    watch = client.watch(
        topics,
        0 if start is None else start,
        tail=start is None,
        node=args.node,
        include_tags=not args.no_tags,
        include_meta=not args.no_meta,
        reconnect_timeout=None,
    )
    records = 0
    try:
        with watch:
            for ev in watch:
                _print_event(ev, args.format, with_topic)
                if isinstance(ev, Record):
                    records += 1
                    if args.limit is not None and records >= args.limit:
                        return EXIT_OK
    except KeyboardInterrupt:
        if watch.wid is not None:  # started: the cursors are real ones
            _note(f"interrupted; stopped ({_positions(watch.cursors)})")
        raise
    _ended(watch.ended_by, watch.cursors)
    return EXIT_OK


# -- topics ---------------------------------------------------------------------------------


def cmd_topic_ls(args: argparse.Namespace, client: Client) -> int:
    topics = list(client.list_topics(args.prefix, page_size=1000))
    if args.json:
        for t in topics:
            _json_line(asdict(t))
        return EXIT_OK
    _table(
        ["TOPIC", "HEAD", "EARLIEST", "COUNT", "BYTES", "DURABLE"],
        [
            [t.topic, str(t.head_seq), str(t.earliest_seq), str(t.count), str(t.bytes)]
            + ["yes" if t.durable else "no"]
            for t in topics
        ],
    )
    return EXIT_OK


def cmd_topic_get(args: argparse.Namespace, client: Client) -> int:
    _json_pretty(client.get_topic(args.topic, touch=False).raw)
    return EXIT_OK


def _config_args(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if args.config:
        try:
            parsed = json.loads(args.config)
        except ValueError as e:
            raise UsageError(f"--config is not JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise UsageError("--config must be a JSON object")
        unknown = sorted(set(parsed) - set(_core.CONFIG_FIELDS))
        if unknown:
            raise UsageError(f"unknown config field(s) in --config: {', '.join(unknown)}")
        config.update(parsed)
    config.update(parse_pairs(args.pairs, known=_core.CONFIG_FIELDS))
    return config


def cmd_topic_create(args: argparse.Namespace, client: Client) -> int:
    config = _config_args(args)
    if not args.replace and client.topic_exists(args.topic):
        raise Refused(
            f"topic {args.topic!r} already exists (change its config with "
            f"`topics config {args.topic} key=value`, or pass --replace)"
        )
    r = client.put_topic(args.topic, config)
    _json_pretty({"topic": r.topic, "created": r.created, "config": r.config.to_dict()})
    return EXIT_OK


def cmd_topic_config(args: argparse.Namespace, client: Client) -> int:
    changes = parse_pairs(args.pairs, known=_core.CONFIG_FIELDS)
    if not changes:
        _json_pretty(client.get_topic(args.topic, touch=False).config.to_dict())
        return EXIT_OK
    r = client.update_config(args.topic, **changes)
    _json_pretty(r.config.to_dict())
    return EXIT_OK


def cmd_topic_delete(args: argparse.Namespace, client: Client) -> int:
    r = client.delete_topic(args.topic, if_empty=args.if_empty)
    _json_pretty(asdict(r))
    if not r.deleted:
        _note(f"there was no topic {args.topic!r}")
    return EXIT_OK


# -- routers --------------------------------------------------------------------------------


def cmd_router_ls(args: argparse.Namespace, client: Client) -> int:
    routers = list(
        client.list_routers(args.prefix, source=args.source, dest=args.dest, page_size=1000)
    )
    if args.json:
        for r in routers:
            _json_line(asdict(r))
        return EXIT_OK
    _table(
        ["ROUTER", "SOURCE", "DEST", "GUARANTEE", "FORWARDED"],
        [[r.router, r.source, r.dest, r.guarantee, str(r.forwarded_total)] for r in routers],
    )
    return EXIT_OK


def _router_json(r: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(r).items() if v is not None}


def cmd_router_get(args: argparse.Namespace, client: Client) -> int:
    _json_pretty(_router_json(client.get_router(args.router)))
    return EXIT_OK


def cmd_router_put(args: argparse.Namespace, client: Client) -> int:
    r = client.put_router(
        args.router,
        args.source,
        args.dest,
        preserve_node=not args.no_preserve_node,
        preserve_tag=not args.no_preserve_tag,
        create_dest=not args.no_create_dest,
        filter=args.filter,
        allow_cycle=args.allow_cycle,
        guarantee=args.guarantee,
    )
    _json_pretty(_router_json(r))
    return EXIT_OK


def cmd_router_delete(args: argparse.Namespace, client: Client) -> int:
    r = client.delete_router(args.router)
    _json_pretty(asdict(r))
    if not r.deleted:
        _note(f"there was no router {args.router!r}")
    return EXIT_OK


# -- queues ---------------------------------------------------------------------------------


def cmd_queue_claim(args: argparse.Namespace, client: Client) -> int:
    r = client.claim(args.queue, args.node, max=args.max, lease_ms=args.lease_ms)
    for job in r.jobs:
        _job_line(job)
    if not r.jobs:
        _note(f"no job ready in {args.queue}")
    return EXIT_OK


def _job_line(job: Job) -> None:
    _json_line(job.to_json())


def _seqs(args: argparse.Namespace) -> tuple[list[int], list[str] | None]:
    seqs = [s for s, _ in args.seqs]
    leases = [lease for _, lease in args.seqs]
    return seqs, leases if any(leases) else None


def cmd_queue_ack(args: argparse.Namespace, client: Client) -> int:
    seqs, leases = _seqs(args)
    _json_line(asdict(client.ack(args.queue, args.node, seqs, lease_ids=leases)))
    return EXIT_OK


def cmd_queue_nack(args: argparse.Namespace, client: Client) -> int:
    seqs, leases = _seqs(args)
    r = client.nack(args.queue, args.node, seqs, lease_ids=leases, delay_ms=args.delay_ms)
    _json_line(asdict(r))
    return EXIT_OK


def cmd_queue_extend(args: argparse.Namespace, client: Client) -> int:
    seqs, leases = _seqs(args)
    r = client.extend(args.queue, args.node, seqs, args.lease_ms, lease_ids=leases)
    _json_line(asdict(r))
    return EXIT_OK


# -- probes ---------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, client: Client) -> int:
    h = client.health()
    r = client.ready()
    _json_pretty({"url": client.url, "health": asdict(h), "ready": asdict(r)})
    return EXIT_OK if r.ready else EXIT_FAIL


def cmd_metrics(args: argparse.Namespace, client: Client) -> int:
    if args.json:
        _json_pretty(client.metrics())
    else:
        _out().write(client.metrics_text())
    return EXIT_OK


# -- argparse wiring ------------------------------------------------------------------------

_FORMATTER = argparse.RawDescriptionHelpFormatter

CONNECTION_HELP = """\
connection:
  --url and --token override $TOPICS_URL and $TOPICS_TOKEN; without either the
  server is http://127.0.0.1:4000 and no token is sent.
"""


def _conn_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument(
        "--url",
        metavar="URL",
        help="server base url (default: $TOPICS_URL, else http://127.0.0.1:4000)",
    )
    g.add_argument(
        "--token", metavar="TOKEN", help="API key, sent as a bearer token (default: $TOPICS_TOKEN)"
    )
    g.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="per-request timeout in seconds"
    )
    g.add_argument(
        "--retries",
        type=_nonneg,
        default=5,
        metavar="N",
        help="retries after 429/503 answers and connection failures (default 5)",
    )
    return p


def _parser(
    sub: Any,
    name: str,
    handler: Handler,
    help: str,
    description: str,
    examples: str,
    parent: argparse.ArgumentParser,
    aliases: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    epilog = f"examples:\n{examples}\n\n{CONNECTION_HELP}" if examples else CONNECTION_HELP
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        aliases=list(aliases),
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=_FORMATTER,
        parents=[parent],
    )
    p.set_defaults(client_command=handler)
    return p


def _read_args(p: argparse.ArgumentParser) -> None:
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--from-seq",
        type=_nonneg,
        metavar="N",
        help="start after seq N (records N+1, N+2, ...)",
    )
    start.add_argument(
        "--from-beginning", action="store_true", help="start from the first record kept"
    )
    p.add_argument(
        "--format",
        choices=["json", "text"],
        default="json",
        help="json: one JSON object per line (default); text: readable lines",
    )
    p.add_argument("--limit", type=_positive, metavar="N", help="stop after N records")
    p.add_argument("--node", metavar="NODE", help="skip records written by this node")
    p.add_argument("--no-tags", action="store_true", help="leave tags out")
    p.add_argument("--no-meta", action="store_true", help="leave meta out")


def _topic_commands(sub: Any, conn: argparse.ArgumentParser, prefix: str) -> None:
    """`ls`, `get`, `create`, `config`, `delete` under `sub` (as `topics topic ...`,
    and again at the top level as short forms)."""
    p = _parser(
        sub,
        "ls",
        cmd_topic_ls,
        "list topics",
        "List topics by name, with their head and earliest seqs, live records and bytes.",
        f"  topics {prefix}ls\n  topics {prefix}ls --prefix orders --json",
        conn,
    )
    p.add_argument("--prefix", help="only names starting with this")
    p.add_argument("--json", action="store_true", help="one JSON object per topic and line")

    p = _parser(
        sub,
        "get",
        cmd_topic_get,
        "show a topic's state and config",
        "Print a topic's state (seqs, counts, config, queue counters) as JSON.",
        f"  topics {prefix}get orders",
        conn,
    )
    p.add_argument("topic", metavar="TOPIC")

    p = _parser(
        sub,
        "create",
        cmd_topic_create,
        "create a topic",
        "Create a topic with a config (every field not given takes its default; fields\n"
        "in docs/API.md section 5). Refuses an existing topic unless --replace, which\n"
        "replaces its whole config.",
        f"  topics {prefix}create orders\n"
        f"  topics {prefix}create jobs type=queue lease_ms=60000\n"
        f'  topics {prefix}create metrics --config \'{{"cap_records": 1000, "ttl_ms": 600000}}\'',
        conn,
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="config fields")
    p.add_argument("--config", metavar="JSON", help="config fields as a JSON object")
    p.add_argument("--replace", action="store_true", help="replace the config of an existing topic")

    p = _parser(
        sub,
        "config",
        cmd_topic_config,
        "show or change a topic's config",
        "Without KEY=VALUE, print the topic's config. With them, change those fields and\n"
        "keep the others (read, changed, written back: not atomic).",
        f"  topics {prefix}config orders\n  topics {prefix}config orders cap_records=5000 discard=reject",
        conn,
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="config fields to change")

    p = _parser(
        sub,
        "delete",
        cmd_topic_delete,
        "delete a topic",
        "Delete a topic, its records and every router into or out of it.",
        f"  topics {prefix}delete orders\n  topics {prefix}delete orders --if-empty",
        conn,
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument(
        "--if-empty", action="store_true", help="refuse when the topic still has live records"
    )


#: Names of the subcommands this module adds (dispatch goes by `client_command`).
CLIENT_COMMANDS = (
    "produce",
    "consume",
    "tail",
    "watch",
    "topic",
    "ls",
    "get",
    "create",
    "config",
    "delete",
    "routers",
    "queue",
    "status",
    "metrics",
)


def add_subcommands(sub: Any) -> None:
    """Add the client commands to `sub` (from `ArgumentParser.add_subparsers()`)."""
    conn = _conn_parent()

    p = _parser(
        sub,
        "produce",
        cmd_produce,
        "append stdin lines to a topic",
        "Append the lines of stdin to TOPIC, in batches. Each line is one record; by\n"
        "default its text is the record's data. With --json each line is a JSON value,\n"
        'or a whole record object {"data": ..., "tag": ..., "node": ..., "meta": ...}\n'
        '(an object with a "data" key and no other keys than those). Blank lines are\n'
        "skipped. A batch is sent when it is full, when stdin has been quiet for\n"
        "--linger-ms, and at the end; each is atomic and sent under its own idempotency\n"
        "key, so a retried batch is never stored twice. Prints a summary line.",
        "  printf 'hello\\nworld\\n' | topics produce greetings\n"
        '  echo \'{"data": {"sku": "B-77"}, "tag": "order:1"}\' | topics produce orders --json\n'
        "  tail -f app.log | topics produce logs --tag app --batch 500",
        conn,
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--json", action="store_true", help="each line is JSON (a value or a record)")
    p.add_argument(
        "--batch",
        type=_positive,
        default=100,
        metavar="N",
        help="records per request (default 100, at most 10000)",
    )
    p.add_argument("--tag", help="tag for records that have none")
    p.add_argument("--node", help="writer node of the records")
    p.add_argument(
        "--linger-ms",
        type=_nonneg,
        default=200,
        metavar="MS",
        help="send a partial batch after this long without input (default 200; 0: never)",
    )
    p.add_argument("--no-create", action="store_true", help="fail if the topic does not exist yet")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary line")

    p = _parser(
        sub,
        "consume",
        cmd_consume,
        "print a topic's records (alias: tail)",
        "Print TOPIC's records, one per line, and a line for each tombstone (records lost\n"
        "to a cap or TTL before they were read).\n\n"
        "Where it starts: --from-beginning (everything kept), --from-seq N (after seq N).\n"
        "Without either it prints everything kept, or, with --follow, only records\n"
        "written from now on. Without --follow it stops at the end; with --follow it\n"
        "keeps printing new records (over SSE, resuming after a dropped connection)\n"
        "until Ctrl-C, --limit, or the server shutting down.\n\n"
        "JSON lines are record objects as the API returns them ($seq, $ts, $tag, $node,\n"
        'data, meta) and {"tombstone": {...}} for a tombstone. The text format is\n'
        "'#SEQ TIME [tag=TAG] [node=NODE] DATA'.",
        "  topics consume orders\n"
        "  topics consume orders --from-seq 100 --limit 10 --format text\n"
        "  topics tail orders --follow",
        conn,
        aliases=("tail",),
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    _read_args(p)

    p = _parser(
        sub,
        "watch",
        cmd_watch,
        "follow several topics live",
        "Follow one or more topics over one SSE stream and print their records as they\n"
        "are written (every line names its topic). Starts at each topic's head unless\n"
        "--from-seq or --from-beginning says otherwise; resumes after a dropped\n"
        "connection; ends with Ctrl-C, --limit, the server shutting down, or when every\n"
        "topic was deleted.",
        "  topics watch orders payments\n"
        "  topics watch orders payments --from-beginning --format text",
        conn,
    )
    p.add_argument("topics", nargs="+", metavar="TOPIC")
    _read_args(p)

    tp = sub.add_parser(
        "topic",
        help="manage topics: ls, get, create, config, delete",
        description="Manage topics. The same commands also work without the word"
        " `topic` (topics ls, topics get ...).",
        epilog="examples:\n"
        "  topics topic ls\n"
        "  topics topic create orders --config '{\"cap_records\": 100000}'\n"
        "  topics topic delete orders\n"
        "`topics topic COMMAND --help` describes each command.",
        formatter_class=_FORMATTER,
    )
    tsub = tp.add_subparsers(dest="topic_cmd", required=True, metavar="COMMAND")
    _topic_commands(tsub, conn, "topic ")
    _topic_commands(sub, conn, "")

    rp = sub.add_parser(
        "routers",
        aliases=["router"],
        help="manage routers: ls, get, put, delete",
        description="Manage routers, which copy every new record of a source topic into a dest"
        " topic (docs/API.md section 11).",
        epilog="examples:\n"
        "  topics routers put orders-eu --source orders --dest orders.eu --filter 'eu:*'\n"
        "  topics routers ls --source orders\n"
        "  topics routers delete orders-eu\n"
        "`topics routers COMMAND --help` describes each command.",
        formatter_class=_FORMATTER,
    )
    rsub = rp.add_subparsers(dest="router_cmd", required=True, metavar="COMMAND")
    p = _parser(
        rsub,
        "ls",
        cmd_router_ls,
        "list routers",
        "List routers by name.",
        "  topics routers ls\n  topics routers ls --source orders",
        conn,
    )
    p.add_argument("--prefix", help="only router names starting with this")
    p.add_argument("--source", help="only routers from this topic")
    p.add_argument("--dest", help="only routers into this topic")
    p.add_argument("--json", action="store_true", help="one JSON object per router and line")
    p = _parser(
        rsub,
        "get",
        cmd_router_get,
        "show a router",
        "Print a router, with the count of source records it has dealt with.",
        "  topics routers get orders-copy",
        conn,
    )
    p.add_argument("router", metavar="ROUTER")
    p = _parser(
        rsub,
        "put",
        cmd_router_put,
        "create or update a router",
        "Create a router from --source to --dest (a missing topic is created), or change\n"
        "the options of an existing one (its source and dest cannot change).",
        "  topics routers put orders-copy --source orders --dest orders.copy\n"
        "  topics routers put eu-orders --source orders --dest orders.eu --filter 'eu:*'",
        conn,
    )
    p.add_argument("router", metavar="ROUTER")
    p.add_argument("--source", required=True, help="topic to copy from")
    p.add_argument("--dest", required=True, help="topic to copy into")
    p.add_argument(
        "--filter",
        metavar="TAG",
        help="copy only records with this tag ('x:*': tags starting with x:)",
    )
    p.add_argument("--no-preserve-node", action="store_true", help="drop $node from copies")
    p.add_argument("--no-preserve-tag", action="store_true", help="drop $tag from copies")
    p.add_argument("--no-create-dest", action="store_true", help="fail if --dest does not exist")
    p.add_argument("--allow-cycle", action="store_true", help="skip the cycle check")
    p.add_argument(
        "--guarantee",
        choices=["at_least_once", "exactly_once"],
        default="at_least_once",
        help="duplicate suppression after a crash (default at_least_once)",
    )
    p = _parser(
        rsub,
        "delete",
        cmd_router_delete,
        "delete a router",
        "Stop a router; copies already made stay.",
        "  topics routers delete orders-copy",
        conn,
    )
    p.add_argument("router", metavar="ROUTER")

    qp = sub.add_parser(
        "queue",
        help="work a queue by hand: claim, ack, nack, extend",
        description="Lease queue jobs and settle them (docs/API.md section 14). A queue is a"
        " topic created with type=queue; jobs are written with `topics produce`.",
        epilog="examples:\n"
        "  topics queue claim jobs --node worker-1 --max 10\n"
        "  topics queue ack jobs 4 5 --node worker-1\n"
        "`topics queue COMMAND --help` describes each command.",
        formatter_class=_FORMATTER,
    )
    qsub = qp.add_subparsers(dest="queue_cmd", required=True, metavar="COMMAND")
    p = _parser(
        qsub,
        "claim",
        cmd_queue_claim,
        "lease jobs",
        "Lease up to --max jobs to --node; prints each job (with its lease_id) as a JSON line.",
        "  topics queue claim jobs --node worker-1\n  topics queue claim jobs --node worker-1 --max 10 --lease-ms 60000",
        conn,
    )
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--node", required=True, help="the worker's name")
    p.add_argument("--max", type=_positive, default=1, help="jobs at most (default 1)")
    p.add_argument(
        "--lease-ms", type=_positive, metavar="MS", help="lease length (default: the queue's)"
    )
    for name, handler, help_, desc, ex in (
        (
            "ack",
            cmd_queue_ack,
            "mark jobs done",
            "Ack jobs: they are deleted.",
            "  topics queue ack jobs --node worker-1 1 2 3",
        ),
        (
            "nack",
            cmd_queue_nack,
            "give jobs back",
            "Nack jobs: they are claimable again, at once or after --delay-ms.",
            "  topics queue nack jobs --node worker-1 4 --delay-ms 5000",
        ),
        (
            "extend",
            cmd_queue_extend,
            "extend leases",
            "Move the jobs' lease deadlines to now + --lease-ms.",
            "  topics queue extend jobs --node worker-1 5 --lease-ms 60000",
        ),
    ):
        p = _parser(
            qsub, name, handler, help_, desc + " SEQ:LEASE_ID fences by lease id.", ex, conn
        )
        p.add_argument("queue", metavar="QUEUE")
        p.add_argument("seqs", nargs="+", type=_seq_arg, metavar="SEQ[:LEASE_ID]")
        p.add_argument("--node", required=True, help="the worker holding the leases")
        if name == "nack":
            p.add_argument(
                "--delay-ms",
                type=_nonneg,
                default=0,
                metavar="MS",
                help="claimable again after this long",
            )
        if name == "extend":
            p.add_argument(
                "--lease-ms", type=_positive, required=True, metavar="MS", help="new lease length"
            )

    _parser(
        sub,
        "status",
        cmd_status,
        "show the server's health and readiness",
        "Print health and readiness; exit 1 while the server is not ready.",
        "  topics status",
        conn,
    )
    p = _parser(
        sub,
        "metrics",
        cmd_metrics,
        "print the server's metrics",
        "Print /v0/metrics: Prometheus text, or JSON with --json.",
        "  topics metrics --json",
        conn,
    )
    p.add_argument("--json", action="store_true", help="the JSON form")


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed client command; returns the exit code."""
    handler: Handler = args.client_command
    try:
        with Client(args.url, args.token, timeout=args.timeout, retries=args.retries) as client:
            return handler(args, client)
    except UsageError as e:
        _note(str(e))
        return EXIT_USAGE
    except (BadInput, Refused) as e:
        _note(str(e))
        return EXIT_FAIL
    except ConnectionFailed as e:
        _note(f"cannot reach the server: {e.message}")
        return EXIT_FAIL
    except TopicsError as e:
        _note(f"{e.message} ({e.code}{f', HTTP {e.status}' if e.status else ''})")
        return EXIT_FAIL
    except ValueError as e:
        _note(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK


def _quiet_stdout() -> None:
    """After a closed pipe on stdout, point it at /dev/null so the exit flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)  # noqa: TID251 (not data: stdout's sink)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
