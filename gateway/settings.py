"""The one frozen settings tree, built once at start-up and passed down.

Sources, highest first: keyword arguments, ``SNLPGW_*`` environment variables (nested with
``__``, e.g. ``SNLPGW_MQTT__URL``), an optional TOML file (``snlpgw --config FILE``), defaults.
Components take the section they need as a keyword argument; none reads the environment.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    AnyUrl,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SecretStr,
    UrlConstraints,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MqttDsn(AnyUrl):
    """``mqtt://host[:port]`` (port 1883) or ``mqtts://host[:port]`` (TLS, port 8883), parsed
    and checked by pydantic: another scheme, no host or a port past 65535 is refused."""

    _constraints = UrlConstraints(allowed_schemes=["mqtt", "mqtts"], host_required=True)


class MqttSettings(_Section):
    url: MqttDsn = Field(
        MqttDsn("mqtt://127.0.0.1:1883"),
        description="Broker URI (mqtt:// or mqtts://: TLS 1.2+, the broker's certificate and "
        "host name verified).",
    )
    ca_file: Path | None = Field(
        None,
        description="PEM bundle of the CA(s) trusted for the broker's certificate instead of "
        "the system's store (mqtts:// only; read at start and at each connect).",
    )
    cert_file: Path | None = Field(
        None,
        description="Client certificate (PEM, its chain may follow) for a broker that requires "
        "one; with key_file (mqtts:// only).",
    )
    key_file: Path | None = Field(
        None,
        description="The client certificate's private key (PEM, not encrypted; keep it 0600); "
        "with cert_file.",
    )
    username: str = Field("snlp-gateway", description="Gateway broker user.")
    password: str | None = Field(
        None,
        description="Gateway broker password (wins over password_file; never logged). Both "
        "unset: read from <data_dir>/secrets/gateway.password.",
    )
    password_file: Path | None = Field(
        None,
        description="File holding the gateway broker password (one line), used when password "
        "is unset: the broker's <data_dir>/secrets/gateway.password, which every gateway of a "
        "cluster shares. Missing or empty: `snlpgw run` refuses to start.",
    )
    keepalive_s: int = Field(30, ge=5, le=600, description="MQTT keep-alive of the gateway.")
    reconnect_min_s: float = Field(0.5, gt=0, description="First reconnect back-off.")
    reconnect_max_s: float = Field(15.0, gt=0, description="Reconnect back-off cap.")
    outbound_queue: int = Field(
        10_000,
        ge=100,
        description="Task events, assessment results and ops publishes buffered while the "
        "broker is away or slow (drop-oldest, counted).",
    )
    control_queue: int = Field(
        10_000,
        ge=100,
        description="Board commands, control replies and presence buffered while the broker is "
        "away or slow (never dropped; past it the newest is refused, counted).",
    )
    max_inflight: int = Field(
        20,
        ge=1,
        description="Publishes awaiting the broker's PUBACK at once (sent in order); never "
        "more than the broker's Receive Maximum (Mosquitto: max_inflight_messages).",
    )
    publish_links: int = Field(
        0,
        ge=0,
        le=8,
        description="Publish-only broker connections beside the main one: each adds "
        "max_inflight publishes in flight (the broker's Receive Maximum caps each "
        "connection); a topic always uses the same connection, so its order is kept. "
        "They help when PUBACK round trips limit the window, not when the gateway's core is "
        "full (docs/scale-out.md).",
    )
    max_payload_bytes: int = Field(
        8192, ge=512, description="Inbound payloads over this are dropped."
    )
    session_expiry_s: int = Field(
        300,
        ge=0,
        le=86_400,
        description="How long the broker keeps the gateway's session (subscriptions, queued "
        "QoS 1 messages) after its connection ends; the gateway resumes it on reconnect, so no "
        "board message is lost to a reconnect shorter than this. 0: a clean session each time.",
    )
    broker_max_packet_bytes: int = Field(
        65_536,
        ge=4096,
        description="The broker's max_packet_size: a bigger publish is dropped (counted), "
        "since the broker would disconnect the gateway for it.",
    )

    @model_validator(mode="after")
    def _tls_files(self) -> MqttSettings:
        """TLS files only with TLS, and a client certificate only with its key (the files
        themselves are read when the gateway starts: :mod:`gateway.mqtt.tls`)."""
        for given, missing in (("cert_file", "key_file"), ("key_file", "cert_file")):
            if getattr(self, given) is not None and getattr(self, missing) is None:
                raise ValueError(
                    f"mqtt.{given} is set without mqtt.{missing}: a client certificate needs "
                    "both (or set neither)"
                )
        named = [n for n in ("ca_file", "cert_file", "key_file") if getattr(self, n) is not None]
        if named and not self.tls:
            raise ValueError(
                f"mqtt.{' and mqtt.'.join(named)} {'is' if len(named) == 1 else 'are'} for TLS, "
                f"but mqtt.url is {self.url.scheme}://: use an mqtts:// URL (or unset "
                f"{'it' if len(named) == 1 else 'them'})"
            )
        return self

    @property
    def host(self) -> str:
        """The broker's host as a socket takes it (an IPv6 literal without its brackets)."""
        return (self.url.host or "127.0.0.1").strip("[]").lower()

    @property
    def port(self) -> int:
        return self.url.port or (8883 if self.tls else 1883)

    @property
    def tls(self) -> bool:
        return self.url.scheme == "mqtts"


