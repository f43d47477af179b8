#!/usr/bin/env bash
# A real N-node SLURM cluster on this one machine (default 2 nodes), for the `slurm` tests.
#
#   bash tests/slurm/cluster.sh install             # apt packages (Debian 12: slurm 22.05 + munge), idempotent
#   bash tests/slurm/cluster.sh up [--nodes N]      # munged, slurmctld, slurmd node1..nodeN; idempotent
#   bash tests/slurm/cluster.sh status
#   bash tests/slurm/cluster.sh kill-node nodeK     # a node dies: its link goes down, slurmd and every
#                                                   # process in its namespace get SIGKILL
#   bash tests/slurm/cluster.sh revive-node nodeK   # link up, slurmd started again (ReturnToService=2)
#   bash tests/slurm/cluster.sh down                # stops only what `up` started
#
# Each node is one `slurmd -N nodeN` in its own UTS namespace (hostname nodeN) and, when the sandbox
# allows it, its own network namespace on a bridge (10.99.0.0/24); otherwise the nodes share loopback
# with 127.0.99.x addresses and one slurmd port each (force that with SFT_SLURM_NETNS=0).
# State (config, logs, pids, spool) lives in $SFT_SLURM_DIR (default /tmp/sft-slurm). Must run as root.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${SFT_SLURM_DIR:-/tmp/sft-slurm}"
CONF="$STATE/slurm.conf"
NODE_COUNT_FILE="$STATE/node-count"  # what `up` started, so `down` and `kill-node` know the nodes
DEFAULT_NODES=2
NODE_CPUS="${SFT_SLURM_CPUS:-16}"
BRIDGE=sftbr0
SUBNET=10.99.0
HOSTS_BEGIN="# >>> sft-slurm test cluster"
HOSTS_END="# <<< sft-slurm test cluster"

log() { echo "cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- install
cmd_install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        log "packages already installed"
        return 0
    fi
    # Keep the packages from starting daemons; we start them ourselves and remember their PIDs.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
    if ((made_policy)); then rm -f "$policy"; fi
    log "installed: $(slurmctld -V)"
}

# ---------------------------------------------------------------- helpers
alive() { [[ -n ${1:-} && -d /proc/$1 ]]; }
pid_of() { [[ -s $1 ]] && cat "$1" || true; }

use_netns() {
    [[ ${SFT_SLURM_NETNS:-1} != 0 ]] || return 1
    [[ -f $STATE/mode ]] && { [[ $(cat "$STATE/mode") == netns ]]; return; }
    # Probe: can we create a namespace and a bridge? (Not in every sandbox.)
    ip netns add sft-probe 2>/dev/null || return 1
    ip netns del sft-probe
    ip link add sft-probebr type bridge 2>/dev/null || return 1
    ip link del sft-probebr
}

node_index() { echo "${1#node}"; }

set_nodes() {  # NODES=(node1 .. node$1)
    local count=$1 i
    [[ $count =~ ^[1-9][0-9]?$ ]] || die "--nodes wants a number from 1 to 99, got '$count'"
    NODES=()
    for ((i = 1; i <= count; i++)); do NODES+=("node$i"); done
}

started_nodes() {  # the node count `up` recorded (the default when nothing is up)
    if [[ -s $NODE_COUNT_FILE ]]; then cat "$NODE_COUNT_FILE"; else echo "$DEFAULT_NODES"; fi
}

node_addr() {  # address of node $1 (or "ctl")
    local idx
    if [[ $1 == ctl ]]; then idx=1; else idx=$((10 + $(node_index "$1"))); fi
    if [[ $(cat "$STATE/mode") == netns ]]; then echo "$SUBNET.$idx"; else echo "127.0.99.$idx"; fi
}

write_hosts() {  # replace our block in /etc/hosts in place (it may be a bind mount: keep the inode)
    local body
    body="$(sed "/^$HOSTS_BEGIN\$/,/^$HOSTS_END\$/d" /etc/hosts)"
    if [[ ${1:-} == add ]]; then
        body+=$'\n'"$HOSTS_BEGIN"$'\n'"$(node_addr ctl) sftctl"
        for n in "${NODES[@]}"; do body+=$'\n'"$(node_addr "$n") $n"; done
        body+=$'\n'"$HOSTS_END"
    fi
    printf '%s\n' "$body" >/etc/hosts
}

