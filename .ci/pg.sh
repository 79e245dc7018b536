# Throwaway PostgreSQL for tests and benchmarks. Source it, then `pg_start` / `pg_stop`.
# With DATABASE_URL already set, nothing is started and that database is used.

pg_find_bin() {
  local d
  # Symlinks resolved: a PATH may link initdb alone, and the directory it lives in has the rest
  # (pg_basebackup for the failover test).
  for d in "$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")")" /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

pg_install() {
  echo "PostgreSQL binaries not found; installing with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
}

pg_free_port() {
  python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

# Runs a PostgreSQL binary as the `postgres` user when we are root (initdb refuses root).
pg_as_owner() {
  if [ "$(id -u)" = "0" ]; then
    su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
  else
    "$@"
  fi
}

pg_start() {
  if [ -n "${DATABASE_URL:-}" ]; then
    echo "Using DATABASE_URL from the environment" >&2
    PG_STARTED=0
    return 0
  fi
  local bin
  bin=$(pg_find_bin) || { pg_install && bin=$(pg_find_bin); } || { echo "cannot find or install PostgreSQL" >&2; return 1; }
  PG_DIR=$(mktemp -d /tmp/queen-pg.XXXXXX)
  if [ "$(id -u)" = "0" ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$PG_DIR" --shell /bin/sh postgres
    chown postgres "$PG_DIR"
  fi
  PG_PORT=$(pg_free_port)
  pg_as_owner "$bin/initdb" -D "$PG_DIR/data" -U postgres --auth=trust --no-sync -E UTF8 >"$PG_DIR/initdb.log" 2>&1 \
    || { cat "$PG_DIR/initdb.log" >&2; return 1; }
  PG_BIN=$bin
  PG_TLS_OPTS=""
  if [ "${PG_WITH_TLS:-0}" = "1" ]; then
    pg_make_certs || return 1
    PG_TLS_OPTS="-c ssl=on -c ssl_cert_file=$PG_DIR/tls/server.crt -c ssl_key_file=$PG_DIR/tls/server.key"
  fi
  pg_launch || return 1
  PG_STARTED=1
  export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  echo "Started PostgreSQL on port $PG_PORT (data in $PG_DIR)" >&2
}

# TLS for the server (PG_WITH_TLS=1, the test command): a throwaway CA, a server certificate it
# signs for the name localhost only, and an unrelated CA. Exports PG_TLS_CA and PG_TLS_OTHER_CA
# for the TLS tests (server/tests/pg_tls.rs).
pg_make_certs() {
  local d="$PG_DIR/tls"
  mkdir -p "$d"
  local ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  local ca_ext="-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
  openssl req -x509 $ec -days 2 -subj "/CN=queen test CA" -keyout "$d/ca.key" -out "$d/ca.crt" $ca_ext 2>/dev/null \
    && openssl req -x509 $ec -days 2 -subj "/CN=another CA" -keyout "$d/other_ca.key" -out "$d/other_ca.crt" $ca_ext 2>/dev/null \
    && openssl req $ec -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null \
    && printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' >"$d/server.ext" \
    && openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
         -extfile "$d/server.ext" -out "$d/server.crt" 2>/dev/null \
    || { echo "cannot make the TLS certificates (openssl)" >&2; return 1; }
  chmod 600 "$d/server.key"
  if [ "$(id -u)" = "0" ]; then chown -R postgres "$d"; fi
  export PG_TLS_CA="$d/ca.crt" PG_TLS_OTHER_CA="$d/other_ca.crt"
}

# Starts the server of PG_DIR on PG_PORT (first start, or again after pg_pause stopped it).
pg_launch() {
  # Durability settings off: this database is thrown away after the run. PG_EXTRA_OPTS: more
  # server options (scale investigations pass `-c shared_buffers=2GB`; the benchmark and the
  # tests run with PostgreSQL's defaults).
  pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 start \
    -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 -c shared_preload_libraries=pg_stat_statements ${PG_TLS_OPTS:-} ${PG_EXTRA_OPTS:-}" >/dev/null \
    || { cat "$PG_DIR/server.log" >&2; return 1; }
}

# Stops the server of PG_DIR (fast shutdown: sessions are terminated) and keeps its data, for
# pg_launch to start it again. For the fault tests (server/tests/faults.rs).
pg_halt() {
  pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null
}

# An outage: pg_halt, the given seconds, pg_launch on the same port.
pg_pause() {
  pg_halt || return 1
  sleep "$1"
  pg_launch
}

# A streaming standby of PG_DIR's server (pg_basebackup -R), started on a port of its own,
# which it prints. For the failover test (server/tests/faults.rs); pg_stop stops it too.
pg_add_standby() {
  local port
  port=$(pg_free_port)
  pg_as_owner "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -D "$PG_DIR/standby" -R -X stream >/dev/null \
    || return 1
  pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/standby" -l "$PG_DIR/standby.log" -w -t 60 start \
    -o "-p $port -k $PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=300" >/dev/null \
    || { cat "$PG_DIR/standby.log" >&2; return 1; }
  echo "$port"
}

# A failover: PG_DIR's server crashes (immediate stop: no shutdown checkpoint, sessions cut) and
# the standby pg_add_standby made is promoted in its place.
pg_fail_over() {
  pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null || return 1
  pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/standby" -w promote >/dev/null
}

pg_stop() {
  if [ "${PG_STARTED:-0}" = "1" ]; then
    if [ -d "$PG_DIR/standby" ]; then
      pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/standby" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    pg_as_owner "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
    PG_STARTED=0
    echo "Stopped PostgreSQL" >&2
  fi
}

# A second throwaway PostgreSQL with durability on (fsync, synchronous_commit and
# full_page_writes at their defaults, as users run it), for the benchmark's durable scenario.
# Exports DURABLE_DATABASE_URL; with it already set, nothing is started.
pg_start_durable() {
  if [ -n "${DURABLE_DATABASE_URL:-}" ]; then
    PG_DURABLE_STARTED=0
    return 0
  fi
  local bin port
  bin=$(pg_find_bin) || { pg_install && bin=$(pg_find_bin); } || return 1
  PG_DURABLE_DIR=$(mktemp -d /tmp/queen-pg-durable.XXXXXX)
  if [ "$(id -u)" = "0" ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$PG_DURABLE_DIR" --shell /bin/sh postgres
    chown postgres "$PG_DURABLE_DIR"
  fi
  port=$(pg_free_port)
  pg_as_owner "$bin/initdb" -D "$PG_DURABLE_DIR/data" -U postgres --auth=trust -E UTF8 >"$PG_DURABLE_DIR/initdb.log" 2>&1 \
    || { cat "$PG_DURABLE_DIR/initdb.log" >&2; return 1; }
  pg_as_owner "$bin/pg_ctl" -D "$PG_DURABLE_DIR/data" -l "$PG_DURABLE_DIR/server.log" -w -t 60 start \
    -o "-p $port -k $PG_DURABLE_DIR -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_preload_libraries=pg_stat_statements ${PG_EXTRA_OPTS:-}" >/dev/null \
    || { cat "$PG_DURABLE_DIR/server.log" >&2; return 1; }
  PG_DURABLE_BIN=$bin
  PG_DURABLE_STARTED=1
  export DURABLE_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
  echo "Started a durable PostgreSQL on port $port (data in $PG_DURABLE_DIR)" >&2
}

pg_stop_durable() {
  if [ "${PG_DURABLE_STARTED:-0}" = "1" ]; then
    pg_as_owner "$PG_DURABLE_BIN/pg_ctl" -D "$PG_DURABLE_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$PG_DURABLE_DIR"
    PG_DURABLE_STARTED=0
    echo "Stopped the durable PostgreSQL" >&2
  fi
}