class HttpSettings(_Section):
    host: str = Field("127.0.0.1", description="Device-facing HTTP bind address (OTA, healthz).")
    port: int = Field(8003, ge=0, le=65535, description="HTTP port (8003 is the xiaozhi OTA port).")
    admin_host: str = Field(
        "127.0.0.1",
        description="Admin HTTP bind address (metrics, task API, device approval, healthz).",
    )
    admin_port: int = Field(8004, ge=0, le=65535, description="Admin HTTP port.")
    media_base_url: str | None = Field(
        None,
        pattern=r"^https?://[^/?#]+$",
        description="Where boards fetch lesson audio from (the device listener as they reach "
        "it, e.g. http://192.168.1.10:8003); default: http://{host}:{bound port}.",
    )
    console_host: str = Field(
        "127.0.0.1",
        description="Console (web pages for parents, teachers, operators) bind address; boards "
        "never reach it (its own listener, password logins; docs/console.md).",
    )
    console_port: int = Field(8005, ge=0, le=65535, description="Console HTTP port.")
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token the admin listener requires (unset: none, loopback only; "
        "never logged).",
    )

    @model_validator(mode="after")
    def _admin_guarded(self) -> HttpSettings:
        """The admin listener approves devices: beyond loopback it must require a token (an
        empty token would silently require none)."""
        token = self.admin_token
        if token is not None and not token.get_secret_value():
            raise ValueError("http.admin_token is empty: set a token or leave it unset")
        if token is None and not _is_loopback(self.admin_host):
            raise ValueError(
                f"http.admin_host {self.admin_host!r} is not loopback: set http.admin_token "
                "(anyone reaching the admin listener could approve devices)"
            )
        return self


class ConsoleSettings(_Section):
    enabled: bool = Field(True, description="Serve the console on http.console_host:console_port.")
    session_hours: float = Field(12.0, gt=0, le=24 * 30, description="A login lasts this long.")
    secure_cookies: bool = Field(
        False,
        description="Always mark cookies Secure (set behind a TLS proxy; over HTTPS they are "
        "Secure anyway).",
    )
    login_failures: int = Field(
        5, ge=1, description="Failed logins per address or user name per minute before refusal."
    )
    timezone: str = Field("Asia/Shanghai", description="Times on the pages are shown in this zone.")
    bootstrap: bool = Field(
        True,
        description="With no account at start, create operator 'admin' with a random password "
        "written to <data_dir>/console-bootstrap.txt (mode 0600).",
    )


