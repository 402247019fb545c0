#!/usr/bin/env bash
# Runs the reference harness (../shared/bench/vs_duckdb.py: each query its own `quarry sql -f`,
# default configuration, DuckDB on the same segments, values compared) and writes its output to
# OUT with what a reader needs to place it: the command, the commit and whether the tree was
# clean, the binary, the machine and the date. Git history keeps the earlier reports.
#
#   scripts/vs_duckdb_report.sh QUARRY WAREHOUSE SQLDIR OUT [harness options...]
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: $0 QUARRY WAREHOUSE SQLDIR OUT [harness options...]" >&2; exit 2; }
quarry=$1 warehouse=$2 sqldir=$3 out=$4; shift 4
here=$(cd "$(dirname "$0")/.." && pwd)
harness=${VS_DUCKDB:-$here/../shared/bench/vs_duckdb.py}
commit=$(git -C "$here" rev-parse --short HEAD)
dirty=$([ -n "$(git -C "$here" status --porcelain -- crates Cargo.toml Cargo.lock)" ] && echo " (code changed since: dirty)")
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
mkdir -p "$(dirname "$out")"
{
    echo "# $ python3 $harness $quarry $warehouse $sqldir $*"
    echo "# commit $commit$dirty, binary $quarry, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# machine: $cpu, $(nproc) cores, $mem; DuckDB $(python3 -c 'import duckdb; print(duckdb.__version__)')"
} > "$out"
python3 "$harness" "$quarry" "$warehouse" "$sqldir" "$@" | tee -a "$out"
status=${PIPESTATUS[0]}
echo "# exit status $status" >> "$out"
exit "$status"