render_conf() {
    local nodes="" n port=""
    for n in "${NODES[@]}"; do
        [[ $(cat "$STATE/mode") == netns ]] || port=" Port=$((6820 + $(node_index "$n")))"
        nodes+="NodeName=$n NodeAddr=$(node_addr "$n") NodeHostname=$n CPUs=$NODE_CPUS"
        nodes+=" RealMemory=65536 State=UNKNOWN$port"$'\n'
    done
    local IFS=,
    sed -e "s|@STATE@|$STATE|g" -e "s|@CTL_ADDR@|$(node_addr ctl)|g" -e "s|@NODE_LIST@|${NODES[*]}|g" \
        "$HERE/slurm.conf.in" | awk -v nodes="$nodes" '{ if ($0 == "@NODES@") printf "%s", nodes; else print }' >"$CONF"
    # Client commands (sbatch, srun inside jobs) read the default path.
    mkdir -p /etc/slurm
    if [[ -e /etc/slurm/slurm.conf && ! -L /etc/slurm/slurm.conf ]]; then
        die "/etc/slurm/slurm.conf exists and is not ours; move it away first"
    fi
    ln -sfn "$CONF" /etc/slurm/slurm.conf
}

make_network() {
    ip link add "$BRIDGE" type bridge
    ip addr add "$(node_addr ctl)/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local n ns
    for n in "${NODES[@]}"; do
        ns="sft-$n"
        ip netns del "$ns" 2>/dev/null || true  # left over by a `down` that knew fewer nodes
        ip netns add "$ns"
        ip link add "sft-${n}h" type veth peer name "sft-${n}n"
        ip link set "sft-${n}h" master "$BRIDGE"
        ip link set "sft-${n}h" up
        ip link set "sft-${n}n" netns "$ns"
        # Inside its namespace the node's interface is eth0, as on a real node (same GLOO/NCCL_SOCKET_IFNAME).
        nsenter --net="/run/netns/$ns" ip link set "sft-${n}n" name eth0
        nsenter --net="/run/netns/$ns" ip addr add "$(node_addr "$n")/24" dev eth0
        nsenter --net="/run/netns/$ns" ip link set eth0 up
        nsenter --net="/run/netns/$ns" ip link set lo up
    done
}

remove_network() {
    local n
    for n in "${NODES[@]}"; do
        ip link del "sft-${n}h" 2>/dev/null || true
        ip netns del "sft-$n" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
}

start_munged() {
    local pid
    pid="$(pid_of /run/munge/munged.pid)"
    if alive "$pid" && [[ $(cat "/proc/$pid/comm") == munged ]]; then return 0; fi
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge: /etc/munge/munge.key; }
    mkdir -p /run/munge && chown munge: /run/munge && chmod 755 /run/munge
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 50); do [[ -s /run/munge/munged.pid ]] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$STATE/munged.pid"  # ours: `down` stops it
}

# Start "$@" detached in a new UTS namespace with hostname $1 (and net namespace $2 if not "-").
start_in_ns() {
    local host=$1 netns=$2 logfile=$3; shift 3
    local enter=()
    [[ $netns == - ]] || enter=(nsenter --net="/run/netns/$netns" --)
    # shellcheck disable=SC2016  # $0/$@ expand in the inner shell
    setsid "${enter[@]}" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@" \
        </dev/null >>"$logfile" 2>&1 &
    echo $!
}