class UdpSettings(_Section):
    host: str = Field("127.0.0.1", description="UDP audio bind address.")
    port: int = Field(8884, ge=0, le=65535, description="UDP audio port.")
    public_host: str | None = Field(
        None, description="Host announced to devices in the hello reply (default: bind host)."
    )
    public_port: int | None = Field(
        None, description="Port announced to devices (default: bound port)."
    )


class XiaozhiSettings(_Section):
    uplink_topic: str = Field("device-server/{dev}", description="Device → gateway control topic.")
    downlink_topic: str = Field("devices/p2p/{dev}", description="Gateway → device control topic.")
    session_idle_s: float = Field(150.0, gt=0, description="Close a voice session idle this long.")
    rebind_after_s: float = Field(
        30.0,
        gt=0,
        description="Move a session to a new UDP source (NAT rebinding) only after the bound one "
        "was silent this long, and only on a datagram that decrypts to the session's Opus frames.",
    )
    max_sessions: int = Field(
        1000, ge=1, description="Open voice sessions at most (hellos beyond are not answered)."
    )
    hellos_per_minute: float = Field(
        12.0, gt=0, description="Hellos a device may send per minute after its burst."
    )
    hello_burst: int = Field(5, ge=1, description="Hellos a device may send back to back.")
    ota_mqtt_endpoint: str | None = Field(
        None,
        description="host:port given to devices by OTA (default: the broker's host with the "
        "generated config's device listener port, else the broker's host:port).",
    )
    ota_keepalive_s: int = Field(
        240,
        ge=30,
        le=600,
        description="Keep-alive given to devices by OTA (broker max_keepalive is 600).",
    )
    firmware_version: str = Field("0.0.0", description="Firmware version reported by OTA.")
    ota_policy: Literal["open", "bind", "allowlist"] = Field(
        "bind",
        description="OTA trust: bind = first Client-Id per MAC, others need approval; "
        "allowlist = bind, and only listed MACs; open = anyone (lab only).",
    )
    ota_allowlist: tuple[str, ...] = Field((), description="MACs allowed by policy allowlist.")
    ota_allowlist_file: Path | None = Field(
        None, description="File of allowed MACs, one a line (policy allowlist; read at start)."
    )
    ota_hmac_keys_file: Path | None = Field(
        None,
        description='JSON {"serial": "hex key"} of boards answering HMAC challenges '
        "(Activation-Version 2).",
    )
    ota_code_ttl_s: float = Field(600.0, gt=0, description="Activation codes expire after this.")
    ota_max_pending: int = Field(256, ge=1, le=10_000, description="Activation codes pending.")
    ota_users_per_hour: int = Field(
        60, ge=1, description="New devices (broker users) OTA may create per hour."
    )
    ota_max_devices: int = Field(10_000, ge=1, description="Devices OTA may bind in all.")
    ota_ip_per_min: float = Field(
        60.0, gt=0, description="OTA requests per minute per client IP (token bucket)."
    )
    ota_ip_burst: int = Field(60, ge=1, description="OTA request burst per client IP.")
    ota_mac_per_min: float = Field(
        30.0,
        gt=0,
        description="OTA requests per minute per MAC and Client-Id (a board polls every 3 s).",
    )
    ota_mac_burst: int = Field(15, ge=1, description="OTA request burst per MAC and Client-Id.")
    ota_workers: int = Field(
        2, ge=1, le=16, description="Threads of the OTA executor (files, broker reload, polls)."
    )
    ota_max_inflight: int = Field(
        16, ge=1, description="OTA requests in progress at once; more get 503."
    )
    overload_lag_ms: float = Field(
        10.0,
        ge=0,
        description="Voice overload: when every event-loop lag probe of an interval is later "
        "than this, fewer lesson listen windows are decoded (the rest are archived undecoded, "
        "their steps stored with assessment_shed=voice_overload); 0 = always decode. CHAT and "
        "task-DSL windows are always decoded.",
    )
    overload_interval_ms: float = Field(
        500.0, gt=0, description="Voice overload: the interval judged (probes every 50 ms)."
    )


