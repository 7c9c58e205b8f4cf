# Two set-up commands: `make serve` and `make test`. Both create .venv when missing.
# The venv is made from Debian's own python3 when it can make one: Debian builds it with
# profile-guided optimisation and LTO, and it runs nestgate's request path 20-25% faster
# (pure Python about 2.4x faster) than a plain source build such as pyenv's default,
# which may come first on PATH. Another python3 only when Debian's has no venv module
# (`make test` installs python3-venv first; `make serve PYTHON=...` picks one).
PYTHON ?= $(shell /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null \
                  && echo /usr/bin/python3 || echo python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: serve test bench bench-quick debian-deps clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

serve: $(STAMP)
	$(PY) -m nestgate serve

# Debian tools the tests and benchmarks drive (nginx as a peer and upstream, with its
# grpc module as an h2c client and its auth_request module in front of nestgate as the
# forward-auth provider (Debian's nginx package has both), Caddy as a peer and with
# forward_auth, wrk, h2load, headless Chromium for the pages, promtool from the
# prometheus package for the metrics, redis-server and HAProxy for scale-out, Pebble
# as the ACME CA, BIND for DNS-01, PowerDNS with its SQLite backend as a DNS provider's
# API, certutil for Chromium's trust store, curl as a verifying client, Go to build
# tests/goclient (Go's net/http as an HTTP/2 client), python3-venv for the documented
# install under /opt, valgrind for the bench's instruction counts, perf for its CPU
# profiles, Apache with mod_auth_openidc as a relying party of nestgate's OpenID provider, CrowdSec's Local
# API and cscli for the bouncer, glewlwyd as the OpenID provider of the "Sign in with
# ..." tests), php-cgi as a FastCGI PHP behind Caddy's php_fastcgi (what a PHP app reads
# of the identity headers).
# Installed only when missing and only when running as root. crowdsec's post-install
# registers with CrowdSec's central API, which fails offline and leaves dpkg with a
# broken package (every later apt-get install fails too); a non-empty
# /etc/crowdsec/online_api_credentials.yaml written first turns that registration off
# (the package's README.Debian), and the tests run its Local API alone.
debian-deps:
	@missing=""; \
	command -v nginx  >/dev/null || missing="$$missing nginx"; \
	command -v caddy  >/dev/null || missing="$$missing caddy"; \
	command -v wrk    >/dev/null || missing="$$missing wrk"; \
	command -v h2load >/dev/null || missing="$$missing nghttp2-client"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v haproxy >/dev/null || missing="$$missing haproxy"; \
	command -v pebble >/dev/null || missing="$$missing pebble"; \
	test -x /usr/sbin/named || missing="$$missing bind9"; \
	test -x /usr/sbin/pdns_server || missing="$$missing pdns-server"; \
	test -e /usr/share/doc/pdns-backend-sqlite3/schema.sqlite3.sql || \
	  missing="$$missing pdns-backend-sqlite3"; \
	command -v certutil >/dev/null || missing="$$missing libnss3-tools"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v callgrind_control >/dev/null || missing="$$missing valgrind"; \
	command -v perf >/dev/null || missing="$$missing linux-perf"; \
	command -v go >/dev/null || missing="$$missing golang-go"; \
	command -v apache2 >/dev/null || test -x /usr/sbin/apache2 || missing="$$missing apache2"; \
	test -e /usr/lib/apache2/modules/mod_auth_openidc.so || \
	  missing="$$missing libapache2-mod-auth-openidc"; \
	command -v glewlwyd >/dev/null || missing="$$missing glewlwyd"; \
	command -v php-cgi >/dev/null || missing="$$missing php-cgi"; \
	/usr/bin/python3 -c "import ensurepip" 2>/dev/null || missing="$$missing python3-venv"; \
	command -v cscli >/dev/null || missing="$$missing crowdsec"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    case "$$missing" in *crowdsec*) mkdir -p /etc/crowdsec; \
	      test -s /etc/crowdsec/online_api_credentials.yaml || \
	        echo "# no central API: the Local API runs alone" \
	          > /etc/crowdsec/online_api_credentials.yaml;; esac; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing Debian packages:$$missing (run as root or apt-get install them)"; fi; \
	fi

test: debian-deps $(STAMP)
	$(PY) -m pytest

bench-quick: debian-deps $(STAMP)
	$(PY) -m nestgate bench --quick

bench: debian-deps $(STAMP)
	$(PY) -m nestgate bench

clean:
	rm -rf $(VENV) results .pytest_cache
