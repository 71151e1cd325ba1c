#!/usr/bin/env bash
# A throwaway local Slurm cluster (Debian's Slurm 22.05) for tests and for trying torchx on Slurm:
# its own munged, slurmctld and two slurmd "nodes" (node1, node2) on 127.0.0.1 with their own ports,
# and job accounting as production clusters keep it: slurmdbd over its own MariaDB server, so `sacct`
# answers for jobs that slurmctld has forgotten (MinJobAge), and enforced accounts and QOS (root:
# accounts torchx (default) and research, QOS normal (default) and high). Everything (config, munge key and
# socket, database, state, spool, logs, pids) lives in $SLURM_CLUSTER_DIR (default
# /tmp/torchx-slurm); nothing is written to /etc. Needs root, no systemd.
#
#   bash scripts/slurm_cluster.sh install   # apt-get install slurm-wlm munge slurmdbd mariadb-server
#                                           # (idempotent, ~50 s once)
#   bash scripts/slurm_cluster.sh start     # start (or reuse) the cluster; waits until both nodes are idle
#   eval "$(bash scripts/slurm_cluster.sh env)"   # export SLURM_CONF for sbatch/srun/squeue/sinfo/...
#   bash scripts/slurm_cluster.sh status    # daemons, nodes, queue; exit 0 only when all daemons are up
#   bash scripts/slurm_cluster.sh stop      # cancel jobs, stop exactly the daemons started, remove the dir
#
# Knobs: SLURM_CLUSTER_DIR, SLURM_CLUSTER_PORT (slurmctld port, default 16817; slurmd uses the next
# two ports, slurmdbd the third, MariaDB the fourth), SLURM_CLUSTER_NODE_CPUS (CPUs declared per
# node, default 4: more than exist, on purpose), SLURM_CLUSTER_NODE_MEM_MB (default: half the
# machine's memory per node), SLURM_CLUSTER_MIN_JOB_AGE (seconds slurmctld keeps a finished job,
# default 2; Slurm's own default is 300), SLURM_CLUSTER_ACCOUNTING=jobcomp (no database: finished
# jobs go to a jobcomp/filetxt log instead, the way the cluster ran before slurmdbd).
set -euo pipefail

DIR=$(realpath -m "${SLURM_CLUSTER_DIR:-/tmp/torchx-slurm}")
CONF="$DIR/slurm.conf"
NODES=(node1 node2)
PORT=${SLURM_CLUSTER_PORT:-16817}
DBD_PORT=$((PORT + 3))
DB_PORT=$((PORT + 4))
MUNGE_SOCKET="$DIR/munge/munge.socket"
DB_SOCKET="$DIR/run/mariadb.sock"

log() { echo "slurm_cluster: $*" >&2; }
die() { log "$*"; exit 1; }
fail() { log "$*"; stop; exit 1; }   # after start began: undo what it started

# accounting: "slurmdbd" (default) or "jobcomp"; a running cluster keeps the mode it started with
accounting() {
    if [ -s "$DIR/accounting" ]; then cat "$DIR/accounting"; return; fi
    case "${SLURM_CLUSTER_ACCOUNTING:-slurmdbd}" in
        slurmdbd | jobcomp) echo "${SLURM_CLUSTER_ACCOUNTING:-slurmdbd}" ;;
        *) die "SLURM_CLUSTER_ACCOUNTING must be slurmdbd or jobcomp, not ${SLURM_CLUSTER_ACCOUNTING}" ;;
    esac
}

