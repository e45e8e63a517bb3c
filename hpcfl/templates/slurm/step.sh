#!/bin/bash
# Run one hpcfl command as the job's MPI step (`srun --mpi=pmi2`, or $HPCFL_MPI_LAUNCH such as
# `mpiexec`, which takes its ranks from the allocation). USR1 (sbatch --signal=B:USR1@...) and TERM
# are forwarded to the step: the run checkpoints after its current round and exits 3. After USR1 the
# job requeues itself, so that its next start resumes where it stopped; after TERM (scancel sends it,
# and SLURM requeues even a cancelled job when asked) it does not.
#
# Afterwards it removes the shared-memory segments MPICH left in /dev/shm (about 1 MB per rank that was
# killed; a leftover segment named after a job step can make a later job with the same id hang in
# MPI_Init): those of this user created while the step ran that no process still maps. On a job of
# several nodes this cleans the first node; docs/explanation/reliability.md says how to clean the others.
launcher=${HPCFL_MPI_LAUNCH:-srun --mpi=pmi2}
started=$(mktemp "${TMPDIR:-/tmp}/hpcfl-step.XXXXXX")      # segments newer than this are the step's
$launcher "$@" &
step=$!
trap 'kill -USR1 "$step" 2>/dev/null' USR1
trap 'terminated=1; kill -USR1 "$step" 2>/dev/null' TERM
while :; do
    wait "$step" && status=0 || status=$?
    kill -0 "$step" 2>/dev/null || break        # still running: a trapped signal interrupted the wait
done
# A signal may have interrupted the last wait (status 128 + signal) as the step ended: bash keeps a
# finished child's status, so ask for it once more.
[ "$status" -gt 128 ] && { wait "$step"; status=$?; }
for segment in $(find /dev/shm -maxdepth 1 -name 'mpich_shm_*' -user "$(id -u)" -newer "$started" 2>/dev/null); do
    grep -qsF "$segment" /proc/[0-9]*/maps || rm -f "$segment"
done
rm -f "$started"
if [ "$status" -eq 3 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    # In a job array one task's SLURM_JOB_ID can be the array's own id, which scontrol reads as every
    # task of the array: name the task as ARRAYID_TASK so that only this one requeues.
    job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
    job=${job:-$SLURM_JOB_ID}
    if [ -n "${terminated:-}" ]; then       # scancel's TERM: SLURM would requeue a cancelled job if asked
        echo "hpcfl: checkpointed; job $job got TERM (scancel, a preemption, or the time limit before" \
             "--signal's USR1), so it is not requeued: submit the same job again to resume"
    else
        echo "hpcfl: checkpointed; requeueing job $job to resume"
        scontrol requeue "$job"
    fi
fi
exit "$status"
