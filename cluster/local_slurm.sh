#!/usr/bin/env bash
# A throw-away single-node SLURM cluster on this machine, for testing the SLURM profile
# (profiles/slurm) against the real snakemake-executor-plugin-slurm.
#
#   cluster/local_slurm.sh install   # apt-get install munge slurmctld slurmd slurm-client (if missing)
#   cluster/local_slurm.sh start     # write slurm.conf, start munged/slurmctld/slurmd, wait for idle
#   cluster/local_slurm.sh status    # daemons and sinfo; exit 0 only when the node is usable
#   cluster/local_slurm.sh stop      # cancel jobs, stop the daemons this script started
#   cluster/local_slurm.sh env       # print `export SLURM_CONF=...` (optional, see below)
#
# Every subcommand is idempotent. Configuration, state, logs and pid files live under
# $SLURM_LOCAL_DIR (default /tmp/specalign-slurm). Nothing else is touched apart from the
# Debian packages, /run/munge (munged's socket), /run/slurm (slurmd's link to its cached
# copy of slurm.conf, see "configless" below; removed by stop) and, only when
# `hostname -s` does not resolve, one line in /etc/hosts. /etc/slurm is never written:
# clients on this machine (sbatch, squeue, snakemake's SLURM plugin, srun inside jobs)
# find the cluster through /run/slurm/conf, or through SLURM_CONF (`env` prints it).
#
# Needs root (apt, daemons running as SlurmUser=root). Exit codes: 0 ok, 1 failure,
# 3 cannot be done on this machine (SLURM missing and no apt-get, or not root): callers
# may skip.
#
# Optional environment: SLURM_LOCAL_DIR, SLURM_LOCAL_PORT (slurmctld port, default 6817;
# slurmd uses the next one), SLURM_LOCAL_START_TIMEOUT (seconds to wait for an idle node,
# default 60). One such cluster per machine: /run/slurm/conf is machine-wide, and start
# refuses to run when its ports are taken.
set -euo pipefail

DIR="${SLURM_LOCAL_DIR:-/tmp/specalign-slurm}"
CONF="$DIR/slurm.conf"
CTLD_PORT="${SLURM_LOCAL_PORT:-6817}"
SLURMD_PORT=$((CTLD_PORT + 1))
START_TIMEOUT="${SLURM_LOCAL_START_TIMEOUT:-60}"
PACKAGES=(munge slurmctld slurmd slurm-client)
export SLURM_CONF="$CONF"

