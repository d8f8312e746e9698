# snlp gateway — the two commands: `make run` and `make test`.
# Both set up whatever is missing first (system packages via apt-get, a .venv with the project).

SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# System packages: libopus (decoder), mosquitto (broker + clients for provisioning and tests),
# espeak-ng and sox (real speech fixtures for tests and the demo; SPEAK's offline voice and its
# clip decoder, libsox-fmt-mp3 for MP3 lesson clips), systemd (only its offline
# tools: `systemd-analyze verify` checks deploy/systemd in the tests; ~5 MB, starts nothing),
# postgresql (the store's PostgreSQL tests start a throw-away server; the default is SQLite),
# ejabberd (only its MQTT 5 broker, mod_mqtt: the second, independent broker the client's core
# flows are tested against, tests/integration/test_second_broker.py; its service is disabled),
# opus-tools (opusdec: the learning record's tests decode archived answers with an independent
# decoder), chromium and fonts-noto-cjk (the console's browser tests drive Debian's chromium
# through Playwright, tests/integration/test_console_browser.py; without a CJK font Chinese
# renders as empty boxes).
APT_PKGS := libopus0 mosquitto mosquitto-clients espeak-ng sox libsox-fmt-mp3 systemd postgresql ejabberd opus-tools chromium fonts-noto-cjk

.PHONY: run test check lint typecheck unit integration setup system-deps venv bench load demo asyncapi clean

setup: system-deps venv

system-deps:
	@missing=""; \
	ldconfig -p | grep -q 'libopus.so.0' || missing="$$missing libopus0"; \
	command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing="$$missing mosquitto"; \
	command -v mosquitto_passwd >/dev/null || missing="$$missing mosquitto-clients"; \
	command -v mosquitto_sub >/dev/null || missing="$$missing mosquitto-clients"; \
	command -v espeak-ng >/dev/null || missing="$$missing espeak-ng"; \
	command -v sox >/dev/null || missing="$$missing sox"; \
	command -v opusdec >/dev/null || missing="$$missing opus-tools"; \
	sox -h 2>/dev/null | grep -q 'FILE FORMATS:.* mp3' || missing="$$missing libsox-fmt-mp3"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	ls -d /usr/lib/*/ejabberd-*/ebin >/dev/null 2>&1 || missing="$$missing ejabberd"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	ls /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc >/dev/null 2>&1 || missing="$$missing fonts-noto-cjk"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PKGS); \
	  $(SUDO) systemctl disable --now mosquitto >/dev/null 2>&1 || true; \
	  $(SUDO) service mosquitto stop >/dev/null 2>&1 || true; \
	  $(SUDO) service postgresql stop >/dev/null 2>&1 || true; \
	  $(SUDO) systemctl disable --now ejabberd >/dev/null 2>&1 || true; \
	  $(SUDO) service ejabberd stop >/dev/null 2>&1 || true; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml
	@[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,asr,bench]'
	@touch $(STAMP)

# Local broker with the project's configuration (auth + ACLs on), then the gateway, both
# supervised by `snlpgw dev-run` (gateway/devrun.py): SIGINT, SIGTERM or SIGHUP to make or its
# process group, or the terminal closing, stops the gateway and then the broker. Ports and the
# data dir come from SNLPGW_* (e.g. SNLPGW_MQTT__URL=mqtt://127.0.0.1:1884 make run).
run: setup
	@$(BIN)/snlpgw dev-run

lint: venv
	$(BIN)/ruff check gateway codec topics devstack tests bench deploy
	$(BIN)/ruff format --check gateway codec topics devstack tests bench deploy

typecheck: venv
	$(BIN)/mypy
	$(BIN)/mypy deploy/scale_out_local.py

check: lint typecheck

# The suite runs in TEST_WORKERS pytest-xdist workers (docs/testing.md): most integration tests
# wait on a broker, a socket or a subprocess, so 3 workers keep 2 cores busy without starving
# the lessons' timers. `--dist loadfile`: a file's tests stay on one worker, in order, and its
# module-scoped fixtures (a TLS broker, ejabberd, the speech models) start once.
# pytest-cov combines the workers' coverage.
TEST_WORKERS ?= 3

test: setup check
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile \
	  --cov --cov-report=term-missing:skip-covered --cov-fail-under=100

unit: venv
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile tests/integration tests/adversarial

bench: setup
	$(BIN)/python -m bench.codec_bench
	$(BIN)/python -m bench.mqtt_client_bench
	$(BIN)/python -m bench.hello_bench
	$(BIN)/python -m bench.hello_core_bench
	$(BIN)/python -m bench.session_footprint "make bench"
	$(BIN)/python -m bench.stream_path_bench "make bench"
	$(BIN)/python -m bench.ota_bench
	$(BIN)/python -m bench.asr_bench
	$(BIN)/python -m bench.assessment_bench
	$(BIN)/python -m bench.timer_bench
	$(BIN)/python -m bench.scale_bench
	$(BIN)/python -m bench.udp_attack_bench
	$(BIN)/python -m bench.chat_bench
	$(BIN)/python -m bench.load

# Load harness alone (bench/load): broker, gateway and simulated boards/devices as separate
# processes; N = 200/500/1,000 lessons, 1,000 Xiaozhi sessions, streaming vs the floor.
# Results, plots: bench/results/load/. A few minutes; stops by itself.
load: setup
	$(BIN)/python -m bench.load

demo: setup
	$(BIN)/python -m devstack.demo

asyncapi: venv
	$(BIN)/python -m devstack.asyncapi --write

clean:
	rm -rf $(VENV) .data .mypy_cache .pytest_cache .ruff_cache