# ------------------------------------------------------------------------------------------ install
install() {
    local pkgs=(slurm-wlm munge) have=1
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null || have=0
    if [ "$(accounting)" = slurmdbd ]; then
        pkgs+=(slurmdbd mariadb-server)
        [ -x /usr/sbin/slurmdbd ] && [ -x /usr/sbin/mariadbd ] && command -v mariadb-install-db >/dev/null \
            || have=0
    fi
    [ "$have" = 0 ] || return 0
    [ "$(id -u)" = 0 ] || die "installing ${pkgs[*]} needs root (or: sudo apt-get install ${pkgs[*]})"
    command -v apt-get >/dev/null || die "no apt-get: install ${pkgs[*]} with this system's package manager"
    export DEBIAN_FRONTEND=noninteractive
    # a fresh image often has no package lists: update only when apt does not know the packages
    if [ "$(apt-cache policy "${pkgs[@]}" 2>/dev/null | grep -c 'Candidate: [0-9]')" != "${#pkgs[@]}" ]; then
        apt-get update -qq >/dev/null
    fi
    # recommends would add ~20 plugin and -dev packages; the basic plugins have all this cluster needs
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

# ------------------------------------------------------------------------------------------ helpers
pid_of() { [ -s "$DIR/run/$1.pid" ] && tr -d ' \n' < "$DIR/run/$1.pid" || true; }

# alive NAME: the recorded pid exists and is still the program we started (not a recycled pid)
alive() {
    local pid comm
    pid=$(pid_of "$1")
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
    comm=$(cat "/proc/$pid/comm")
    [ "$comm" = "${1%%-*}" ]
}

daemons() {
    echo munged
    [ "$(accounting)" = jobcomp ] || echo mariadbd slurmdbd
    echo slurmctld
    for n in "${NODES[@]}"; do echo "slurmd-$n"; done
}

write_conf() {
    local host cpus mem
    host=$(hostname -s)
    cpus=${SLURM_CLUSTER_NODE_CPUS:-4}
    mem=${SLURM_CLUSTER_NODE_MEM_MB:-$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)}
    : > "$DIR/plugstack.conf"   # keep /etc/slurm/plugstack.conf(.d) out of this cluster
    cat > "$CONF" <<CONF
# written by scripts/slurm_cluster.sh start; removed by stop
ClusterName=torchx
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCKET}
StateSaveLocation=${DIR}/state
SlurmdSpoolDir=${DIR}/spool/%n
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${DIR}/run/slurmd-%n.pid
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${DIR}/log/slurmd-%n.log
PlugStackConfig=${DIR}/plugstack.conf
# no cgroups: processes are tracked by parentage, tasks are not confined
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
CONF
    if [ "$(accounting)" = jobcomp ]; then
        cat >> "$CONF" <<CONF
# no slurmdbd: sacct only reads the job-completion text file (sacct -c)
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${DIR}/jobcomp.txt
CONF
    else
        cat >> "$CONF" <<CONF
# accounting in slurmdbd (sacct), comments included; no job-completion file
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=${DBD_PORT}
# with MUNGE, the "password" of the slurmdbd connection is the munge socket to authenticate with
AccountingStoragePass=${MUNGE_SOCKET}
AccountingStoreFlags=job_comment
# jobs need a known account and QOS: sbatch refuses others (sacctmgr adds them at start)
AccountingStorageEnforce=associations,qos
JobCompType=jobcomp/none
CONF
    fi
    cat >> "$CONF" <<CONF
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate,bf_hetjob_prio=max
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# nodes declare what the config says (more CPUs than the machine has), not what slurmd detects
SlurmdParameters=config_overrides
# slurmctld forgets a finished job after ~MinJobAge s (+ its purge interval): then only
# accounting knows it, as on a production cluster after 300 s. Small, so that path is the
# common one here.
MinJobAge=${SLURM_CLUSTER_MIN_JOB_AGE:-2}
KillWait=5
ReturnToService=2
MpiDefault=none
NodeName=${NODES[0]} NodeHostname=${host} NodeAddr=127.0.0.1 Port=$((PORT + 1)) CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=${host} NodeAddr=127.0.0.1 Port=$((PORT + 2)) CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
CONF
}

