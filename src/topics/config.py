"""Server configuration: every `TOPICS_*` environment variable, read in one place.

:func:`load_config` turns an environment mapping into a frozen
:class:`ServerConfig` (the variables are listed in README.md "Configuration").
Numeric variables are whitespace-trimmed; unset or empty means the default, and
a value that is not an integer or is outside the variable's range also falls
back to the default, with a warning naming the variable. Ports are stricter: a
port that is not 0-65535 aborts startup with a :class:`ConfigError` naming the
variable, as do a malformed API-key scope and an insecure non-loopback bind
without keys.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "ApiKey",
    "ConfigError",
    "ServerConfig",
    "load_config",
    "parse_api_keys",
    "parse_port",
    "PORT_MAX",
    "Limits",
]


class ConfigError(Exception):
    """Startup refused: a bad numeric value, a malformed key scope or an insecure bind.

    The message is one line that names the variable (README.md "Configuration").
    """


SCOPE_READ = "read"
SCOPE_WRITE = "write"
SCOPE_DELETE = "delete"
SCOPE_ADMIN = "admin"
ALL_SCOPES = frozenset({SCOPE_READ, SCOPE_WRITE, SCOPE_DELETE, SCOPE_ADMIN})

_SCOPE_TOKENS: dict[str, frozenset[str]] = {
    "read": frozenset({SCOPE_READ}),
    "r": frozenset({SCOPE_READ}),
    "write": frozenset({SCOPE_WRITE}),
    "w": frozenset({SCOPE_WRITE}),
    "delete": frozenset({SCOPE_DELETE}),
    "del": frozenset({SCOPE_DELETE}),
    "d": frozenset({SCOPE_DELETE}),
    "admin": frozenset({SCOPE_ADMIN}),
    "a": frozenset({SCOPE_ADMIN}),
    "rw": frozenset({SCOPE_READ, SCOPE_WRITE}),
}


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key: SHA-256 digest of the secret, scopes, name prefixes.

    `prefixes` empty means any name is allowed (docs/API.md, "2.1 Keys").
    """

    digest: bytes
    scopes: frozenset[str]
    prefixes: tuple[str, ...]
    namespace: str = ""

    def allows_name(self, name: str) -> bool:
        """True if `name` starts with one of the allowlisted prefixes (or none are set)."""
        return not self.prefixes or any(name.startswith(p) for p in self.prefixes)


def parse_api_keys(raw: str) -> tuple[ApiKey, ...]:
    """Parse `TOPICS_API_KEYS` (entry syntax: docs/API.md, "2.1 Keys").

    Entries are comma-separated and trimmed; each is `secret`, `secret:SCOPES`,
    `secret:SCOPES:PREFIXES` or `secret::PREFIXES`. The scope token `ns` makes
    the key's one prefix its Kafka namespace (docs/KAFKA.md, "Tenant
    namespaces"). Raises :class:`ConfigError` on an unknown scope token, or on
    `ns` without exactly one prefix.
    """
    keys: list[ApiKey] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        parts = entry.split(":", 2)
        secret = parts[0].strip()
        if not secret:
            continue
        scopes: set[str] = set()
        scope_field = parts[1] if len(parts) > 1 else ""
        namespaced = False
        for tok in scope_field.split("+"):
            tok = tok.strip().lower()
            if not tok:
                continue
            if tok == "ns":
                namespaced = True
                continue
            if tok not in _SCOPE_TOKENS:
                raise ConfigError(f"TOPICS_API_KEYS: unknown scope token {tok!r}")
            scopes |= _SCOPE_TOKENS[tok]
        prefixes: tuple[str, ...] = ()
        if len(parts) > 2:
            prefixes = tuple(p.strip() for p in parts[2].split("|") if p.strip())
        if namespaced and len(prefixes) != 1:
            raise ConfigError("TOPICS_API_KEYS: the ns option needs exactly one prefix")
        keys.append(
            ApiKey(
                digest=hashlib.sha256(secret.encode()).digest(),
                scopes=frozenset(scopes) if scopes else ALL_SCOPES,
                prefixes=prefixes,
                namespace=prefixes[0] if namespaced else "",
            )
        )
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource caps; `0` disables a configurable cap.

    See docs/API.md, "16. Limits and the knobs that shape the API".
    """

    max_topics: int = 100_000
    max_routers: int = 10_000
    max_watch_sessions: int = 10_000
    max_sse_connections: int = 10_000
    max_sse_connections_per_key: int = 1_000
    max_inflight_per_key: int = 1_000
    max_total_bytes: int = 0
    max_body_bytes: int = 67_108_864
    # Fixed values of the /v0 contract; readable from the env, same defaults.
    max_batch_records: int = 10_000
    max_record_bytes: int = 1_048_576
    max_meta_bytes: int = 16_384
    max_meta_keys: int = 64
    max_tag_bytes: int = 256
    max_node_bytes: int = 128
    max_limit: int = 1_000
    max_watch_topics: int = 256
    max_claim: int = 1_000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything `topics serve` reads (README "Configuration")."""

    host: str = "127.0.0.1"
    port: int = 4000
    port_file: str | None = None
    api_keys: tuple[ApiKey, ...] = ()
    probe_auth: bool = False
    allow_insecure_no_auth: bool = False
    data_dir: str = "./topics-data"
    cold_dir: str | None = None
    wal_shards: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)))
    wal_file_bytes: int = 67_108_864
    segment_max_events: int = 10_000
    segment_max_bytes: int = 67_108_864
    segment_max_age_ms: int = 3_600_000
    hot_retain_segments: int = 4
    hot_retain_bytes: int = 0
    relocate_bytes_per_s: int = 67_108_864
    checkpoint_interval_ms: int = 60_000
    checkpoint_wal_bytes: int = 67_108_864
    limits: Limits = field(default_factory=Limits)
    log_level: str = "info"
    # Kafka-wire listener (docs/KAFKA.md): port 0 turns it off; `kafka_advertised`
    # is the `host:port` returned in Metadata/FindCoordinator (default: the bound one).
    kafka_port: int = 9092
    kafka_advertised: str | None = None
    # Listener exposure limits (docs/KAFKA.md "Limits"): the largest request frame
    # after SASL (bytes), how long a connection may sit idle, and how long one frame
    # may take to arrive once it has started (ms; 0 = no timeout).
    kafka_max_frame_bytes: int = 67_108_864
    kafka_idle_timeout_ms: int = 600_000
    kafka_frame_timeout_ms: int = 30_000
    # Codec of the record batches Fetch answers carry (docs/KAFKA.md "Records").
    kafka_fetch_compression: str = "none"
    # HTTP connection guards (README "Configuration"): a request head must arrive
    # within `http_header_timeout_ms`; open connections are capped per process and
    # per client address (`0` turns a guard off).
    http_header_timeout_ms: int = 10_000
    max_connections: int = 16_384
    max_connections_per_ip: int = 4_096
    # Delivery scheduling (docs/SCHEDULER.md): "priority" (banded DWRR and the
    # governor's ladder) or "fifo" (every publication delivered at once, in order,
    # never throttled).
    scheduler: str = "priority"

    @property
    def auth_enabled(self) -> bool:
        """Auth is on iff at least one key is configured (docs/API.md, "2.1 Keys": dev mode)."""
        return bool(self.api_keys)


