"""The Ray session of a run: join a cluster, or start a local Ray for the run and stop it after.

Ray is imported only here and in the engines that call it, so the rest of the project (and the
libraries) work without Ray installed. The session says on stderr what it starts and how long
that took (a local Ray: about 10 s on an idle machine, far longer on a loaded one), and while it
waits, every WAIT_NOTE seconds, which of Ray's processes are up. A local Ray that does not start
is tried once more with longer start-up timeouts (a loaded machine's raylet can miss Ray's
default wait); then the error is one line with the way to run without Ray. Ray's own
logs stay in its session directory (/tmp/ray/session_latest/logs) unless `ray_logs` asks for them:
for a run that works they are noise, e.g. Ray Train's placement group cleaner polls the State API,
which needs the dashboard we do not start, and prints a traceback when another Ray runs here.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm


class RayStartError(RuntimeError):
    """Ray did not start here, or its cluster could not be joined."""


WAIT_NOTE = 15.0  # seconds between "still starting" lines
# How long a cluster address may take to accept a connection before the run stops (seconds).
CONNECT_TIMEOUT_VARIABLE = "PIPELINE_RAY_CONNECT_TIMEOUT"
CONNECT_TIMEOUT_S = 15.0
ADDRESS_HELP = (f"(one that accepts no connection within ${CONNECT_TIMEOUT_VARIABLE} seconds, "
                f"default {CONNECT_TIMEOUT_S:g}, stops the run)")
# The second try's wait for the raylet to register (Ray's default: 10 s), in seconds.
RETRY_RAYLET_WAIT_S = "60"
# Ray's processes, by the log file each writes once it runs (in the session's logs folder).
PROCESSES = (("GCS", "gcs_server.out"), ("raylet", "raylet.out"),
             ("dashboard agent", "dashboard_agent.log"))


def started_processes(logs: Path = Path("/tmp/ray/session_latest/logs")) -> list[str]:
    """Which of Ray's processes have started here (their log files exist)."""
    return [name for name, log in PROCESSES if (logs / log).exists()]


