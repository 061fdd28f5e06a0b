#!/usr/bin/env bash
# The namespace failover scenario of tests/tests/suites/system/failover.rs (`web_failover_…`), N times
# (default 20), with min/median/p95/max of detection-to-switch and of failed client connections.
#
#   sudo bench/failover.sh [N]        # as root, from anywhere in the repository
#
# Needs root and BPF (the test builds network namespaces, loads the XDP program and pins its
# maps; each run removes them on drop). Builds the agent and the test once, then runs
#   cargo test -p router-tests --test suites system::failover::web_failover -- --nocapture
# N times and reads the one line per run the test prints before its timing assertions:
#   FAILOVER detection_ms=<ms> failed=<n> conns=<n> write_us=<µs|->
# detection_ms: b1's health endpoint starts failing → the first new client connection that
# lands on dc2 (so probe detection + stable_for + map write + the client's sampling);
# failed: client connections (one every few ms, to the VIP) that got no echo, over the whole
# run (before, during the failover, on dc2, during and after the failback);
# write_us: the agent's own event → decision-word written time for the failover switch.
# A run whose test fails still counts if it printed its line; the exit status of every run and
# the number of failing runs are reported.
set -euo pipefail

n=${1:-20}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [N]" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$0: must be run as root (namespaces, XDP, BPF pins)" >&2; exit 1; }
cd "$(dirname "$0")/.."

cargo build -p router-userspace --bin switchyard
cargo test -p router-tests --test suites --no-run

log=$(mktemp -t failover-bench.XXXXXX)
trap 'rm -f "$log"' EXIT
lines=()
fails=0
for i in $(seq 1 "$n"); do
    rc=0
    cargo test -q -p router-tests --test suites system::failover::web_failover -- --nocapture >"$log" 2>&1 || rc=$?
    line=$(grep -m1 '^FAILOVER ' "$log" || true)
    if [[ $rc -ne 0 ]]; then
        fails=$((fails + 1))
        echo "run $i: test FAILED (exit $rc)" >&2
        grep -E '^Error|panicked|^failover:' "$log" | head -5 >&2 || true
    fi
    if [[ -z $line ]]; then
        echo "run $i: no FAILOVER line" >&2
        continue
    fi
    echo "run $i/$n: ${line#FAILOVER }"
    lines+=("$line")
done

[[ ${#lines[@]} -gt 0 ]] || { echo "no run produced a measurement" >&2; exit 1; }

# field NAME: the values of NAME=… over all lines, one a line.
field() { printf '%s\n' "${lines[@]}" | grep -o "$1=[^ ]*" | cut -d= -f2 | grep -v '^-$' || true; }
# stats: min/median/p95/max (nearest rank) of numbers on stdin.
stats() {
    sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "-\t-\t-\t-"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        r = int(0.95 * NR); if (r < 0.95 * NR) r++; if (r < 1) r = 1
        printf "%s\t%s\t%s\t%s\n", v[1], m, v[r], v[NR] }'
}

echo
echo "runs: $n, measured: ${#lines[@]}, failing tests: $fails"
printf '%-28s %10s %10s %10s %10s\n' "" min median p95 max
for f in detection_ms failed write_us; do
    IFS=$'\t' read -r a b c d < <(field "$f" | stats)
    printf '%-28s %10s %10s %10s %10s\n' "$f" "$a" "$b" "$c" "$d"
done
