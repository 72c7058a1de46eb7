#!/usr/bin/env bash
# Run lockrun's tests on a fresh Debian or Ubuntu machine: install what they
# need (redis-server, etcd, postgresql, pgbouncer, alembic, openssl, perl,
# bash, util-linux, man-db, lintian, gdb, Python's prometheus_client, zookeeper
# (with a Java runtime), mariadb-server, mariadb-client, cargo-deb) when it is
# missing, then run `cargo test` with any arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# redis-cli builds the test clusters.
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v perl >/dev/null 2>&1 || missing+=(perl)
command -v bash >/dev/null 2>&1 || missing+=(bash)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
command -v groff >/dev/null 2>&1 || missing+=(groff-base)
# The Debian package's man pages are read back with man -l.
command -v man >/dev/null 2>&1 || missing+=(man-db)
# The Debian package is checked with lintian, which must find nothing.
command -v lintian >/dev/null 2>&1 || missing+=(lintian)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
# The metrics file is read back with a real Prometheus text parser.
python3 -c 'import prometheus_client' >/dev/null 2>&1 ||
  /usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 ||
  missing+=(python3-prometheus-client)
# Debian keeps PostgreSQL's server programs off PATH, in a versioned directory.
{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } ||
  missing+=(postgresql)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
{ command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; } || missing+=(pgbouncer)
# README's migration guide runs alembic with Debian's python3.
/usr/bin/python3 -c 'import alembic' >/dev/null 2>&1 || missing+=(python3-alembic)
/usr/bin/python3 -c 'import psycopg2' >/dev/null 2>&1 || missing+=(python3-psycopg2)
/usr/bin/python3 -c 'import pymysql' >/dev/null 2>&1 || missing+=(python3-pymysql)
# The tests start ZooKeeper servers from Debian's jar with the Java runtime it
# depends on.
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || missing+=(zookeeper)
# Debian keeps mariadbd in /usr/sbin, off a user's PATH.
{ command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; } || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
# A test holds lockrun in a debugger between its grant and its job's start.
command -v gdb >/dev/null 2>&1 || missing+=(gdb)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "tests/run.sh: the tests need ${missing[*]}; install them (apt-get install -y ${missing[*]}) as root, or install sudo" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/run.sh: the tests need ${missing[*]}, and this machine has no apt-get; install them with its package manager" >&2
    exit 1
  fi
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

# The Debian package is built with cargo-deb (a cargo subcommand, not an apt
# package).
cargo deb --version >/dev/null 2>&1 || cargo install cargo-deb --version 3.8.0 --locked

# Most tests wait on leases and servers, not on the CPU (three quarters of
# it idle with one test per core), so a machine with few cores runs three
# at once; those that start dozens of lockruns take turns (support::heavy).
cores=$(nproc 2>/dev/null || echo 1)
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-$((cores > 3 ? cores : 3))}"

exec cargo test --workspace "$@"
