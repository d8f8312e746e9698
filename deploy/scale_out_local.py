"""Scale-out on one machine, as ``docs/scale-out.md`` describes it: one Mosquitto, one PostgreSQL,
N gateways with data dirs of their own, the broker's gateway password shared through
``mqtt.password_file``, cluster mode on.

    .venv/bin/python deploy/scale_out_local.py /tmp/snlp-cluster --gateways 3

Under DIR it writes ``broker/`` (the broker's data dir: ``snlpgw broker init``, the shared
``secrets/gateway.password``; provision boards and users against it: ``snlpgw provision
--data-dir DIR/broker NAME``) and ``gw1/`` … ``gwN/`` (each gateway's data dir and its
``gateway.log``). A throw-away PostgreSQL (``initdb``, trust authentication on 127.0.0.1, test
data only: durability off) runs too unless ``--store-url`` names a database. Every port is
picked free. Each step is printed as the shell command it is; ``DIR/cluster.json`` lists what
runs (pids, ports, URLs) and ``ready`` is printed once every gateway answers ``/healthz``.
Every ``SNLPGW_*`` variable given to this script reaches every gateway (catalog, lesson timing,
ASR engine, …); the per-gateway ones (id, data dir, ports) and the shared ones (broker URL,
password file, cluster, store URL) are set here over them.

A gateway that ends (killed, say) is reported and not restarted. SIGINT or SIGTERM stops the
gateways (SIGTERM: each publishes its retained ``online: false``), then the broker, then the
PostgreSQL, and exits 0. Linux only (children die with this script, even if it is killed).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parent.parent
READY_S = 120.0  # N gateway processes importing and connecting on a busy two-core machine
STOP_S = 20.0
PG_USER = "snlp"
PG_DB = "snlpgw"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RecipeError(RuntimeError):
    """A step failed; the message says which and why."""


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def shell(argv: list[str], env: dict[str, str] | None = None) -> str:
    """``argv`` (with ``env`` before it) as one would type it."""
    pairs = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join([*pairs, *(shlex.quote(a) for a in argv)])


def _die_with_parent() -> None:  # between fork and exec of every child
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child in a session of its own (a terminal's Ctrl-C reaches this script only, which
    stops the children in order), output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            argv,
            cwd=REPO,  # the settings' relative defaults (catalog/) are the repository's
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - this script runs no threads
        )


PORTS_EACH = 4  # a gateway's device HTTP, admin HTTP, UDP and console ports


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free for TCP and UDP alike, all held until every one
    is picked, from below the kernel's ephemeral range (no outgoing connection takes one)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    span = range(max(1024, low - 12_000), low)
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            port = secrets.choice(span)
            pair = [
                socket.socket(socket.AF_INET, k) for k in (socket.SOCK_STREAM, socket.SOCK_DGRAM)
            ]
            held += pair
            try:
                for sock in pair:
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken (or picked twice): another
            ports.append(port)
        return ports
    finally:
        for sock in held:
            sock.close()


def until(what: str, check: Callable[[], bool], timeout_s: float, alive: list[Proc]) -> None:
    """Poll ``check()`` (a server starting up has no event to wait on) until it is true, at
    most ``timeout_s``; a process of ``alive`` ending meanwhile fails at once with its log."""
    deadline = time.monotonic() + timeout_s
    while not check():
        for proc in alive:
            proc.check_running()
        if time.monotonic() > deadline:
            raise RecipeError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.1)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    stop_signal: int = signal.SIGTERM
    reported: bool = False

    def check_running(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RecipeError(f"{self.name} exited ({self.popen.returncode}):\n{tail}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(self.stop_signal)
            try:
                self.popen.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class Cluster:
    root: Path
    procs: list[Proc] = field(default_factory=list)  # in start order; stopped in reverse
    pg_dir: Path | None = None  # the throw-away PostgreSQL's directory (removed at the end)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                say(f"stopping {proc.name} (pid {proc.popen.pid})")
            proc.stop()
        if self.pg_dir is not None:
            shutil.rmtree(self.pg_dir, ignore_errors=True)


# -- PostgreSQL -----------------------------------------------------------------------------


def _pg_bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if found:
        return found[0].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RecipeError("no initdb: install the Debian package `postgresql` (make setup)")
    return Path(initdb).resolve().parent


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, its commands run as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start_postgres(cluster: Cluster, port: int) -> str:
    bindir = _pg_bindir()
    if os.geteuid() == 0:
        # Not under DIR: its parents may be closed to the postgres user (0700 root).
        root = Path(tempfile.mkdtemp(prefix="snlp-pg-"))
        os.chown(root, pwd.getpwnam("postgres").pw_uid, -1)
    else:
        root = cluster.root / "postgres"
        root.mkdir()
    cluster.pg_dir = root if os.geteuid() == 0 else None
    data = root / "data"
    init = _as_postgres(
        [
            *(str(bindir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust"),
            *("-E", "UTF8", "--no-sync", "--no-instructions"),
        ]
    )
    say(f"$ {shell(init)}")
    done = subprocess.run(init, capture_output=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise RecipeError(f"initdb failed: {done.stderr.decode(errors='replace')[-2000:]}")
    server = _as_postgres(
        [
            *(str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1"),
            *("-k", str(root), "-c", "fsync=off", "-c", "synchronous_commit=off"),
        ]
    )
    say(f"$ {shell(server)} &")
    proc = Proc("postgresql", spawn(server, root / "postgres.log"), root / "postgres.log")
    cluster.procs.append(proc)
    ready = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]
    until(
        "PostgreSQL accepting connections",
        lambda: subprocess.run(ready, check=False).returncode == 0,  # noqa: S603
        30.0,
        [proc],
    )
    create = [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, PG_DB]
    say(f"$ {shell(create)}")
    subprocess.run(create, check=True, capture_output=True)  # noqa: S603
    return f"postgresql://{PG_USER}@127.0.0.1:{port}/{PG_DB}"


# -- Mosquitto and the gateways -------------------------------------------------------------


def _snlpgw() -> str:
    beside = Path(sys.executable).with_name("snlpgw")
    found = str(beside) if beside.exists() else shutil.which("snlpgw")
    if found is None:
        raise RecipeError("no `snlpgw`: run this with the project's .venv/bin/python")
    return found


def start_broker(
    cluster: Cluster, port: int, device_port: int, snlpgw: str
) -> tuple[Path, str, Proc]:
    """Mosquitto in the production shape: the gateways' listener on ``port``, the devices' own
    on ``device_port`` (client id := user name)."""
    data_dir = cluster.root / "broker"
    init = [snlpgw, "broker", "init", "--data-dir", str(data_dir), "--port", str(port),
            "--device-port", str(device_port)]  # fmt: skip
    say(f"$ {shell(init)}")
    subprocess.run(init, check=True, capture_output=True)  # noqa: S603
    config = data_dir / "mosquitto" / "mosquitto.conf"
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        raise RecipeError("no `mosquitto` binary (install it: make setup)")
    argv = [binary, "-c", str(config)]
    say(f"$ {shell(argv)} &")
    log = data_dir / "mosquitto.log"
    proc = Proc("mosquitto", spawn(argv, log), log)
    cluster.procs.append(proc)

    def accepts() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        except OSError:
            return False
        return True  # Mosquitto opens its listener after reading its password and ACL files

    until("Mosquitto listening", accepts, 15.0, [proc])
    return data_dir, f"mqtt://127.0.0.1:{port}", proc


def _healthy(admin_port: int) -> bool:
    url = f"http://127.0.0.1:{admin_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False  # not listening yet, or 503: the broker connection is not up yet


def start_gateways(
    cluster: Cluster, count: int, shared: dict[str, str], ports: list[int], snlpgw: str
) -> list[dict[str, object]]:
    inherited = dict(os.environ)
    started: list[tuple[Proc, int, dict[str, object]]] = []
    for n in range(1, count + 1):
        http, admin, udp, console = ports[PORTS_EACH * (n - 1) : PORTS_EACH * n]
        data_dir = cluster.root / f"gw{n}"
        data_dir.mkdir()
        own = {
            "SNLPGW_GATEWAY_ID": f"gw{n}",
            "SNLPGW_DATA_DIR": str(data_dir),
            **shared,
            "SNLPGW_HTTP__PORT": str(http),
            "SNLPGW_HTTP__ADMIN_PORT": str(admin),
            "SNLPGW_UDP__PORT": str(udp),
            "SNLPGW_HTTP__CONSOLE_PORT": str(console),
        }
        argv = [snlpgw, "run"]
        say(f"$ {shell(argv, own)} &")
        log = data_dir / "gateway.log"
        proc = Proc(f"gateway gw{n}", spawn(argv, log, {**inherited, **own}), log)
        cluster.procs.append(proc)
        info: dict[str, object] = {
            "id": f"gw{n}",
            "pid": proc.popen.pid,
            "data_dir": str(data_dir),
            "log": str(log),
            "http_port": http,
            "admin_port": admin,
            "udp_port": udp,
            "console_port": console,
        }
        started.append((proc, admin, info))
    procs = [p for p, _, _ in started]
    for proc, admin, _ in started:
        until(f"{proc.name} healthy", functools.partial(_healthy, admin), READY_S, procs)
    return [info for _, _, info in started]


# -- the script -----------------------------------------------------------------------------


class Stop(Exception):
    pass


def _on_signal(signum: int, _: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def run(root: Path, count: int, store_url: str | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise RecipeError(f"{root} is not empty: give a new directory")
    cluster = Cluster(root)
    try:
        snlpgw = _snlpgw()
        pg_port, mqtt_port, device_port, *gw_ports = free_ports(3 + PORTS_EACH * count)
        postgres: dict[str, object] | None = None
        if store_url is None:
            say("# 1. PostgreSQL: one database the gateways share (a throw-away server here)")
            store_url = start_postgres(cluster, pg_port)
            postgres = {"pid": cluster.procs[-1].popen.pid, "port": pg_port}
        say("# 2. Mosquitto: its data dir holds the gateway password every gateway shares")
        broker_dir, broker_url, broker = start_broker(cluster, mqtt_port, device_port, snlpgw)
        password_file = broker_dir / "secrets" / "gateway.password"
        shared = {
            "SNLPGW_MQTT__URL": broker_url,
            "SNLPGW_MQTT__PASSWORD_FILE": str(password_file),
            "SNLPGW_CLUSTER__ENABLED": "true",
            "SNLPGW_STORE__URL": store_url,
        }
        say(f"# 3. {count} gateways: own id, data dir and ports; the broker's password, one store")
        gateways = start_gateways(cluster, count, shared, gw_ports, snlpgw)
        manifest = {
            "pid": os.getpid(),
            "store_url": store_url,
            "postgres": postgres,  # the throw-away server (null: --store-url was given)
            "broker": {
                "url": broker_url,
                "devices_port": device_port,  # devices' listener (provision prints its URL)
                "data_dir": str(broker_dir),
                "pid": broker.popen.pid,
                "password_file": str(password_file),
            },
            "gateways": gateways,
        }
        (root / "cluster.json").write_text(json.dumps(manifest, indent=2) + "\n")
        say("# 4. boards and users: provisioned against the broker's data dir, e.g.")
        say(f"$ {shell([snlpgw, 'provision', '--data-dir', str(broker_dir), 'aa_bb_cc_00_00_01'])}")
        for gw in gateways:
            say(f"{gw['id']}: pid {gw['pid']}, admin http://127.0.0.1:{gw['admin_port']}, "
                f"udp {gw['udp_port']}, log {gw['log']}")  # fmt: skip
        say(f"ready: {count} gateways on {broker_url}, store {store_url}; Ctrl-C stops them all")
        watch(cluster)
    except Stop as stop:
        say(f"{stop}: stopping")
    finally:
        for sig in STOP_SIGNALS:  # a second Ctrl-C does not cut the stopping short
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()
        say("stopped")


def watch(cluster: Cluster) -> None:
    """Report each child that ends, until a stop signal (raised as :class:`Stop`)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # for sigtimedwait
    while True:
        for proc in cluster.procs:
            if not proc.reported and proc.popen.poll() is not None:
                proc.reported = True
                say(f"{proc.name} exited ({proc.popen.returncode}); not restarted")
        signal.sigtimedwait([signal.SIGCHLD], 1.0)  # woken by a child ending


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="a new directory for the data dirs and logs")
    parser.add_argument("--gateways", type=int, default=3, help="how many gateways (3)")
    parser.add_argument(
        "--store-url", default=None, help="an existing PostgreSQL database (default: throw-away)"
    )
    args = parser.parse_args(argv)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        run(args.dir.resolve(), args.gateways, args.store_url)
    except RecipeError as exc:
        sys.stderr.write(f"scale_out_local: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