# munged with its own key, socket and pid under $DIR (the socket dir must be traversable by munge)
start_munge() {
    mkdir -p "$DIR/munge/private"
    chown -R munge:munge "$DIR/munge"
    chmod 755 "$DIR/munge"
    chmod 700 "$DIR/munge/private"
    if [ ! -s "$DIR/munge/private/munge.key" ]; then
        runuser -u munge -- mungekey --create --keyfile="$DIR/munge/private/munge.key" >/dev/null 2>&1 \
            || { dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/private/munge.key" 2>/dev/null \
                 && chown munge:munge "$DIR/munge/private/munge.key" && chmod 400 "$DIR/munge/private/munge.key"; }
    fi
    runuser -u munge -- /usr/sbin/munged --key-file="$DIR/munge/private/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/private/munged.log" \
        --seed-file="$DIR/munge/private/munged.seed" 9>&- \
        || fail "munged did not start (the munge user must be able to traverse $DIR): $(tail -n 3 "$DIR/munge/private/munged.log" 2>/dev/null)"
    cp "$DIR/munge/munged.pid" "$DIR/run/munged.pid"
}

# until_ok CMD...: poll CMD every 0.1 s until it succeeds, for up to 30 s in all
until_ok() {
    local deadline=$((SECONDS + 30))
    while [ "$SECONDS" -lt "$deadline" ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}

db() { mariadb --no-defaults --socket="$DB_SOCKET" -u root "$@"; }

# a fresh MariaDB under $DIR/mysql on 127.0.0.1:DB_PORT, and slurmdbd on 127.0.0.1:DBD_PORT over it
start_accounting() {
    local pw
    rm -rf "$DIR/mysql"
    # small and unsynced on purpose: a throwaway database that must start fast
    local tuning=(--innodb-buffer-pool-size=32M --innodb-log-file-size=8M
        --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --performance-schema=OFF)
    mariadb-install-db --no-defaults --user=root --datadir="$DIR/mysql" --skip-test-db \
        --auth-root-authentication-method=socket "${tuning[@]}" > "$DIR/log/mariadb-install.log" 2>&1 \
        || fail "mariadb-install-db failed: $(tail -n 5 "$DIR/log/mariadb-install.log")"
    setsid /usr/sbin/mariadbd --no-defaults --user=root --datadir="$DIR/mysql" --socket="$DB_SOCKET" \
        --pid-file="$DIR/run/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
        --skip-name-resolve --log-error="$DIR/log/mariadb.log" "${tuning[@]}" \
        </dev/null >/dev/null 2>&1 9>&- &
    until_ok db -e 'SELECT 1' || fail "MariaDB did not start: $(tail -n 5 "$DIR/log/mariadb.log")"
    until_ok alive mariadbd || fail "MariaDB wrote no pid file: $(tail -n 5 "$DIR/log/mariadb.log")"
    pw=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    db -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '${pw}';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || fail "could not create the slurm database user"
    # slurmdbd reads slurmdbd.conf next to \$SLURM_CONF; it must be 0600 and owned by SlurmUser
    ( umask 077; cat > "$DIR/slurmdbd.conf" <<CONF
# written by scripts/slurm_cluster.sh start; removed by stop
AuthType=auth/munge
AuthInfo=socket=${MUNGE_SOCKET}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=${DBD_PORT}
SlurmUser=root
PidFile=${DIR}/run/slurmdbd.pid
LogFile=${DIR}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=${DB_PORT}
StorageUser=slurm
StoragePass=${pw}
StorageLoc=slurm_acct_db
CONF
    )
    /usr/sbin/slurmdbd 9>&- || fail "slurmdbd did not start: $(tail -n 5 "$DIR/log/slurmdbd.log")"
    until_ok timeout 10 sacctmgr -n list cluster || fail "slurmdbd does not answer: $(tail -n 5 "$DIR/log/slurmdbd.log")"
    sacctmgr -i -Q add cluster torchx >/dev/null || fail "sacctmgr could not add the cluster"
    # associations as on a production cluster (AccountingStorageEnforce): jobs run under an
    # account the user belongs to, with a QOS it may use; root defaults to "torchx" and may
    # also charge "research", with QOS "normal" (the default) or "high"
    sacctmgr -i -Q add account torchx,research cluster=torchx >/dev/null \
        && sacctmgr -i -Q add qos high >/dev/null \
        && sacctmgr -i -Q add user root account=torchx,research defaultaccount=torchx \
            qos=normal,high defaultqos=normal >/dev/null \
        || fail "sacctmgr could not add the accounts"
}

wait_idle() {
    local states
    for _ in $(seq 1 150); do
        states=$(sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [ "$states" = "$(printf '%s=idle ' "${NODES[@]}")" ]; then
            log "up in $DIR ($(accounting) accounting): $states"
            return 0
        fi
        sleep 0.1
    done
    log "nodes did not become idle within 15 s: ${states:-no answer from slurmctld}"
    tail -n 5 "$DIR"/log/*.log >&2 || true
    return 1
}

# ------------------------------------------------------------------------------------------ start
start() {
    [ "$(id -u)" = 0 ] || die "the local cluster runs its daemons as root (SlurmUser=root): run as root"
    command -v slurmctld >/dev/null || die "Slurm is not installed: bash $0 install"
    local d all=1 any=0
    for d in $(daemons); do if alive "$d"; then any=1; else all=0; fi; done
    if [ "$all" = 1 ]; then
        log "already running in $DIR ($(accounting) accounting)"
        return 0
    fi
    [ "$any" = 0 ] || { log "partly running in $DIR: restarting it"; stop; }
    mkdir -p "$DIR"/{state,spool,log,run}
    for d in "${NODES[@]}"; do mkdir -p "$DIR/spool/$d"; done
    rm -rf "${DIR:?}"/state/* "$DIR"/run/* "$DIR/accounting"
    accounting > "$DIR/accounting.new" && mv "$DIR/accounting.new" "$DIR/accounting"
    write_conf
    export SLURM_CONF="$CONF"
    start_munge
    [ "$(accounting)" = jobcomp ] || start_accounting
    # -c: a throwaway cluster starts without old jobs; each daemon forks and writes its pid file
    /usr/sbin/slurmctld -c -f "$CONF" 9>&- || fail "slurmctld did not start: $(tail -n 5 "$DIR/log/slurmctld.log")"
    for d in "${NODES[@]}"; do
        /usr/sbin/slurmd -f "$CONF" -N "$d" 9>&- || fail "slurmd -N $d did not start: $(tail -n 5 "$DIR/log/slurmd-$d.log")"
    done
    wait_idle || fail "giving up: stopped what was started"
}

# ------------------------------------------------------------------------------------------ stop
# kill_recorded NAME...: TERM every recorded pid that is still ours at once (one by one took
# 3 s), then wait for each, and KILL one still there after 5 s
kill_recorded() {
    local name pid
    for name in "$@"; do
        if alive "$name"; then kill -TERM "$(pid_of "$name")" 2>/dev/null || true; fi
    done
    for name in "$@"; do
        for _ in $(seq 1 50); do alive "$name" || continue 2; sleep 0.1; done
        pid=$(pid_of "$name")
        log "$name ($pid) ignored SIGTERM: killing it"
        kill -KILL "$pid" 2>/dev/null || true
    done
}

stop() {
    local d
    export SLURM_CONF="$CONF"
    if alive slurmctld; then
        # end the jobs through Slurm first, so their slurmstepd and tasks go too
        local jobs
        jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ' || true)
        if [ -n "${jobs// /}" ]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 1 150); do
                [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
                sleep 0.1
            done
        fi
    fi
    local slurmds=()
    for d in "${NODES[@]}"; do slurmds+=("slurmd-$d"); done
    kill_recorded "${slurmds[@]}" slurmctld slurmdbd mariadbd munged
    # only what start created: SLURM_CLUSTER_DIR may be a directory with other things in it
    rm -rf "${DIR:?}"/{state,spool,log,run,munge,mysql} "$CONF" "$DIR/slurmdbd.conf" \
        "$DIR/plugstack.conf" "$DIR/jobcomp.txt" "$DIR/accounting"
    rmdir "$DIR" 2>/dev/null || true
}

status() {
    local d rc=0
    for d in $(daemons); do
        if alive "$d"; then echo "$d: running (pid $(pid_of "$d"))"; else echo "$d: not running"; rc=1; fi
    done
    if alive slurmctld; then
        SLURM_CONF="$CONF" sinfo -N -o '%N %P %t %c %m' || rc=1
        SLURM_CONF="$CONF" squeue || rc=1
    fi
    return $rc
}

# start and stop hold a lock next to $DIR: two test runs starting the shared cluster at once
# must not both write its config and daemons (daemons are started with fd 9 closed: they must
# not inherit the lock)
locked() {
    exec 9> "$DIR.lock"
    flock -w 180 9 || die "another start or stop of $DIR has held $DIR.lock for 3 minutes"
    "$@"
}

case "${1:-}" in
    install) install ;;
    start) install && locked start ;;
    stop) locked stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 install|start|stop|status|env   (state in \$SLURM_CLUSTER_DIR, default /tmp/torchx-slurm)" >&2; exit 2 ;;
esac