def check_address(address: str, timeout: float | None = None) -> None:
    """Raise RayStartError when nothing at a cluster's HOST:PORT (or ray://HOST:PORT) accepts a
    TCP connection within `timeout` seconds (default: $PIPELINE_RAY_CONNECT_TIMEOUT, else 15).
    Ray itself retries such an address for ever. "auto" and "local" are Ray's to resolve."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    if timeout is None:
        timeout = float(os.environ.get(CONNECT_TIMEOUT_VARIABLE, CONNECT_TIMEOUT_S))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=max(left, 0.1)).close()
            return
        except OSError as err:
            reason = err.strerror or str(err) or type(err).__name__
        if left <= 0:
            raise RayStartError(
                f"no Ray cluster answers at {address}: {reason} for {timeout:g} s; check the "
                f"address and that this machine reaches it (the wait: ${CONNECT_TIMEOUT_VARIABLE})"
            )
        time.sleep(min(0.5, max(left, 0)))


@contextmanager
def _noting_the_wait(what: str, every: float, local: bool):
    """While the body runs, a line every `every` seconds: how long, and (a local Ray) which of
    its processes are up; a cluster's processes are not on this machine to look at."""
    done = threading.Event()
    start = time.perf_counter()

    def note() -> None:
        while not done.wait(every):
            waited = f"({time.perf_counter() - start:.0f} s)"
            if not local:
                say(f"still joining {what} {waited}")
                continue
            up = started_processes()
            missing = [name for name, _ in PROCESSES if name not in up]
            say(f"still starting {what} {waited}: up: "
                f"{', '.join(up) or 'none yet'}; waiting for: {', '.join(missing) or 'its node'}")

    thread = threading.Thread(target=note, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextmanager
def ray_session(address: str | None, *, without_ray: str, forward: str | None = None,
                ray_logs: bool = False):
    """Join the cluster at `address`, or start a fresh local Ray for this run; shut down after.

    without_ray: how to run the same command without Ray (a start-up failure's hint).
    forward: the actor class whose output is printed here (Ray Train's "RayTrainWorker": the
    training's progress bar and messages); ray_logs: print every Ray process's output and Ray's
    own logs too. Raises RayStartError when `ray.init` fails. Inside another session of this
    process (the demo's extractions share one), that session is used and left running.
    """
    running = sys.modules.get("ray")  # imported only below, after the environment is set
    if running is not None and running.is_initialized():
        yield running
        return
    if address is None:
        # The embedded Ray's workers run here with this interpreter. Ray's `uv run` hook would
        # start each of them through `uv run` and upload the working directory (the hook is read
        # when ray is first imported). Ray also starts workers at niceness 15 above the raylet's,
        # which on a shared machine hands the run's CPU to any other process: keep the command's.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    what = f"the cluster at {address}" if address else "a local Ray"
    say(f"{'joining' if address else 'starting'} {what}...")
    if address:
        check_address(address)
    start = time.perf_counter()
    quiet = {} if ray_logs else {
        "logging_level": logging.ERROR, "logging_config": ray.LoggingConfig(log_level="ERROR")
    }
    tries = 1 if address else 2
    before = descendants(os.getpid())
    # ray.init puts its own SIGTERM handler in (it prints a stack and aborts: exit -6); the
    # command's own, SIGTERM as Ctrl-C (pipeline/common/signals.py), is put back after it.
    on_sigterm = signal.getsignal(signal.SIGTERM)
    for attempt in range(1, tries + 1):
        try:
            with _noting_the_wait(what, WAIT_NOTE, local=not address):
                ray.init(address=address or "local", include_dashboard=False,
                         log_to_driver=ray_logs or forward is not None, **quiet)
            break
        except KeyboardInterrupt:
            # Ctrl-C while Ray starts: ray.shutdown stops only a node that ray.init finished
            # making. The GCS and raylet die with this process, but the raylet's dashboard and
            # runtime-env agents waited ~70 s for it before giving up: end all it started.
            started = descendants(os.getpid()) - before
            ray.shutdown()
            for pid in started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise
        except Exception as err:  # Ray raises plain Exceptions: "node timed out during startup"
            ray.shutdown()
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if attempt < tries:
                say(f"{what} did not start ({reason}); trying once more with longer start-up "
                    "timeouts")
                os.environ["RAY_raylet_start_wait_time_s"] = RETRY_RAYLET_WAIT_S
                continue
            hint = ("check the address and that this machine reaches it" if address else
                    "check free memory and free space in /tmp (Ray's object store and logs)")
            raise RayStartError(
                f"could not start {what}: {reason}; {hint}, or run without Ray: {without_ray}"
            ) from err
    if callable(on_sigterm):
        signal.signal(signal.SIGTERM, on_sigterm)
    resources = ray.cluster_resources()
    say(f"{what} is up after {time.perf_counter() - start:.1f} s "
         f"({resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs)")
    if forward is not None and not ray_logs:
        _forward_only(forward)
    try:
        yield ray
    finally:
        ray.shutdown()


def descendants(pid: int) -> set[int]:
    """The ids of the processes below `pid`: its children, theirs, and so on (Linux's /proc;
    elsewhere none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "pid (name)"
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def say(message: str) -> None:
    """A `ray: ...` line on stderr, for what a run does with Ray."""
    tqdm.write(f"ray: {message}", file=sys.stderr)  # above a progress bar, if one is drawn


def _forward_only(actor_class: str) -> None:
    """Print the output of `actor_class`'s actors only, not that of Ray's own (Ray Train's
    controller and helpers: resource requests, C++ error lines about their constructor arguments,
    the cleaner's traceback). Ray has no public hook for this: we wrap the handler that ray.init
    registers (tests/test_ray_startup.py checks that the workers' output still comes through)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    (print_logs,) = [handler for name, handler in dispatcher.handlers if name == "ray_print_logs"]
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler(
        "ray_print_logs", lambda data: data.get("actor_name") == actor_class and print_logs(data)
    )