PORT_MAX = 65535
#: Values of TOPICS_SCHEDULER; the first is the default.
SCHEDULERS = ("priority", "fifo")

#: `TOPICS_KAFKA_FETCH_COMPRESSION` values, in Kafka's codec-id order (0 = none).
KAFKA_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def parse_port(raw: str, what: str) -> int:
    """`raw` (trimmed) as a TCP port 0-65535 (`0` = ephemeral).

    Raises :class:`ConfigError` naming `what` (a variable or flag) when `raw` is
    not an integer or is out of range.
    """
    text = raw.strip()
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not a port number (0-{PORT_MAX})") from None
    if not 0 <= port <= PORT_MAX:
        raise ConfigError(f"{what}: port {port} is out of range (0-{PORT_MAX})")
    return port


def _int(
    env: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = 0,
    maximum: int | None = None,
) -> int:
    """`env[name]` as an int in `[minimum, maximum]`; unset, blank or invalid gives
    `default` (an invalid value is logged as a warning naming the variable)."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    try:
        value = int(text)
    except ValueError:
        value = None
    if (
        value is None
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        # The wire contract keeps startup going on a bad number (the default
        # applies); it is said once, on stderr, naming the variable.
        logging.getLogger("topics.config").warning(
            "%s: %r is not a valid value; using the default %d", name, text, default
        )
        return default
    return value


def _ints(
    env: Mapping[str, str], defaults: object, names: Iterable[str], at_least: Mapping[str, int]
) -> dict[str, int]:
    """Each field in `names`, in order, read from `TOPICS_<FIELD>` by :func:`_int`: at
    least `at_least[field]` (else 0), defaulting to its value in `defaults` (a
    default-built config, so each default is written once, on the dataclass)."""
    return {
        name: _int(
            env, "TOPICS_" + name.upper(), getattr(defaults, name), minimum=at_least.get(name, 0)
        )
        for name in names
    }


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    """`env[name]` as a port (:func:`parse_port`); unset or blank gives `default`."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    return parse_port(raw, name)


def _bool(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true")


def is_loopback_host(host: str) -> bool:
    """True when every address `host` resolves to is loopback.

    Unspecified addresses (`0.0.0.0`, `::`) and unresolvable hosts are not loopback.
    """
    h = host.strip("[]")
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs
    )