wait_idle() {
    local out
    for _ in $(seq 150); do
        out="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
        [[ $(grep -c ' idle$' <<<"$out") -ge ${#NODES[@]} ]] && return 0
        sleep 0.2
    done
    log "nodes not idle after 30 s: ${out:-no answer from slurmctld}"
    log "see $STATE/*.log"
    return 1
}

healthy() {
    [[ -f $STATE/mode && $(started_nodes) == "${#NODES[@]}" ]] || return 1
    alive "$(pid_of "$STATE/ctld.pid")" || return 1
    local n; for n in "${NODES[@]}"; do alive "$(pid_of "$STATE/$n.pid")" || return 1; done
    alive "$(pid_of /run/munge/munged.pid)"
}

start_slurmd() {
    local netns=-
    [[ $(cat "$STATE/mode") == netns ]] && netns="sft-$1"
    start_in_ns "$1" "$netns" "$STATE/$1.out" /usr/sbin/slurmd -D -N "$1" -f "$CONF" >"$STATE/$1.pid"
}

record_uts() {  # record a daemon's UTS namespace: `down` and `kill-node` kill its members
    local f=$1
    for _ in $(seq 50); do
        [[ $(readlink "/proc/$(cat "$STATE/$f.pid")/ns/uts" 2>/dev/null) != "$(readlink /proc/self/ns/uts)" ]] && break
        sleep 0.1
    done
    readlink "/proc/$(cat "$STATE/$f.pid")/ns/uts" >"$STATE/$f.uts" || die "$f did not start: see $STATE/$f.out"
}

# ---------------------------------------------------------------- up / down / status
cmd_up() {
    [[ $EUID == 0 ]] || die "must run as root"
    command -v slurmctld >/dev/null || die "SLURM not installed: run tests/slurm/cluster.sh install"
    if healthy && wait_idle; then log "already up"; return 0; fi
    local count=${#NODES[@]}
    set_nodes "$(started_nodes)"
    cmd_down >/dev/null 2>&1 || true
    set_nodes "$count"
    mkdir -p "$STATE"
    echo "$count" >"$NODE_COUNT_FILE"
    rm -rf "${STATE:?}"/ctld "${STATE:?}"/spool-* "$STATE"/*.log "$STATE"/*.pid
    mkdir -p "$STATE/ctld"
    if use_netns; then echo netns >"$STATE/mode"; make_network; else echo loopback >"$STATE/mode"; fi
    render_conf
    write_hosts add
    start_munged
    start_in_ns sftctl - "$STATE/ctld.out" /usr/sbin/slurmctld -D -f "$CONF" >"$STATE/ctld.pid"
    local n
    for n in "${NODES[@]}"; do start_slurmd "$n"; done
    for f in ctld "${NODES[@]}"; do record_uts "$f"; done
    wait_idle || exit 1
    log "up ($(cat "$STATE/mode")): $(sinfo -h -o '%P %D %t %N' | tr '\n' ' ')"
}

kill_namespace_members() {  # SIGKILL every process in the UTS namespace recorded in $1 (slurmstepd ignores TERM)
    local ns pid
    ns="$(cat "$1" 2>/dev/null)" || return 0
    [[ -n $ns && $ns != "$(readlink /proc/self/ns/uts)" ]] || return 0
    for pid in /proc/[0-9]*; do
        pid="${pid#/proc/}"
        [[ $(readlink "/proc/$pid/ns/uts" 2>/dev/null) == "$ns" ]] && kill -KILL "$pid" 2>/dev/null || true
    done
}

cmd_down() {
    local f pid
    for f in "${NODES[@]}" ctld; do
        pid="$(pid_of "$STATE/$f.pid")"
        alive "$pid" && kill -TERM "$pid" 2>/dev/null || true
    done
    sleep 0.5
    for f in "${NODES[@]}" ctld; do
        kill_namespace_members "$STATE/$f.uts"
        rm -f "$STATE/$f.pid" "$STATE/$f.uts"
    done
    pid="$(pid_of "$STATE/munged.pid")"
    if alive "$pid" && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == munged ]]; then kill -TERM "$pid"; fi
    rm -f "$STATE/munged.pid"
    if [[ -f $STATE/mode ]]; then
        [[ $(cat "$STATE/mode") == netns ]] && remove_network
        write_hosts remove
        rm -f "$STATE/mode"
    fi
    rm -f "$NODE_COUNT_FILE"
    [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$CONF" ]] && rm -f /etc/slurm/slurm.conf
    log "down"
}

known_node() {
    local n
    for n in "${NODES[@]}"; do [[ $n == "$1" ]] && return 0; done
    die "unknown node '${1:-}' (nodes: ${NODES[*]})"
}

# A node dies as a powered-off machine does: its link goes down first (peers see silence, not a
# connection reset), then slurmd, its job steps and the training processes are SIGKILLed.
cmd_kill_node() {
    known_node "${1:-}"
    [[ $(cat "$STATE/mode" 2>/dev/null) == netns ]] && ip link set "sft-$1h" down
    kill_namespace_members "$STATE/$1.uts"
    rm -f "$STATE/$1.pid"
    log "$1 killed"
}

cmd_revive_node() {
    known_node "${1:-}"
    if alive "$(pid_of "$STATE/$1.pid")"; then log "$1 already running"; return 0; fi
    [[ $(cat "$STATE/mode" 2>/dev/null) == netns ]] && ip link set "sft-$1h" up
    start_slurmd "$1"
    record_uts "$1"
    log "$1 revived (slurmd pid $(cat "$STATE/$1.pid"))"
}

cmd_status() {
    if ! healthy; then echo "down"; return 1; fi
    echo "up ($(cat "$STATE/mode")); state in $STATE"
    local f; for f in ctld "${NODES[@]}"; do echo "  $f pid $(cat "$STATE/$f.pid")"; done
    sinfo -N -o '%N %P %t %c'
}

usage() { echo "usage: $0 install|up [--nodes N]|down|status|kill-node NODE|revive-node NODE" >&2; exit 2; }

command=${1:-}
shift || true
set_nodes "$(started_nodes)"
case "$command" in
    install) cmd_install ;;
    up)
        case "${1:-}" in
            --nodes) set_nodes "${2:-}" ;;
            "") set_nodes "$DEFAULT_NODES" ;;
            *) usage ;;
        esac
        cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kill-node) cmd_kill_node "${1:-}" ;;
    revive-node) cmd_revive_node "${1:-}" ;;
    *) usage ;;
esac