class BoardSettings(_Section):
    ack_timeout_s: float = Field(
        3.0,
        gt=0,
        description="Resend a command not acked within this of leaving the gateway.",
    )
    max_resends: int = Field(
        3, ge=0, description="Resends of one command while the board is online."
    )
    resend_backoff: float = Field(
        2.0, ge=1.0, description="Each resend of a command waits this many times longer."
    )
    default_ttl_ms: int = Field(
        30_000, gt=0, description="Command lifetime when the caller gives none."
    )
    outbox_limit: int = Field(
        64, ge=1, description="Queued commands per device (overflow: refuse newest)."
    )
    max_devices: int = Field(
        10_000,
        ge=1,
        description="Boards tracked (presence, outbox); beyond it the idle offline ones are "
        "forgotten, then new boards refused. Scale-out: every gateway tracks every board of "
        "its cluster, so at least the cluster's board count.",
    )
    max_in_flight: int = Field(
        4, ge=1, description="Commands sent to one board before the oldest is acked (in order)."
    )
    heartbeat_s: float = Field(30.0, gt=0, description="Board heartbeat period.")
    missed_heartbeats: int = Field(
        3, ge=1, description="Missed heartbeats before a board is offline."
    )
    flap_window_s: float = Field(300.0, gt=0, description="Window for counting presence changes.")
    flap_threshold: int = Field(
        6, ge=2, description="Presence changes in the window that raise an alarm."
    )


class RuntimeSettings(_Section):
    catalog_path: Path = Field(
        Path("catalog"), description="Task catalog: a JSON file or a directory of them."
    )
    resource_dir: Path = Field(
        Path("catalog/resources"), description="Local resource directory (clip .txt transcripts)."
    )
    min_window_ms: int = Field(800, ge=0, description="Shortest listen window.")
    completion_grace_ms: int = Field(
        5_000, ge=0, description="Watchdog grace past a clip's known duration."
    )
    completion_max_ms: int = Field(
        120_000, gt=0, description="Watchdog when the clip duration is unknown."
    )
    offline_grace_s: float = Field(
        300.0, ge=0, description="Paused-by-offline instances resume within this."
    )
    exit_phrases: tuple[str, ...] = Field(
        ("stop the lesson", "退出"), description="Phrases that exit a task."
    )
    start_rate_per_s: float = Field(
        500.0,
        gt=0,
        description="Start, restart and resume requests admitted per second: a herd is spread "
        "out so its steps fit one core (a lesson keeps its phase for all its steps).",
    )
    start_burst: int = Field(20, ge=1, description="Requests admitted at once after a lull.")
    start_max_wait_s: float = Field(
        5.0,
        ge=0,
        description="Longest a start, restart or resume request waits for admission; one that "
        "would wait longer is refused `overloaded` at once.",
    )


class AsrSettings(_Section):
    engine: Literal["pocketsphinx", "http", "none"] = Field(
        "pocketsphinx", description="ASR engine."
    )
    http_url: str = Field(
        "http://127.0.0.1:8000/v1/audio/transcriptions",
        description="OpenAI-compatible ASR endpoint.",
    )
    http_model: str = Field("whisper-1", description="Model name sent to the HTTP engine.")
    http_timeout_s: float = Field(10.0, gt=0, description="HTTP engine timeout per attempt.")
    http_retries: int = Field(2, ge=0, description="HTTP engine retries (5xx, timeouts).")
    workers: int = Field(1, ge=1, le=16, description="ASR worker processes.")
    queue_limit: int = Field(32, ge=1, description="Pending ASR jobs (overflow: drop oldest).")
    job_timeout_s: float = Field(
        30.0, gt=0, description="A job running longer is abandoned, its worker replaced."
    )
    catch_up_interval_s: float = Field(
        10.0,
        ge=0,
        description="How often the gateway looks for steps shed under load (asr_saturated, "
        "queue_full, voice_overload) whose answer is archived, and assesses them (at most one "
        "per ASR worker) while its ASR is idle and its loop is not overloaded; 0 = off "
        "(`snlpgw reassess` only).",
    )