log() { echo "local_slurm: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Not root: this machine cannot have the cluster (exit 3, callers may skip).
need_root() {
    if [[ $(id -u) -ne 0 ]]; then
        log "must run as root (apt-get; daemons run as SlurmUser=root)"
        exit 3
    fi
}

have_binaries() {
    command -v munged >/dev/null && command -v slurmctld >/dev/null &&
        command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
        command -v sinfo >/dev/null && command -v squeue >/dev/null
}

# True if the pid in file $1 is alive and its command line contains $2.
pid_alive() {
    local file=$1 name=$2 pid
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name"
}

munge_works() {
    command -v munge >/dev/null && timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1
}

node_name() { hostname -s; }

# True if something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

show_logs() {
    local f
    for f in "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log"; do
        [[ -s $f ]] || continue
        log "last lines of $f:"
        tail -n 15 "$f" >&2 || true
    done
}

node_state() {
    timeout 10 sinfo -h -N -n "$(node_name)" -o %T 2>/dev/null | head -n1 | tr -d '*~#!%$@^-' || true
}

cmd_install() {
    if have_binaries; then
        log "packages already installed ($(slurmctld -V 2>/dev/null || echo slurm))"
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        log "SLURM is not installed and there is no apt-get to install ${PACKAGES[*]}"
        exit 3
    fi
    need_root
    log "installing ${PACKAGES[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -qq || die "apt-get update failed"
    timeout 600 apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null ||
        die "apt-get install ${PACKAGES[*]} failed"
    have_binaries || die "packages installed but slurm binaries not found"
    log "installed $(slurmctld -V)"
}

# `hostname -s` must resolve: it is both SlurmctldHost and NodeName.
ensure_hostname_resolves() {
    local host
    host=$(node_name)
    if ! getent hosts "$host" >/dev/null; then
        log "adding '127.0.0.1 $host' to /etc/hosts (hostname -s does not resolve)"
        echo "127.0.0.1 $host # added by specalign cluster/local_slurm.sh" >>/etc/hosts
    fi
}

write_conf() {
    local host cpus mem_mb
    host=$(node_name)
    cpus=$(nproc)
    # 80% of physical memory: leaves room for the submit host (snakemake) and the OS.
    mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    cat >"$CONF.tmp" <<EOF
# Written by cluster/local_slurm.sh: a single-node test cluster. Do not edit, rerun start.
# Name of the cluster (any; sacct/sbatch --clusters would use it).
ClusterName=specalign-local
# The controller runs on this host; must equal \`hostname -s\`, which must resolve.
SlurmctldHost=$host
# Both daemons run as root: no slurm user or file ownership to set up for a test cluster.
SlurmUser=root
SlurmdUser=root
# munge authenticates clients and daemons (Debian's default key in /etc/munge).
AuthType=auth/munge
# Ports (SLURM_LOCAL_PORT moves both, should another service hold SLURM's defaults).
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# "Configless": slurmd fetches this file from slurmctld and links its cached copy at
# /run/slurm/conf, where every client finds it without SLURM_CONF. Needed because the
# plugin's job step strips SLURM_* variables (SLURM_CONF too) before its inner srun.
SlurmctldParameters=enable_configless
# No mail program is installed: a no-op one keeps slurmctld from logging an error.
MailProg=/bin/true
# Track job processes through /proc: works in containers without cgroup delegation.
ProctrackType=proctrack/linuxproc
# No CPU binding or cgroup confinement of tasks (needs no cgroup setup).
TaskPlugin=task/none
# No per-job resource accounting (there is no slurmdbd to store it).
JobAcctGatherType=jobacct_gather/none
# No accounting database: sacct does not work, so the profile polls with squeue.
AccountingStorageType=accounting_storage/none
# Allocate individual cores and memory, so that several small jobs share the node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Keep finished jobs visible to squeue for 10 minutes: the plugin's squeue status
# polling must see a job's final state (COMPLETED/FAILED) before it is purged.
MinJobAge=600
# A node that was down (for example after a restart of slurmd) returns to service as
# soon as it registers again, instead of staying DOWN.
ReturnToService=2
# State, spool, pid and log files: all under this folder.
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# The one node: this machine, all its CPUs, 80% of its memory.
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
# One partition holding the node, used when a job names none.
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

start_munged() {
    if munge_works; then
        log "munged already running"
        return 0
    fi
    [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (reinstall the munge package)"
    mkdir -p /run/munge
    chown munge: /run/munge
    runuser -u munge -- /usr/sbin/munged
    # munged daemonises; its pid file says which process is ours (stop kills only that).
    for _ in $(seq 50); do
        munge_works && break
        sleep 0.1
    done
    munge_works || die "munged did not start"
    if [[ -s /run/munge/munged.pid ]]; then
        cp /run/munge/munged.pid "$DIR/munged.pid"
    fi
    log "started munged"
}

cmd_start() {
    need_root
    have_binaries || die "SLURM is not installed: run '$0 install' first"
    # Clients prefer /etc/slurm/slurm.conf to /run/slurm/conf: with a system-wide SLURM
    # configured, srun inside our jobs would talk to that cluster instead.
    [[ ! -e /etc/slurm/slurm.conf ]] ||
        die "/etc/slurm/slurm.conf exists (a system SLURM is configured): not starting a second cluster"
    ensure_hostname_resolves
    mkdir -p "$DIR"
    write_conf
    start_munged
    if pid_alive "$DIR/slurmctld.pid" slurmctld; then
        log "slurmctld already running"
    else
        # Another cluster (another SLURM_LOCAL_DIR) on our ports would answer in our place.
        ! port_in_use "$CTLD_PORT" ||
            die "port $CTLD_PORT is in use (another slurmctld? run stop with its SLURM_LOCAL_DIR)"
        slurmctld -f "$CONF" || die "slurmctld failed to start, see $DIR/log/slurmctld.log"
        log "started slurmctld"
    fi
    if pid_alive "$DIR/slurmd.pid" slurmd; then
        log "slurmd already running"
    else
        ! port_in_use "$SLURMD_PORT" ||
            die "port $SLURMD_PORT is in use (another slurmd? run stop with its SLURM_LOCAL_DIR)"
        # configless: the configuration comes from slurmctld (see SlurmctldParameters)
        slurmd --conf-server "$(node_name):$CTLD_PORT" ||
            die "slurmd failed to start, see $DIR/log/slurmd.log"
        log "started slurmd"
    fi
    local started=$SECONDS deadline=$((SECONDS + START_TIMEOUT)) state="" d
    while ((SECONDS < deadline)); do
        sleep 0.5
        # Both daemonise before they bind their ports (and write their pid files): after
        # a grace period, check that they are still alive.
        for d in slurmctld slurmd; do
            if ((SECONDS - started >= 3)) && ! pid_alive "$DIR/$d.pid" "$d"; then
                show_logs
                die "$d exited after starting (see $DIR/log/$d.log)"
            fi
        done
        state=$(node_state)
        case $state in
        idle | mixed | allocated)
            log "node $(node_name) is $state (SLURM_CONF=$CONF)"
            return 0
            ;;
        down | drained | draining)
            # left over from an earlier run of this cluster: bring it back
            timeout 10 scontrol update NodeName="$(node_name)" State=RESUME >/dev/null 2>&1 || true
            ;;
        esac
    done
    show_logs
    die "node $(node_name) not idle after ${START_TIMEOUT}s (state: '${state:-no answer}')"
}

cmd_status() {
    local ok=0 d
    for d in slurmctld slurmd; do
        if pid_alive "$DIR/$d.pid" "$d"; then
            echo "$d: running (pid $(<"$DIR/$d.pid"))"
        else
            echo "$d: not running"
            ok=1
        fi
    done
    if munge_works; then echo "munged: running"; else
        echo "munged: not running"
        ok=1
    fi
    echo "SLURM_CONF=$CONF"
    if ((ok == 0)); then
        timeout 10 sinfo -N -l 2>&1 || ok=1
        case $(node_state) in idle | mixed | allocated) ;; *) ok=1 ;; esac
    fi
    return $ok
}

