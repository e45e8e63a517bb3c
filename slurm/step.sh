#!/bin/bash
# Run one hpcfl command as the job's MPI step (`srun --mpi=pmi2`, or $HPCFL_MPI_LAUNCH such as
# `mpiexec`, which takes its ranks from the allocation). USR1 (sbatch --signal=B:USR1@...) and TERM
# are forwarded to the step: the run checkpoints after its current round and exits 3, and then the
# job requeues itself, so that its next start resumes where it stopped.
launcher=${HPCFL_MPI_LAUNCH:-srun --mpi=pmi2}
$launcher "$@" &
step=$!
trap 'kill -USR1 "$step" 2>/dev/null' USR1 TERM
while :; do
    wait "$step" && status=0 || status=$?
    kill -0 "$step" 2>/dev/null || break        # still running: a trapped signal interrupted the wait
done
if [ "$status" -eq 3 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "hpcfl: checkpointed; requeueing job $SLURM_JOB_ID to resume"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
