#!/usr/bin/env bash
# A throwaway local Slurm cluster for tests and trying torchx on Slurm:
# munge + slurmctld + two slurmd "nodes" (node1, node2) on 127.0.0.1, all state in $SLURM_CLUSTER_DIR.
#   bash scripts/slurm_cluster.sh install   # Debian's slurm-wlm and munge (root)
#   bash scripts/slurm_cluster.sh start     # start everything; then: eval "$(bash scripts/slurm_cluster.sh env)"
#   bash scripts/slurm_cluster.sh status | env | stop
set -euo pipefail
DIR=${SLURM_CLUSTER_DIR:-/tmp/torchx-slurm}
CONF="$DIR/slurm.conf"

install() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null; then return 0; fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) / 2 ))
    mkdir -p "$DIR"/{state,spool1,spool2,log}
    cat > "$CONF" <<EOF
ClusterName=torchx
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate,bf_hetjob_prio=max
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MinJobAge=300
ReturnToService=2
MpiDefault=none
NodeName=node1 NodeHostname=${host} NodeAddr=127.0.0.1 Port=16821 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
NodeName=node2 NodeHostname=${host} NodeAddr=127.0.0.1 Port=16822 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

start_munge() {
    if pgrep -x munged >/dev/null; then return 0; fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown munge:munge /etc/munge/munge.key
        chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged
    echo munged >> "$DIR/started"
}

start() {
    install
    if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
        echo "slurm cluster already running in $DIR"; return 0
    fi
    write_conf
    : > "$DIR/started"
    start_munge
    export SLURM_CONF="$CONF"
    /usr/sbin/slurmctld -f "$CONF"
    /usr/sbin/slurmd -f "$CONF" -N node1
    /usr/sbin/slurmd -f "$CONF" -N node2
    for _ in $(seq 1 100); do
        if [ "$(sinfo -h -o '%t' 2>/dev/null | grep -c idle || true)" -ge 1 ] && \
           [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -cv idle || true)" -eq 0 ]; then
            echo "slurm cluster up: $(sinfo -h -N -o '%N:%t' | tr '\n' ' ')"; return 0
        fi
        sleep 0.2
    done
    echo "slurm cluster did not become idle; see $DIR/log" >&2
    sinfo -N >&2 || true
    return 1
}

stop() {
    for f in "$DIR"/slurmd-node1.pid "$DIR"/slurmd-node2.pid "$DIR"/slurmctld.pid; do
        if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
    done
    if grep -qx munged "$DIR/started" 2>/dev/null; then pkill -x munged || true; fi
    sleep 0.5
    rm -rf "$DIR"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) SLURM_CONF="$CONF" sinfo -N ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
