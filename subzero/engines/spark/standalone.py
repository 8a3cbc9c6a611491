"""A Spark standalone cluster on this machine, started from the installed
pyspark: one master and N workers bound to 127.0.0.1, each a JVM process of
its own, stopped by its PID.

It is how the tests and ``benchmarks/spark_scale.py`` run SubZero on a real
multi-worker cluster, and how a user can try the cluster path before pointing
``--master`` at a real one::

    with LocalCluster(workers=2) as c:
        subprocess.run(["subzero", "run", "workflows/astronomy.py", "--master", c.master_url])

No script of Spark's ``sbin`` is used (pyspark's wheel does not ship them):
``bin/spark-class`` execs the master's and the workers' JVMs directly, so the
processes started are the JVMs themselves and stopping them by PID leaves
nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from subzero.engines.spark.session import check_java
from subzero.errors import SparkError

LOG4J = Path(__file__).resolve().parent / "log4j2.properties"


def spark_home() -> Path:
    """The installed pyspark's folder, which holds ``bin/spark-class`` and the jars."""
    try:
        import pyspark
    except ImportError as e:
        raise SparkError(f"PySpark is not installed ({e})") from e
    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """A standalone master and ``workers`` workers (``cores`` cores and ``memory``
    each) on 127.0.0.1; logs and the workers' folders under ``folder`` (a new
    temporary folder when not given, removed by :meth:`stop`).  ``python`` is the
    Python the workers' executors run tasks with (default: this one)."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "2g",
                 folder: str | os.PathLike | None = None, python: str | None = None):
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self._own = folder is None
        self.folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="sz-cluster-"))
        self.python = python or sys.executable
        self.port, self.webui_port = free_port(), free_port()
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen | None] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=self.python, SPARK_LOG_DIR=str(self.folder / "logs"),
                   SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile=file:{LOG4J}")
        env.pop("SPARK_CONF_DIR", None)
        return env

    def _spawn(self, log: str, *args: str) -> subprocess.Popen:
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        out = open(self.folder / "logs" / log, "ab")
        try:
            return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=self._env(),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            out.close()

    def start(self, timeout: float = 120.0) -> LocalCluster:
        """Start the master, then the workers; return once all are registered."""
        check_java()
        self.master = self._spawn("master.log", "org.apache.spark.deploy.master.Master",
                                  "--host", "127.0.0.1", "--port", str(self.port),
                                  "--webui-port", str(self.webui_port))
        for _ in range(self.n_workers):
            self.start_worker()
        self.wait_for_workers(self.n_workers, timeout)
        return self

    def start_worker(self) -> int:
        """Start one more worker; returns its position in :attr:`workers`."""
        k = len(self.workers)
        work = self.folder / f"worker-{k}"
        work.mkdir(parents=True, exist_ok=True)
        self.workers.append(self._spawn(f"worker-{k}.log", "org.apache.spark.deploy.worker.Worker",
                                        self.master_url, "--host", "127.0.0.1",
                                        "--cores", str(self.cores), "--memory", self.memory,
                                        "--webui-port", "0", "--work-dir", str(work)))
        return k

    def status(self) -> dict:
        """The master's own account (its web UI's JSON): workers, applications."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as r:
            return json.loads(r.read().decode())

    def alive_workers(self) -> int:
        try:
            return int(self.status().get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def wait_for_workers(self, n: int, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.master is not None and self.master.poll() is not None:
                raise SparkError(f"the Spark master exited ({self.master.returncode}); see "
                                 f"{self.folder / 'logs' / 'master.log'}")
            if self.alive_workers() >= n:
                return
            time.sleep(0.5)
        raise SparkError(f"the standalone cluster did not have {n} worker(s) after {timeout:g} s; "
                         f"see the logs in {self.folder / 'logs'}")

    def kill_worker(self, k: int, sig: int = signal.SIGKILL) -> None:
        """Kill worker ``k`` (its JVM, by PID) and the executors it started."""
        p = self.workers[k]
        if p is None:
            return
        _kill_group(p, sig)
        self.workers[k] = None

    def stop(self) -> None:
        """Stop every worker, then the master (SIGTERM, then SIGKILL after a grace
        period); remove the folder when it was made here."""
        for k in range(len(self.workers)):
            self.kill_worker(k, signal.SIGTERM)
        if self.master is not None:
            _kill_group(self.master, signal.SIGTERM)
            self.master = None
        if self._own:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(p: subprocess.Popen, sig: int, grace: float = 10.0) -> None:
    """Signal a process and the processes it started (its session: a worker's
    executors), then make sure they are gone."""
    for s in (sig, signal.SIGKILL):
        try:
            os.killpg(p.pid, s)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(p.pid, signal.SIGKILL)      # executors left in the group
    except (ProcessLookupError, PermissionError):
        pass
