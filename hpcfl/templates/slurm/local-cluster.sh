#!/bin/bash
# A single-node SLURM cluster on this machine, for the tests (root, Debian's slurmctld, slurmd and
# munge installed; no systemd). Everything lives under DIR; daemons are stopped by their PID.
#   slurm/local-cluster.sh start DIR     then: export SLURM_CONF=DIR/slurm.conf
#   slurm/local-cluster.sh stop DIR
set -euo pipefail
action=$1 dir=$(realpath -m "$2")
conf=$dir/slurm.conf

stop_pid() {                                # end the daemon whose pid file is $1, if it is still that daemon
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$2" ] || return 0
    kill "$pid"
    for _ in $(seq 50); do [ -d /proc/"$pid" ] || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true      # a daemon stuck in its shutdown
}

case $action in
start)
    mkdir -p "$dir/state" "$dir/spool"
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /run/munge && chown munge:munge /run/munge
        runuser -u munge -- /usr/sbin/munged
    fi
    host=$(hostname -s)
    memory=$(awk '/MemTotal/ {print int($2 / 1024 * 0.85)}' /proc/meminfo)
    # A fresh cluster would number its jobs from 1 again; MPICH names its shared-memory segments
    # after the job and step ("1.0"), and a segment a killed job left in /dev/shm makes the next
    # job of the same number hang in MPI_Init. So each cluster starts at a random job id.
    first_job=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000000 ))
    cat > "$conf" <<CONF
ClusterName=hpcfltest
FirstJobId=$first_job
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
MailProg=/bin/true
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
MinJobAge=600
ReturnToService=2
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 RealMemory=$memory
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -c -f "$conf"
    slurmd -f "$conf"
    for _ in $(seq 100); do
        if [ "$(cat /proc/"$(cat "$dir/slurmctld.pid" 2>/dev/null)"/comm 2>/dev/null)" = slurmctld ] &&
           SLURM_CONF=$conf sinfo -h -o %T 2>/dev/null | grep -qx idle; then exit 0; fi
        sleep 0.2
    done
    echo "local-cluster: the node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    exit 1
    ;;
stop)
    export SLURM_CONF=$conf
    scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 100); do                 # let the jobs end while slurmd can still clean up their steps
        [ -z "$(squeue -h -t RUNNING,COMPLETING,PENDING 2>/dev/null)" ] && break
        sleep 0.1
    done
    stop_pid "$dir/slurmd.pid" slurmd
    stop_pid "$dir/slurmctld.pid" slurmctld
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
