"""Start the real `topics serve` process on an ephemeral port, stop it by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["TEST_WAL_FILE_BYTES", "ServerProcess"]

#: The WAL file size of the servers and stores the tests start (bytes).
TEST_WAL_FILE_BYTES = 4 * 1024 * 1024


class ServerProcess:
    """`python -m topics serve` bound to 127.0.0.1:0, its port read from TOPICS_PORT_FILE."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.port_file = tmp / "port"
        self.log_path = tmp / "server.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
        full_env.update(
            {
                "TOPICS_HOST": "127.0.0.1",
                "TOPICS_PORT": "0",
                "TOPICS_PORT_FILE": str(self.port_file),
                "TOPICS_DATA_DIR": str(tmp / "data"),
                # The Kafka listener is off unless a test asks for it (9092 is shared).
                "TOPICS_KAFKA_PORT": "0",
                # 4 MiB WAL files unless a test asks for more: the 64 MiB default,
                # zero-filled on every shard, costs disk and start-up time per server.
                "TOPICS_WAL_FILE_BYTES": str(TEST_WAL_FILE_BYTES),
            }
        )
        full_env.update(env or {})
        self.port_file.unlink(missing_ok=True)  # a restart must not read the old port
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "topics", "serve"],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.host, self.port = self._wait_port()
        self.base = f"http://{self.host}:{self.port}"
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        """The port file appears at bind time; recovery may still run (503 until done)."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited during recovery:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.02)
        raise RuntimeError("server did not become ready in time")

    def _wait_port(self, timeout: float = 20.0) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            if self.port_file.exists():
                text = self.port_file.read_text().strip()
                if text:
                    host, _, port = text.rpartition(":")
                    return host, int(port)
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("server did not write its port file in time")

    def log_text(self) -> str:
        """What the server logged so far (for assertion messages)."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the process we started (by PID) and wait; returns its exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
        return int(self.proc.returncode)