class StoreSettings(_Section):
    url: str | None = Field(
        None,
        description="Store database: unset (embedded SQLite at sqlite_path), sqlite:///FILE, "
        "or postgresql://user:pass@host:port/db (shared by several gateways).",
    )
    sqlite_path: Path | None = Field(
        None, description="SQLite file (default: <data_dir>/gateway.sqlite3)."
    )
    manager_url: str | None = Field(
        None, description="External manager API base URL (PUT /task/instance/{id})."
    )
    manager_secret: str | None = Field(None, description="Server secret sent to the manager API.")
    manager_retries: int = Field(3, ge=0, description="Manager API retries per snapshot.")

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("sqlite", "postgresql", "postgres"):
            raise ValueError("expected sqlite:///FILE or postgresql://…")
        return v


class ArchiveSettings(_Section):
    """The learning record's audio archive (gateway/archive; docs/privacy.md)."""

    enabled: bool = Field(True, description="Keep each lesson step's answer as Ogg Opus.")
    chat_turns: bool = Field(
        False,
        description="Also keep what a child says in CHAT (off: CHAT turns are never archived). "
        "Kept under the instance id chat-<session id>, one row per turn; retention, quota and "
        "forget apply as for lesson answers.",
    )
    dir: Path | None = Field(
        None, description="Filesystem archive directory (default: <data_dir>/audio)."
    )
    s3_url: str | None = Field(
        None,
        description="S3-compatible endpoint (http(s)://host:port); set: audio goes to the "
        "bucket instead of the filesystem (several gateways share it).",
    )
    s3_bucket: str = Field("snlpgw-audio", description="S3 bucket (created if missing).")
    s3_region: str = Field("us-east-1", description="S3 region name.")
    s3_access_key: SecretStr | None = Field(None, description="S3 access key id.")
    s3_secret_key: SecretStr | None = Field(None, description="S3 secret access key.")
    retention_days: float = Field(
        30.0, gt=0, description="Archived audio older than this is erased by the sweeper."
    )
    sweep_interval_s: float = Field(3600.0, gt=0, description="Retention sweeper period.")
    device_quota_mb: float = Field(
        50.0, gt=0, description="Per-device archive size; past it the oldest answers go."
    )
    queue_limit: int = Field(
        256, ge=1, description="Answers waiting to be written (overflow: dropped, counted)."
    )
    max_utterance_s: float = Field(
        16.0, gt=0, le=120, description="Opus packets kept per listening session (seconds)."
    )
    link_ttl_s: int = Field(300, ge=1, le=86_400, description="Signed audio link lifetime.")
    link_secret: SecretStr | None = Field(
        None,
        description="HMAC key of signed audio links, the admin API's and the console's (a "
        "key per use and per device is derived from it; unset: random per process, so links "
        "die with a restart; set the same value on every gateway behind one balancer).",
    )


class ClusterSettings(_Section):
    enabled: bool = Field(
        False,
        description="Scale-out: several gateways on one broker and one PostgreSQL store; each "
        "device is owned by one live gateway (rendezvous hashing over the retained gateway "
        "statuses). Off: this gateway serves every device.",
    )
    handover_delay_s: float = Field(
        1.0,
        ge=0,
        description="A gateway gaining devices resumes their running lessons from the store "
        "this long after the membership change (the previous owner, if alive, stops first).",
    )


class OpsSettings(_Section):
    metrics_interval_s: float = Field(10.0, gt=0, description="Metrics snapshot period.")
    log_level: str = Field("INFO", description="Log level.")
    log_json: bool = Field(False, description="Structured JSON logs.")
    shutdown_timeout_s: float = Field(5.0, gt=0, description="Graceful shutdown budget.")
    gc_freeze: bool = Field(
        True,
        description="At start, freeze the heap built so far out of the garbage collector: full "
        "collections (loop pauses) then walk only what lessons create (gateway/gcwatch.py).",
    )
    gc_thresholds: tuple[PositiveInt, PositiveInt, PositiveInt] | None = Field(
        (700, 100, 10),
        description="At start, the garbage collector's thresholds (`gc.set_threshold`; "
        "environment: a JSON list such as `[700, 10, 10]`, the interpreter's own; null leaves "
        "those in force). 100 young collections per middle one, not 10, make full collections "
        "(loop pauses) several times rarer at 1,000 lessons; cyclic garbage waits longer "
        "(gateway/gcwatch.py). Not applied on 3.14+ (incremental collector).",
    )
    snapshot_max_bytes: int = Field(
        32_768,
        ge=2048,
        description="Cap of the retained metrics snapshot (below the broker's max_packet_size); "
        "beyond it the most detailed series are left out, counted.",
    )


