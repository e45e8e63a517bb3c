# Site-specific set-up for hpcfl's SLURM scripts: the one place to edit for a cluster. Sourced by
# hpcfl.sbatch and sweep.sbatch on the first node before the ranks start; the ranks inherit it.
# Partition and account go on the sbatch command line (--partition, --account) or in
# SBATCH_PARTITION / SBATCH_ACCOUNT; GPUs with --gpus-per-task=1 (each rank pins local rank % GPUs).

# module load python/3.11 cuda/12            # your site's modules
# source "$HOME/venvs/hpcfl/bin/activate"    # the environment `pip install` went into
# export HPCFL_DATA=/scratch/$USER/datasets  # data root (compute nodes have no internet)
# export HPCFL_CACHE=/scratch/$USER/hpcfl-cache   # decoded data sets, read by every later run ("off": decode each time)
# export HPCFL_MPI_LAUNCH=mpiexec            # start ranks with the MPI's launcher instead of srun
# MPICH leaves ~1 MB per killed rank in /dev/shm/mpich_shm_*; a leftover can hang a later job with the same
# id in MPI_Init. step.sh removes the step's own segments on the first node (docs/explanation/reliability.md).
:
