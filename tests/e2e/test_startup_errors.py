"""The real `python -m topics` refusing to start: one line, non-zero, nothing left behind.

Every case runs the CLI as a subprocess (bounded by a timeout), then checks the
exit code, that stderr is one line naming the problem with no traceback, and
that the filesystem under the test's directory is exactly as before the start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 60.0  # a start that hangs instead of failing is killed (by its PID) and fails


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    # Kafka off unless asked for (9092 is shared); no data dir: the default
    # ./topics-data under the test's cwd is what a mistake would create.
    env.update({"TOPICS_KAFKA_PORT": "0", "TOPICS_PORT": "0"})
    env.update(extra)
    return env


def _run(
    cwd: Path,
    env: dict[str, str],
    args: Sequence[str] = ("serve",),
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "topics", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def _tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under `root`: kind, mode bits, and size + content digest for files."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", st.st_mode, os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode, "")
            else:
                h = hashlib.blake2b(digest_size=16)
                with open(p, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                out[rel] = ("file", st.st_mode, f"{st.st_size}:{h.hexdigest()}")
    return out


def _one_error_line(
    r: subprocess.CompletedProcess[str], code: int, *needles: str, after_info: bool = False
) -> str:
    """The process failed with `code`, one stderr line naming the problem, no traceback.

    With `after_info`, INFO lines (a start that got as far as recovery) may come
    before that line; it must still be the last and the only other-than-INFO one.
    """
    detail = f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.returncode == code, detail
    assert "Traceback" not in r.stderr, detail
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines, detail
    if after_info:
        assert all(" INFO " in ln for ln in lines[:-1]), detail
    else:
        assert len(lines) == 1, detail
    for needle in needles:
        assert needle in lines[-1], detail
    return lines[-1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 with a listening socket this test owns."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


# -- bad settings: exit 2, nothing created --------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ({"TOPICS_PORT": "65536"}, ("TOPICS_PORT", "65536", "0-65535")),
        ({"TOPICS_PORT": "-1"}, ("TOPICS_PORT", "-1", "0-65535")),
        ({"TOPICS_PORT": "fourthousand"}, ("TOPICS_PORT", "'fourthousand'", "not a port")),
        ({"TOPICS_HOST": "127.0.0.1:70000"}, ("TOPICS_HOST", "70000", "0-65535")),
        ({"TOPICS_HOST": "127.0.0.1:http"}, ("TOPICS_HOST", "'http'", "not a port")),
        ({"TOPICS_KAFKA_PORT": "123456"}, ("TOPICS_KAFKA_PORT", "123456", "0-65535")),
    ],
)
def test_bad_setting_is_one_line_and_exit_2(
    tmp_path: Path, extra: dict[str, str], needles: tuple[str, ...]
) -> None:
    before = _tree(tmp_path)
    r = _run(tmp_path, _env(**extra))
    _one_error_line(r, 2, *needles)
    assert _tree(tmp_path) == before  # no ./topics-data, no lock file


@pytest.mark.parametrize("value", ["65536", "-5", "abc"])
def test_bad_port_flag_is_an_argparse_error(tmp_path: Path, value: str) -> None:
    r = _run(tmp_path, _env(), ["serve", f"--port={value}"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "argument --port" in last and repr(value) in last and "0-65535" in last, r.stderr
    assert os.listdir(tmp_path) == []


# -- busy ports: exit 1, no data dir or lock file ---------------------------------------


def test_busy_port_creates_no_data_dir(tmp_path: Path, busy_port: int) -> None:
    r = _run(tmp_path, _env(TOPICS_PORT=str(busy_port)))
    _one_error_line(r, 1, f"cannot listen on 127.0.0.1:{busy_port}", "in use")
    assert os.listdir(tmp_path) == []  # the default ./topics-data was not left behind


def test_busy_port_keeps_an_existing_data_dir_as_it_was(tmp_path: Path, busy_port: int) -> None:
    # A data dir written by a real server (WAL, snapshot, segments, lock file)...
    (tmp_path / "first").mkdir()
    srv = ServerProcess(tmp_path / "first")
    try:
        req = urllib.request.Request(
            f"{srv.base}/v0/topics/t",
            data=b'{"records":[{"data":1},{"data":2}]}',
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 201
    finally:
        assert srv.stop() == 0, srv.log_text()
    data = tmp_path / "first" / "data"
    assert (data / ".topics.lock").exists() and (data / "wal").is_dir()
    before = _tree(tmp_path)
    # ...and a start on it that cannot bind changes nothing in it.
    r = _run(tmp_path, _env(TOPICS_PORT=str(busy_port), TOPICS_DATA_DIR=str(data)))
    _one_error_line(r, 1, f"cannot listen on 127.0.0.1:{busy_port}")
    assert _tree(tmp_path) == before


def test_busy_explicit_kafka_port_creates_no_data_dir(tmp_path: Path, busy_port: int) -> None:
    r = _run(tmp_path, _env(TOPICS_KAFKA_PORT=str(busy_port)))
    _one_error_line(r, 1, "Kafka listener", str(busy_port), "in use")
    assert os.listdir(tmp_path) == []


# -- unusable data directories ------------------------------------------------------------


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "data"
    f.write_text("not a directory\n")
    before = _tree(tmp_path)
    r = _run(tmp_path, _env(TOPICS_DATA_DIR=str(f)))
    _one_error_line(r, 1, str(f), "not a directory")
    assert _tree(tmp_path) == before


def test_data_dir_under_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    before = _tree(tmp_path)
    r = _run(tmp_path, _env(TOPICS_DATA_DIR=str(f / "sub" / "data")))
    _one_error_line(r, 1, "cannot create data directory", f"{f} is not a directory")
    assert _tree(tmp_path) == before


def _unprivileged() -> list[str]:
    """A command prefix under which permission bits apply to this (maybe root) process.

    As root: `setpriv` dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so the
    process stays uid 0 (the interpreter under /root stays readable, as its
    owner) but a 0o500 directory really refuses writes. Skips when that is not
    possible here.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and setpriv(1) is not installed: cannot drop DAC_OVERRIDE")
    prefix = [
        setpriv,
        "--bounding-set=-dac_override,-dac_read_search",
        "--inh-caps=-dac_override,-dac_read_search",
    ]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"running as root and setpriv cannot drop capabilities: {probe.stderr}")
    return prefix


@pytest.mark.parametrize("where", ["data dir itself", "its parent"])
def test_unwritable_data_dir(tmp_path: Path, where: str) -> None:
    prefix = _unprivileged()
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "existing").write_text("keep me")
    ro.chmod(0o500)
    try:
        before = _tree(tmp_path)
        if where == "data dir itself":
            r = _run(tmp_path, _env(TOPICS_DATA_DIR=str(ro)), prefix=prefix)
            _one_error_line(r, 1, f"data directory {ro} is not writable", "Permission denied")
        else:
            r = _run(tmp_path, _env(TOPICS_DATA_DIR=str(ro / "data")), prefix=prefix)
            _one_error_line(r, 1, f"cannot create data directory {ro / 'data'}", "Permission")
        assert _tree(tmp_path) == before
    finally:
        ro.chmod(0o700)


def test_failed_recovery_leaves_the_dir_as_it_was(tmp_path: Path) -> None:
    # `meta` must be a directory; recovery creates the WAL first and then fails.
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta").write_text("not a directory")
    before = _tree(tmp_path)
    r = _run(tmp_path, _env(TOPICS_DATA_DIR=str(data), TOPICS_WAL_SHARDS="2"))
    _one_error_line(r, 1, "recovery failed")
    assert _tree(tmp_path) == before  # no wal/, no .topics.lock


def test_unwritable_port_file_removes_the_new_data_dir(tmp_path: Path) -> None:
    # The port file is written last, after recovery filled a new data dir.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    before = _tree(tmp_path)
    r = _run(tmp_path, _env(TOPICS_PORT_FILE=str(blocker / "port")))
    _one_error_line(r, 1, "TOPICS_PORT_FILE", "Not a directory", after_info=True)
    assert _tree(tmp_path) == before  # ./topics-data (with its WAL) is gone again


# -- a data dir locked by a running server --------------------------------------------------


def test_second_server_on_a_locked_data_dir(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    try:
        lock = tmp_path / "data" / ".topics.lock"
        assert lock.read_text() == f"{srv.proc.pid}\n"
        for port in ("0", str(srv.port)):  # the lock is reported even when the port is busy
            r = _run(tmp_path, _env(TOPICS_DATA_DIR=str(tmp_path / "data"), TOPICS_PORT=port))
            _one_error_line(r, 1, "in use by another topics process", f"(pid {srv.proc.pid})")
            assert lock.read_text() == f"{srv.proc.pid}\n"
        with urllib.request.urlopen(f"{srv.base}/readyz", timeout=10) as resp:
            assert resp.status == 200  # the running server did not notice
    finally:
        assert srv.stop() == 0, srv.log_text()


# -- topics verify on something that is not a data dir ---------------------------------------


def test_verify_refuses_a_directory_that_is_not_a_data_dir(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    before = _tree(tmp_path)
    for target in (empty, REPO_ROOT):
        r = _run(tmp_path, _env(), ["verify", "--no-progress", str(target)])
        _one_error_line(r, 2, str(target), "not a topics data directory")
        assert "OK" not in r.stdout
    assert _tree(tmp_path) == before


def test_verify_accepts_a_real_data_dir(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    assert srv.stop() == 0, srv.log_text()
    r = _run(tmp_path, _env(), ["verify", "--no-progress", str(tmp_path / "data")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