class ChatSettings(_Section):
    enabled: bool = Field(True, description="Answer devices in CHAT mode (no task running).")
    upstream_url: str | None = Field(
        None,
        description="xiaozhi WebSocket server to bridge CHAT sessions to, e.g. "
        "ws://host:8000/xiaozhi/v1/ (unset: the embedded offline engine answers).",
    )
    token: str | None = Field(
        None, description="Upstream `Authorization: Bearer <token>` (unset: header omitted)."
    )
    framing: Literal["gateway", "1", "2", "3"] = Field(
        "gateway",
        description="Upstream binary audio framing: `gateway` (16-byte header, "
        "`?from=mqtt_gateway`) or the firmware's protocol version 1/2/3.",
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="Upstream connect + hello timeout.")
    backoff_min_s: float = Field(1.0, gt=0, description="Upstream retry back-off after a failure.")
    backoff_max_s: float = Field(30.0, gt=0, description="Upstream retry back-off cap.")
    silence_timeout_s: float = Field(
        5.0, gt=0, description="Prompt-listen silence before standby (reset by speech)."
    )
    reply_timeout_s: float = Field(
        20.0, gt=0, description="Wait for a reply after a segment ended before standby."
    )
    uplink_queue_frames: int = Field(
        50, ge=1, description="Uplink frames queued per session (overflow: drop oldest)."
    )
    downlink_queue_frames: int = Field(
        500, ge=1, description="Downlink frames queued per session (overflow: drop newest)."
    )
    tts_lead_s: float = Field(
        0.010,
        ge=0,
        le=2.0,
        description="Audio held after `tts start`: the control message goes through the broker, "
        "the audio straight over UDP, and the firmware drops audio that arrives before it "
        "handled `tts start` (measured hop: bench/results/chat_tts.md). Raise it where the "
        "broker's host is often busy.",
    )
    voice: str = Field("en-us", description="espeak-ng voice of the embedded engine.")
    voice_task: str = Field(
        "english_learning/shadowing/unit01",
        description='app/task/lesson that a spoken "start the lesson" starts (priority 1, '
        "source voice; embedded engine); empty: off.",
    )

    @field_validator("voice_task")
    @classmethod
    def _app_task_lesson(cls, value: str) -> str:
        if value and (value.count("/") != 2 or not all(value.split("/"))):
            raise ValueError("voice_task must be empty or app_id/task_id/lesson_id")
        return value

    @field_validator("upstream_url")
    @classmethod
    def _websocket_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("ws", "wss"):
            raise ValueError("upstream_url must be a ws:// or wss:// URL")
        return value


def _default_gateway_id() -> str:
    host = socket.gethostname().split(".")[0].lower()
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)
    return cleaned or "gw"


