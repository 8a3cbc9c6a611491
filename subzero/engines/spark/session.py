"""The SparkSession SubZero runs on: created on demand (``local[*]`` by
default, ``--master``/``--conf`` pass through), or handed in by the user.

Checks come first so that a missing Java or an unreachable master is one
clear line, not a JVM stack trace or a minute-long hang.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar

from subzero.errors import SparkError
from subzero.tuning import KEEP_JVM_LOGS, MASTER_PROBE_S

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from subzero.model.workflow import Workflow

P = ParamSpec("P")
T = TypeVar("T")

JAVA_HINT = ("install Java 17+ (e.g. 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME, "
             "or run with `engine='local'`")


def java_version() -> int | None:
    """Major version of the java Spark would use, or None when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> None:
    v = java_version()
    if v is None:
        raise SparkError(f"the Spark engine needs Java, which was not found: {JAVA_HINT}")
    if v < 17:
        raise SparkError(f"the Spark engine needs Java 17+, found Java {v}: {JAVA_HINT}")


def check_master(master: str, conf: Mapping[str, str] | None = None,
                 timeout: float = MASTER_PROBE_S) -> None:
    """Fail within ``timeout`` seconds, with the cause, when a spark:// master does not
    accept connections or does not speak Spark's protocol (without this, Spark would
    retry for over a minute and then hide why).

    The probe is Spark's own transport protocol: one frame asking for a stream that
    does not exist, which a master answers with a ``StreamFailure`` frame.  A master
    that requires authentication (``spark.authenticate``) is only checked for a
    connection, since it may hang up on a stranger."""
    m = re.match(r"^spark://([^:/,]+):(\d+)$", master or "")
    if not m:
        return
    host, port = m.group(1), int(m.group(2))
    auth = str((conf or {}).get("spark.authenticate", "")).lower() == "true"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            if auth:
                return
            reply = _ask(s)
    except TimeoutError as err:
        raise SparkError(f"the Spark master {master} did not answer within {timeout:g} s: is a "
                         f"Spark master listening on port {port}? check `master` or run "
                         f"with `engine='local'`") from err
    except OSError as e:
        raise SparkError(f"cannot reach the Spark master {master}: {e.strerror or e}; check `master` "
                         f"or run with `engine='local'`") from e
    why = _not_spark(reply)
    if why:
        raise SparkError(f"{master} is not a Spark master: {why}; check `master` (the port of "
                         f"a standalone master is usually 7077) or run with `engine='local'`")


#: Spark's transport frame: 8-byte length (counting itself), 1-byte message type, body.
#: Ours is a StreamRequest (type 6) for a stream no master has.
_STREAM_ID = b"/files/subzero-probe"
_PROBE_BODY = bytes([6]) + struct.pack(">i", len(_STREAM_ID)) + _STREAM_ID
_PROBE = struct.pack(">q", 8 + len(_PROBE_BODY)) + _PROBE_BODY
_FRAME_HEAD = 9
#: message types a Spark server sends (Message.Type: 0-12, -1 for user messages)
_SPARK_TYPES = set(range(13)) | {0xFF}


def _ask(s: socket.socket) -> bytes:
    """Send the probe; the reply's first bytes (a few more when they are not Spark's,
    to show what answered).  A reset connection is an empty reply."""
    data = b""
    try:
        s.sendall(_PROBE)
        while len(data) < _FRAME_HEAD:
            chunk = s.recv(_FRAME_HEAD - len(data))
            if not chunk:
                break
            data += chunk
        if data and _not_spark(data):
            s.settimeout(0.2)
            data += s.recv(64)
    except ConnectionError:
        pass
    except TimeoutError:
        if not data:
            raise
    return data


def _not_spark(reply: bytes) -> str:
    """Why ``reply`` (the first bytes a server answered the probe with) is not Spark's
    answer, or empty when it is."""
    if not reply:
        return "it closed the connection without answering Spark's protocol"
    if len(reply) == _FRAME_HEAD:
        length, kind = struct.unpack(">q", reply[:8])[0], reply[8]
        if _FRAME_HEAD <= length < (1 << 31) and kind in _SPARK_TYPES:
            return ""
    shown = reply.decode("ascii", "replace").strip()
    text = "".join(c if c.isprintable() else "?" for c in shown)[:40]
    return f"it answered {text!r}, not Spark's protocol"


