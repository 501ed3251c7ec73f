"""`topics.config.load_config`: numeric variables, ports, and the errors they raise."""

from __future__ import annotations

import pytest

from topics.config import PORT_MAX, ConfigError, load_config, parse_port


def test_defaults_when_unset_or_blank() -> None:
    cfg = load_config({})
    assert (cfg.host, cfg.port, cfg.kafka_port) == ("127.0.0.1", 4000, 9092)
    assert cfg.segment_max_events == 10_000 and cfg.limits.max_topics == 100_000
    blank = load_config({"TOPICS_PORT": "  ", "TOPICS_MAX_TOPICS": ""})
    assert (blank.port, blank.limits.max_topics) == (4000, 100_000)


def test_numbers_are_trimmed_and_read() -> None:
    cfg = load_config(
        {
            "TOPICS_PORT": " 0 ",
            "TOPICS_KAFKA_PORT": "65535",
            "TOPICS_SEGMENT_MAX_EVENTS": "\t7\n",
            "TOPICS_MAX_TOTAL_BYTES": "0",
            "TOPICS_CHECKPOINT_INTERVAL_MS": "0",
            "TOPICS_WAL_SHARDS": "3",
        }
    )
    assert (cfg.port, cfg.kafka_port, cfg.segment_max_events) == (0, 65535, 7)
    assert (cfg.limits.max_total_bytes, cfg.checkpoint_interval_ms, cfg.wal_shards) == (0, 0, 3)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"TOPICS_PORT": "65536"}, "TOPICS_PORT: port 65536 is out of range (0-65535)"),
        ({"TOPICS_PORT": "-1"}, "TOPICS_PORT: port -1 is out of range"),
        ({"TOPICS_PORT": "http"}, "TOPICS_PORT: 'http' is not a port number"),
        ({"TOPICS_PORT": "80.5"}, "TOPICS_PORT: '80.5' is not a port number"),
        ({"TOPICS_KAFKA_PORT": "99999"}, "TOPICS_KAFKA_PORT: port 99999 is out of range"),
        ({"TOPICS_HOST": "127.0.0.1:70000"}, "TOPICS_HOST=127.0.0.1:70000: port 70000 is out"),
        ({"TOPICS_HOST": "127.0.0.1:abc"}, "TOPICS_HOST=127.0.0.1:abc: 'abc' is not a port"),
        ({"TOPICS_HOST": "localhost:"}, "TOPICS_HOST=localhost:: '' is not a port"),
        ({"TOPICS_HOST": "[::1]:65536"}, "port 65536 is out of range"),
    ],
)
def test_bad_ports_are_errors_naming_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env)
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("name", "value", "default"),
    [
        ("TOPICS_MAX_TOPICS", "lots", 100000),
        ("TOPICS_MAX_BODY_BYTES", "64MiB", 67108864),
        ("TOPICS_SEGMENT_MAX_EVENTS", "0", 10000),
        ("TOPICS_CHECKPOINT_WAL_BYTES", "1e6", 67108864),
    ],
)
def test_bad_numbers_fall_back_to_the_default_with_a_warning(
    name: str, value: str, default: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Other numbers keep the wire contract's rule: the default applies, and the
    bad value is named in a warning rather than ignored silently."""
    with caplog.at_level("WARNING", logger="topics.config"):
        cfg = load_config({name: value})
    got = {
        "TOPICS_MAX_TOPICS": cfg.limits.max_topics,
        "TOPICS_MAX_BODY_BYTES": cfg.limits.max_body_bytes,
        "TOPICS_SEGMENT_MAX_EVENTS": cfg.segment_max_events,
        "TOPICS_CHECKPOINT_WAL_BYTES": cfg.checkpoint_wal_bytes,
    }[name]
    assert got == default
    assert any(name in r.getMessage() and repr(value) in r.getMessage() for r in caplog.records)


def test_host_port_form() -> None:
    cfg = load_config({"TOPICS_HOST": " 127.0.0.1:5001 ", "TOPICS_PORT": "9"})
    assert (cfg.host, cfg.port) == ("127.0.0.1", 5001)
    # In the host:port form TOPICS_PORT is not read at all, so it cannot fail.
    cfg = load_config({"TOPICS_HOST": "localhost:0", "TOPICS_PORT": "junk"})
    assert (cfg.host, cfg.port) == ("localhost", 0)
    cfg = load_config({"TOPICS_HOST": "[::1]:4100"})
    assert (cfg.host, cfg.port) == ("::1", 4100)
    cfg = load_config({"TOPICS_HOST": "::1", "TOPICS_PORT": "4101"})
    assert (cfg.host, cfg.port) == ("::1", 4101)
    cfg = load_config({"TOPICS_HOST": "[::1]"})
    assert (cfg.host, cfg.port) == ("::1", 4000)


def test_wal_shards_zero_means_default() -> None:
    default = load_config({}).wal_shards
    assert load_config({"TOPICS_WAL_SHARDS": "0"}).wal_shards == default >= 1


def test_parse_port_bounds() -> None:
    assert parse_port(" 0", "x") == 0 and parse_port(str(PORT_MAX), "x") == PORT_MAX
    for bad in ("65536", "-1", "", "0x50", "4 000"):
        with pytest.raises(ConfigError, match="^--port: "):
            parse_port(bad, "--port")


def test_scheduler_mode() -> None:
    assert load_config({}).scheduler == "priority"
    assert load_config({"TOPICS_SCHEDULER": " FIFO "}).scheduler == "fifo"
    with pytest.raises(ConfigError, match="^TOPICS_SCHEDULER="):
        load_config({"TOPICS_SCHEDULER": "lottery"})


def test_the_ns_key_option_names_a_kafka_namespace() -> None:
    """`ns` among the scope tokens makes the key's one prefix its Kafka namespace
    (docs/KAFKA.md, "Tenant namespaces"); it adds no scope of its own."""
    from topics.config import ALL_SCOPES, SCOPE_READ, parse_api_keys

    a, b, c = parse_api_keys("s1:rw+ns:tenantA.,s2:ns:tenantB.,s3:r:shared.")
    assert a.namespace == "tenantA." and a.prefixes == ("tenantA.",)
    assert b.namespace == "tenantB." and b.scopes == ALL_SCOPES
    assert c.namespace == "" and c.scopes == frozenset({SCOPE_READ})
    for bad in ("s1:rw+ns", "s1:ns:a.|b."):
        with pytest.raises(ConfigError, match="ns option"):
            parse_api_keys(bad)