class SpeechSettings(_Section):
    enabled: bool = Field(
        True, description="Speak text and stream lesson clips to Xiaozhi devices."
    )
    engine: Literal["espeak", "http"] = Field(
        "espeak",
        description="TTS engine: `espeak` (espeak-ng, offline) or `http` (an OpenAI-compatible "
        "`POST /v1/audio/speech` server at `speech.http_url`).",
    )
    espeak_voices: dict[str, str] = Field(
        {"en": "en-us", "zh": "cmn"},
        description="Voice (`en`, `zh`) → espeak-ng voice.",
    )
    espeak_wpm: int = Field(150, ge=80, le=450, description="espeak-ng speaking rate (words/min).")
    http_url: str | None = Field(
        None, description="HTTP TTS endpoint, e.g. http://tts:8000/v1/audio/speech."
    )
    http_model: str = Field("tts-1", description="HTTP TTS `model`.")
    http_voices: dict[str, str] = Field(
        {"en": "alloy", "zh": "alloy"}, description="Voice (`en`, `zh`) → HTTP TTS `voice`."
    )
    http_timeout_s: float = Field(10.0, gt=0, description="HTTP TTS request timeout.")
    cache_bytes: int = Field(
        16 * 1024 * 1024, ge=0, description="Phrase cache budget (Opus bytes, LRU; 0: off)."
    )
    presynth: bool = Field(
        True,
        description="After start and each catalog reload, synthesize the catalog's fixed "
        "phrases (`speak` steps; the generators' questions, feedback and neutral lines) into "
        "the phrase cache in the background: one at a time, at `speech.presynth_nice`, never "
        "evicting (the shipped catalog: 132 phrases, ~0.4 MiB of `speech.cache_bytes`).",
    )
    presynth_nice: int = Field(
        19,
        ge=0,
        le=19,
        description="CPU niceness of that preparation (19: only what lessons leave idle; on a "
        "machine that is never idle it may not finish, and phrases are then synthesized on "
        "first use). The tests that wait for it use 0.",
    )
    max_utterance_s: float = Field(
        300.0, gt=0, description="Longest text or clip spoken at once (longer: refused)."
    )
    max_devices: int = Field(10_000, ge=1, description="Devices speaking at once (more: refused).")
    synth_concurrency: int = Field(
        2, ge=1, description="Syntheses / clip decodes running at once (CPU-bound)."
    )
    address_wait_s: float = Field(
        3.0, gt=0, description="Wait for a device's first datagram before speaking to it."
    )
    tts_lead_s: float = Field(
        0.2, ge=0, description="Audio held after `tts start` (the broker hop; see CHAT)."
    )

    @model_validator(mode="after")
    def _http_needs_url(self) -> SpeechSettings:
        if self.engine == "http" and not self.http_url:
            raise ValueError("speech.engine=http needs speech.http_url")
        return self


class Settings(BaseSettings):
    """Root settings; every field documented in docs/settings.md's table (generated)."""

    model_config = SettingsConfigDict(
        env_prefix="SNLPGW_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )
    toml_file: ClassVar[Path | None] = None

    gateway_id: str = Field(
        default_factory=_default_gateway_id,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="Gateway instance id used in ops/status topics.",
    )
    data_dir: Path = Field(
        Path(".data"), description="Generated credentials, SQLite, broker files."
    )
    mqtt: MqttSettings = MqttSettings()
    http: HttpSettings = HttpSettings()
    udp: UdpSettings = UdpSettings()
    xiaozhi: XiaozhiSettings = XiaozhiSettings()
    board: BoardSettings = BoardSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    asr: AsrSettings = AsrSettings()
    store: StoreSettings = StoreSettings()
    cluster: ClusterSettings = ClusterSettings()
    ops: OpsSettings = OpsSettings()
    chat: ChatSettings = ChatSettings()
    archive: ArchiveSettings = ArchiveSettings()
    speech: SpeechSettings = SpeechSettings()
    console: ConsoleSettings = ConsoleSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls.toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls.toml_file))
        return tuple(sources)

    @property
    def sqlite_path(self) -> Path:
        return self.store.sqlite_path or self.data_dir / "gateway.sqlite3"


def merge_sections(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``, where a dict updates that section field by field."""
    merged = dict(base)
    for key, value in overrides.items():
        current = merged.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            merged[key] = {**current, **value}
        else:
            merged[key] = value
    return merged


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings once: overrides > environment > TOML file > defaults."""
    if config is not None and not config.is_file():
        raise FileNotFoundError(f"config file not found: {config}")

    class _FromFile(Settings):
        toml_file: ClassVar[Path | None] = config

    built = _FromFile(**overrides)
    return Settings.model_validate(built.model_dump())