# Send SIGTERM to the process in pid file $1 (if it is $2), then SIGKILL after 10 s.
stop_daemon() {
    local file=$1 name=$2 pid
    if ! pid_alive "$file" "$name"; then
        rm -f "$file"
        return 0
    fi
    pid=$(<"$file")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        [[ -d /proc/$pid ]] || break
        sleep 0.1
    done
    if [[ -d /proc/$pid ]]; then
        log "$name (pid $pid) ignored SIGTERM: killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
    log "stopped $name (pid $pid)"
}

cmd_stop() {
    if pid_alive "$DIR/slurmctld.pid" slurmctld; then
        # Cancel every job of this cluster first, so that no job step outlives slurmd.
        timeout 10 scancel --full --quiet --user=root >/dev/null 2>&1 || true
        for _ in $(seq 30); do
            [[ -z $(timeout 10 squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null) ]] && break
            sleep 0.5
        done
    fi
    stop_daemon "$DIR/slurmd.pid" slurmd
    stop_daemon "$DIR/slurmctld.pid" slurmctld
    # munged only if this script started it (its pid was recorded then).
    stop_daemon "$DIR/munged.pid" munged
    # slurmd's link to its configuration cache (only if it points into our folder).
    if [[ -L /run/slurm/conf && $(readlink /run/slurm/conf) == "$DIR"/* ]]; then
        rm -f /run/slurm/conf
        rmdir /run/slurm 2>/dev/null || true
    fi
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
status) cmd_status ;;
stop) cmd_stop ;;
env) echo "export SLURM_CONF=$CONF" ;;
*)
    echo "usage: $0 install|start|status|stop|env" >&2
    exit 2
    ;;
esac