#: The local driver JVM's JIT: the quick (C1) compiler only (see :func:`session`)
LOCAL_JIT = "-XX:TieredStopAtLevel=1"


def session(master: str | None = None, conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession (an existing active one is reused)."""
    check_java()
    master = master or "local[*]"
    check_master(master, conf)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")     # no network needed in local mode
    log4j = os.path.join(os.path.dirname(__file__), "log4j2.properties")
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkError(f"PySpark is not installed ({e}); reinstall SubZero or use `engine='local'`") from e
    if master.startswith("local"):
        if not own_folder(Path(scratch_dir()), create=True):
            raise SparkError(f"cannot make Spark's scratch folder {scratch_dir()}: it exists and "
                             f"is not a folder of this user's; remove it, or use `engine='local'`")
        java_opts += f" -Djava.io.tmpdir={scratch_dir()}"
        # the driver is the executor: its JVM relays bytes between Python workers and does
        # little computing of its own, so the optimizing JIT's compiling costs more CPU than
        # it wins back (the LSST demo run: 42-50 s of CPU and 25-32 s wall with it, 27-34 s
        # and 19-24 s with the quick JIT only; genomics 1,000x: 56 against 36 s of CPU)
        java_opts += f" {LOCAL_JIT}"
    builder = (SparkSession.builder.appName("subzero").master(master)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.python.worker.reuse", "true")
               .config("spark.driver.extraJavaOptions", java_opts)
               .config("spark.executor.extraJavaOptions", java_opts))
    if master.startswith("local"):
        # the driver JVM is also the executor and relays task results (lineage pairs):
        # the 1 GB defaults are too small for full lineage of large arrays
        builder = (builder.config("spark.driver.memory", "4g")
                   .config("spark.driver.maxResultSize", "4g"))
        # Spark's scratch files (spark-*/pyspark-* folders) go to a folder of this
        # process, not loose in the temp folder, where a JVM stopped at exit leaves them
        # behind; prune_jvm_logs removes it once the process is gone
        builder = builder.config("spark.local.dir", str(scratch_dir()))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    log = jvm_log_path()
    try:
        prune_jvm_logs(Path(os.path.dirname(log)))
    except OSError:
        pass
    start = _size(log)
    try:
        with warnings.catch_warnings(), _stderr_to(log):
            warnings.simplefilter("ignore")
            spark = builder.getOrCreate()
    except Exception as e:  # JVM failed to start: report it as one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        said = _jvm_said(log, start)
        raise SparkError(f"could not start Spark ({master}): {first}"
                         + (f"; the JVM said: {said}" if said else "")
                         + f" (JVM log: {log}); try `engine='local'`") from e
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _installed(mod: ModuleType) -> bool:
    """True for modules Spark workers can import themselves: installed packages,
    SubZero's own, and the standard library."""
    name = getattr(mod, "__name__", "")
    if name.split(".")[0] in ("subzero", "numpy", "scipy"):
        return True
    path = getattr(mod, "__file__", None) or ""
    return not path or "site-packages" in path or "dist-packages" in path \
        or path.startswith(sys.base_prefix)


def jvm_log_dir() -> Path:
    """The folder of SubZero's JVM logs and Spark's scratch folders: one per user,
    ``subzero-spark-logs-<uid>`` in the temp folder, made 0700 -- unless what has that
    name there is not a folder of this user's own (a link or a folder someone else
    planted, which would make SubZero write, and prune, where they chose): then the
    user's cache folder (``$XDG_CACHE_HOME/subzero``, else ``~/.cache/subzero``)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    shared = Path(tempfile.gettempdir()) / f"subzero-spark-logs-{uid}"
    if own_folder(shared, create=True):
        return shared
    xdg = os.environ.get("XDG_CACHE_HOME")
    mine = (Path(xdg) if xdg else Path.home() / ".cache") / "subzero" / "spark-logs"
    if own_folder(mine, create=True):
        return mine
    raise SparkError(f"neither {shared} nor {mine} is a folder of this user's own (a link, or "
                     f"another user's folder); remove what is there, or use `engine='local'`")


def own_folder(path: Path, create: bool = False) -> bool:
    """Whether ``path`` itself is a folder of this user's, private (0700) -- not a link,
    not another user's folder; ``create`` makes it (and its missing parents) first.
    A private folder that only its owner may change is safe to write into and to
    prune, even in a shared temp folder (its sticky bit keeps others from swapping
    it)."""
    if create:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        return False
    if create and stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(path, 0o700, follow_symlinks=False)      # made by an older SubZero
        except OSError:
            return False
    return True


def jvm_log_path() -> str:
    """This process's JVM log: the JVM's own output goes there, not to the terminal."""
    return str(jvm_log_dir() / f"spark-{os.getpid()}.log")


def scratch_dir() -> str:
    """This process's folder for Spark's scratch files (local masters)."""
    return str(jvm_log_dir() / f"scratch-{os.getpid()}")


def jvm_log_hint() -> str:
    """`` (JVM log: PATH)`` when this process started a JVM, else empty: error
    messages point at the log so the JVM's own account is one look away."""
    try:
        path = jvm_log_path()
    except SparkError:        # no folder of this user's for logs: then there is no log either
        return ""
    return f" (JVM log: {path})" if os.path.exists(path) else ""


def prune_jvm_logs(folder: Path, keep: int = KEEP_JVM_LOGS) -> list[Path]:
    """Remove all but the newest ``keep`` logs of ``folder`` (and the logs that older
    versions left loose in the temp folder), and the Spark scratch folders of
    processes that are gone; nothing of a process still alive is removed.  Returns
    what was removed.

    Nothing is removed through a link: ``folder`` must be a folder of this user's own
    (not a link to one), and only this user's regular files and real folders in it
    are removed (each checked with ``lstat``), so a link planted in the shared temp
    folder cannot make SubZero delete where it points."""
    if not own_folder(folder):
        return []
    old = list(Path(tempfile.gettempdir()).glob("subzero-spark-*.log"))
    logs = sorted((p for p in folder.glob("spark-*.log") if _own(p, stat.S_ISREG)),
                  key=_mtime, reverse=True)
    removed = []
    for d in folder.glob("scratch-*"):
        pid = re.search(r"-(\d+)$", d.name)
        if _own(d, stat.S_ISDIR) and pid is not None and not _alive(int(pid.group(1))):
            shutil.rmtree(d, ignore_errors=True)      # never follows links inside
            removed.append(d)
    for p in [o for o in old if _own(o, stat.S_ISREG)] + logs[keep:]:
        pid = re.search(r"-(\d+)\.log$", p.name)
        if pid is not None and _alive(int(pid.group(1))):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def _own(path: Path, kind: Callable[[int], bool]) -> bool:
    """``path`` itself (``lstat``: a link is never taken for what it points to) is of
    ``kind`` (``stat.S_ISREG``, ``stat.S_ISDIR``) and this user's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    return kind(st.st_mode) and st.st_uid == uid


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _jvm_said(log: str, start: int) -> str:
    """The JVM's own reason for failing to start: the first error line it wrote to
    ``log`` after offset ``start`` (else its last line)."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read(1 << 16).decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    specific = [ln for ln in lines if not any(g in ln for g in _GENERIC)]
    for ln in specific:
        if any(k in ln.lower() for k in ("error", "exception", "invalid", "could not")):
            return ln[:200]
    return (specific or lines or [""])[0][:200]


#: what a JVM says after every failure to start: the line before them says why
_GENERIC = ("Could not create the Java Virtual Machine", "A fatal exception has occurred")


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class _stderr_to:
    """Point file descriptor 2 at a log file while the JVM starts: the JVM keeps
    it, so its startup chatter lands in the log, not in the user's terminal."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> _stderr_to:
        try:
            sys.stderr.flush()
            self.saved: int | None = os.dup(2)
            self.f = open(self.path, "ab")
            os.dup2(self.f.fileno(), 2)
        except OSError:
            self.saved = None
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self.saved is not None:
            os.dup2(self.saved, 2)
            os.close(self.saved)
            self.f.close()
        return False


def ship_workflow_modules(wf: Workflow | None = None, extra: Iterable[object] = ()) -> None:
    """Send the code of the workflow's operators to Spark workers by value when
    workers could not import it themselves: workflow files loaded by path
    (made-up module names) and modules that are only on the driver's path
    (a notebook's folder, a test directory)."""
    try:
        from pyspark import cloudpickle as pcp
    except ImportError:
        return
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("subzero_wf_")]
    objs = [step.operator for step in wf.steps.values()] if wf is not None else []
    for obj in [*objs, *extra]:         # extra: other objects tasks carry (inputs' sources)
        m = sys.modules.get(type(obj).__module__)
        if m is not None and m.__name__ != "__main__" and not _installed(m):
            mods.append(m)
    for mod in mods:
        try:
            pcp.register_pickle_by_value(mod)
        except Exception:
            pass


def _probe_worker(store: str, _: int) -> tuple[str, str, str | None, str, bool, bool]:
    """Run on an executor: who it is and what it sees.  Imports SubZero itself (its
    version module runs the package's ``__init__`` first), so a worker whose Python
    lacks it answers with the import error, not a crash."""
    import os as _os
    import socket as _socket
    import sys as _sys
    try:
        import subzero.version as _sz
        version, err = getattr(_sz, "__version__", "?"), ""
    except Exception as e:          # noqa: BLE001 - reported to the user as it is
        version, err = None, f"{type(e).__name__}: {e}"
    return (_socket.gethostname(), _sys.executable, version, err, _os.path.isdir(store),
            _os.access(store, _os.W_OK))


def check_workers(spark: SparkSession, store: str | os.PathLike) -> None:
    """Before the first job on a cluster: every executor must run SubZero (this
    version) and see the store folder, writable.  One small job; a wrong worker is one
    line naming the host and what to do.  Local mode needs no check (the executors
    are this process's JVM and this Python)."""
    from subzero.version import __version__
    sc = spark.sparkContext
    if str(sc.master).startswith("local"):
        return
    n = max(2, int(sc.defaultParallelism))
    from functools import partial
    fn = partial(_by_value(_probe_worker), str(store))
    try:
        seen = sc.parallelize(range(n), n).map(fn).collect()
    except Exception as e:
        from subzero.engines.spark.failures import python_error
        raise SparkError(f"the Spark workers of {sc.master} cannot run SubZero's check: "
                         f"{python_error(str(e)) or type(e).__name__}; {WORKER_HINT}") from e
    for host, python, version, err, exists, writable in seen:
        if version is None:
            raise SparkError(f"Spark worker {host} cannot import SubZero with {python} ({err}); "
                             f"{WORKER_HINT}")
        if version != __version__:
            raise SparkError(f"Spark worker {host} runs SubZero {version} ({python}), the driver "
                             f"{__version__}; install the same version on every worker")
        if not exists or not writable:
            raise SparkError(f"Spark worker {host} cannot {'see' if not exists else 'write to'} the "
                             f"store {store}: put the store on a file system every worker mounts at "
                             f"the same path (`store`)")


#: what a worker needs, said wherever one is found wanting
WORKER_HINT = ("every worker needs SubZero installed in the Python its executors run (the same "
               "virtualenv path on every machine, or PYSPARK_PYTHON pointing at one that has it)")


def _by_value(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` rebuilt outside SubZero's modules, so cloudpickle ships its code by value:
    a worker without SubZero can still run it (and say so)."""
    import types
    return types.FunctionType(fn.__code__, {"__builtins__": __builtins__}, fn.__name__,
                              fn.__defaults__, fn.__closure__)