def load_config(env: Mapping[str, str] | None = None) -> ServerConfig:
    """Build a :class:`ServerConfig` from `env` (default `os.environ`).

    Raises :class:`ConfigError` (one line naming the variable) for a port
    that is not 0-65535
    (in `TOPICS_PORT`, `TOPICS_KAFKA_PORT` or the `host:port` form of
    `TOPICS_HOST`), a malformed scope token, or a non-loopback bind with no keys
    unless `TOPICS_ALLOW_INSECURE_NO_AUTH` is `1`/`true`.
    """
    env = os.environ if env is None else env
    host = env.get("TOPICS_HOST", "").strip() or "127.0.0.1"
    if host.count(":") == 1 or (host.startswith("[") and "]:" in host):
        # `host:port` form (`[v6]:port` for IPv6): TOPICS_PORT is ignored.
        h, _, p = host.rpartition(":")
        port = parse_port(p, f"TOPICS_HOST={host}")
        host = h[1:-1] if h.startswith("[") and h.endswith("]") else h
    else:
        port = _port(env, "TOPICS_PORT", 4000)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    keys = parse_api_keys(env.get("TOPICS_API_KEYS", ""))
    allow_insecure = _bool(env, "TOPICS_ALLOW_INSECURE_NO_AUTH")
    if not keys and not allow_insecure and not is_loopback_host(host):
        raise ConfigError(
            f"refusing to bind {host}: not loopback and TOPICS_API_KEYS is empty "
            "(set keys, or TOPICS_ALLOW_INSECURE_NO_AUTH=1)"
        )
    # The /v0 contract's fixed values are at least 1; the other caps may be 0 (off).
    contract = (
        "max_batch_records",
        "max_record_bytes",
        "max_meta_bytes",
        "max_tag_bytes",
        "max_node_bytes",
        "max_limit",
        "max_watch_topics",
        "max_claim",
    )
    caps = (
        "max_topics",
        "max_routers",
        "max_watch_sessions",
        "max_sse_connections",
        "max_sse_connections_per_key",
        "max_inflight_per_key",
        "max_total_bytes",
        "max_body_bytes",
    )
    limits = Limits(**_ints(env, Limits(), (*caps, *contract), dict.fromkeys(contract, 1)))
    shards_default = max(1, min(os.cpu_count() or 1, 8))
    # `0` means "the default" here, as documented for TOPICS_WAL_SHARDS.
    shards = _int(env, "TOPICS_WAL_SHARDS", shards_default) or shards_default
    kafka_port = _port(env, "TOPICS_KAFKA_PORT", 9092)
    ints = _ints(
        env,
        ServerConfig(),
        (
            "wal_file_bytes",
            "segment_max_events",
            "segment_max_bytes",
            "segment_max_age_ms",
            "hot_retain_segments",
            "hot_retain_bytes",
            "relocate_bytes_per_s",
            "checkpoint_interval_ms",
            "checkpoint_wal_bytes",
            "kafka_max_frame_bytes",
            "kafka_idle_timeout_ms",
            "kafka_frame_timeout_ms",
            "http_header_timeout_ms",
            "max_connections",
            "max_connections_per_ip",
        ),
        {
            "wal_file_bytes": 65_536,
            "segment_max_events": 1,
            "segment_max_bytes": 1,
            "kafka_max_frame_bytes": 1,
        },
    )
    fetch_codec = env.get("TOPICS_KAFKA_FETCH_COMPRESSION", "").strip().lower() or "none"
    if fetch_codec not in KAFKA_CODECS:
        raise ConfigError(
            f"TOPICS_KAFKA_FETCH_COMPRESSION={fetch_codec!r}: expected one of "
            + ", ".join(KAFKA_CODECS)
        )
    cold_dir = env.get("TOPICS_COLD_DIR", "").strip() or None
    if cold_dir is not None and "://" in cold_dir:
        if not cold_dir.startswith("s3://"):
            raise ConfigError(
                f"TOPICS_COLD_DIR={cold_dir!r}: a url must be s3://bucket[/prefix] "
                "(or give a directory)"
            )
        bucket = cold_dir[5:].split("/", 1)[0]
        if not bucket:
            raise ConfigError(f"TOPICS_COLD_DIR={cold_dir!r}: no bucket")
    scheduler = env.get("TOPICS_SCHEDULER", "").strip().lower() or "priority"
    if scheduler not in SCHEDULERS:
        raise ConfigError(
            f"TOPICS_SCHEDULER={scheduler!r}: expected one of {', '.join(SCHEDULERS)}"
        )
    return ServerConfig(
        host=host,
        scheduler=scheduler,
        port=port,
        port_file=env.get("TOPICS_PORT_FILE") or None,
        api_keys=keys,
        probe_auth=_bool(env, "TOPICS_PROBE_AUTH"),
        allow_insecure_no_auth=allow_insecure,
        data_dir=env.get("TOPICS_DATA_DIR", "").strip() or "./topics-data",
        cold_dir=cold_dir,
        wal_shards=shards,
        limits=limits,
        log_level=(env.get("TOPICS_LOG") or env.get("RUST_LOG") or "info").strip().lower(),
        kafka_port=kafka_port,
        kafka_advertised=env.get("TOPICS_KAFKA_ADVERTISED", "").strip() or None,
        kafka_fetch_compression=fetch_codec,
        **ints,
    )
