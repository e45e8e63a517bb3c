"""Run one federated-learning job: `[mpirun -np N] hpcfl run JOB.toml [options]` (or, the same,
`python -m hpcfl.launch JOB.toml`).

Without a launcher, one process is the server and hosts every client. Under mpirun/srun, rank 0
is the server and ranks >= 1 host the clients. The exit status is one of hpcfl.errors.Exit; after an
orderly end only rank 0 exits non-zero, since mpiexec reports the bitwise OR of the ranks' codes.

A run whose result file exists but is not complete resumes from its newest intact checkpoint.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import traceback

from hpcfl.config import toml_string
from hpcfl.errors import Exit, HpcflError, exit_help
from hpcfl.logs import LEVELS, LOG, configure

# Set by mpiexec (Hydra: PMI_*; Open MPI: OMPI_*; PMIx) or by srun for a step of several tasks.
_LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# SLURM: --signal=B:USR1@..., and SIGTERM at the time limit; SIGINT: Ctrl-C (mpiexec forwards it to the ranks)
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


RUN = ("Run a federated-learning job described by a TOML job file (see jobs/). Without mpirun one process does "
       "everything; with `mpirun -np N`, rank 0 is the server and ranks 1..N-1 host the clients. Same seed, same "
       "numbers (to float rounding), any N.")
CHECK = ("Validate a job file (keys, types, ranges, plug-ins and their combinations) and print it resolved as JSON, "
         "every parameter table as the run would use it; nothing is read or trained.")


def parser(prog: str = "python -m hpcfl.launch", checking: bool = False) -> argparse.ArgumentParser:
    """The options of a run (`hpcfl run`, `hpcfl sweep --index` and this module take them); `checking`:
    the ones a check reads (`hpcfl check`, or `--check`), with its own description and exit codes."""
    parser = argparse.ArgumentParser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description=CHECK if checking else RUN,
                                     epilog=exit_help(Exit.DONE, Exit.BAD_INPUT) if checking else exit_help())
    parser.add_argument("job", help="TOML job file, e.g. jobs/quickstart.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any job-file key with a TOML value, e.g. --set train.lr=0.05 "
                             "--set data.partition_params.beta=0.1 --set run.name=trial-3 (repeatable)")
    parser.add_argument("--results-root", default=None, help="overrides run.results_root (default 'results')")
    def run_only(text: str) -> str:       # a check takes these options, and ignores them
        return argparse.SUPPRESS if checking else text

    parser.add_argument("--check", action="store_true",
                        help=run_only("validate the job file, print it resolved, and exit"))
    parser.add_argument("--data-root", default=None,
                        help=run_only("folder with the datasets (default: data.root, then $HPCFL_DATA, then "
                                      "/usr/share/datasets where Debian's dataset-fashion-mnist installs)"))
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help=run_only("every rank's log level (default: INFO on rank 0, WARNING on the others)"))
    parser.add_argument("--log-dir", default=None,
                        help=run_only("also write each rank's log to DIR/<run>[-<SLURM job>]-rank<r>.log"))
    return parser


def _launched() -> list[str]:
    """The variables that say an MPI launcher started this process (or SLURM a step of several tasks)."""
    found = [v for v in _LAUNCHER_VARS if v in os.environ]
    return found or (["SLURM_STEP_NUM_TASKS"] if int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1 else [])


def make_transport():
    """LocalTransport in one process; MpiTransport when a launcher started several ranks."""
    from hpcfl.transport import LocalTransport

    launched = _launched()
    if not launched:
        return LocalTransport({}), 0                # one process: mpi4py is not even imported
    try:
        from mpi4py import MPI
    except ImportError as err:
        started = f"{launched[0]} is set" if launched[0] in _LAUNCHER_VARS else "SLURM's step has several tasks"
        raise HpcflError(f"an MPI launcher started this process ({started}) but mpi4py cannot be imported ({err}), "
                         "so the ranks cannot talk. Fix: pip install \"hpcfl[mpi]\" (mpi4py and PyPI's MPICH), or "
                         "on a cluster build mpi4py against the site's MPI: pip install --no-binary=mpi4py mpi4py "
                         "(docs/how-to/site-mpi.md)") from None

    world = MPI.COMM_WORLD
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if world.Get_size() == 1 and tasks > 1:
        raise HpcflError(f"SLURM started {tasks} tasks but MPI sees a world of 1: srun ran without an MPI plugin, "
                         "so each task would train alone. Fix: `srun --mpi=pmi2 ...` (or set MpiDefault=pmi2), "
                         "or run `mpiexec python -m hpcfl.launch ...` inside the allocation")
    if world.Get_size() == 1:
        return LocalTransport({}), 0
    from hpcfl.transport.mpi import MpiTransport

    return MpiTransport({}, world), world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()


_ctrl_c = False         # a Ctrl-C has asked for the checkpoint: the next one aborts


def _stop(sig, frame) -> None:
    """A stop signal: checkpoint after the current round (the first, if set-up is still running) and
    exit 3, so that no finished round is lost. A second Ctrl-C aborts at once (KeyboardInterrupt, as
    Python's own handler would; under mpiexec Hydra kills the ranks before it runs); a first one after
    SLURM's TERM or USR1 still waits for the checkpoint."""
    global _ctrl_c
    from hpcfl.runtime.resume import STOP

    STOP.set()
    if sig == signal.SIGINT:
        if _ctrl_c:
            raise KeyboardInterrupt
        _ctrl_c = True                    # before the log line: a second Ctrl-C may come while it is written
        LOG.info("Ctrl-C: stopping at a checkpoint after this round (Ctrl-C again to abort at once)")


@contextlib.contextmanager
def _stop_signals():
    """USR1, TERM and INT ask for a checkpoint (_stop) while set-up and the rounds run, and until the
    result file is closed: a signal then must not kill the process with a code SLURM does not requeue."""
    global _ctrl_c
    from hpcfl.runtime.resume import STOP

    STOP.clear()
    _ctrl_c = False
    previous = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _abort(transport, err: BaseException, code: Exit = Exit.FAILED) -> None:
    """Print the failure with rank and host in one write (a traceback unless hpcfl raised it on
    purpose), then end every rank with `code`."""
    from hpcfl.runtime.lock import release

    rank, round = getattr(transport, "rank", 0), getattr(transport, "round", -1)
    when = f"in round {round + 1}" if round >= 0 else "in set-up"
    if isinstance(err, KeyboardInterrupt):
        text = "interrupted (Ctrl-C): stopped at once, without a checkpoint of the current round\n"
    else:
        text = f"error: {err}\n" if isinstance(err, HpcflError) else "".join(traceback.format_exception(err))
    sys.stderr.write(f"hpcfl: rank {rank} on {socket.gethostname()} failed {when}:\n{text}")
    sys.stderr.flush()
    release()
    if getattr(transport, "size", 1) > 1:
        transport.comm.Abort(code)
    sys.exit(code)


def _refuse(err: HpcflError):
    """This rank could not read its job, before MPI started. Its peers may already wait for it in
    set-up's check (MPICH's mpiexec does not end a job whose rank exits before MPI_Init), so it starts
    MPI and fails that check with them (hpcfl.runtime.build.refuse). Returns (transport, the error to
    report)."""
    from hpcfl.runtime.build import SetupFailed, refuse

    try:
        transport = make_transport()[0]
    except HpcflError:
        return None, err
    try:
        refuse(transport, err)
    except SetupFailed as failed:         # always: this rank's own error is among the reports
        err = failed
    return transport, err


def _close(transport) -> None:
    """Cancel the transport's pending receives and free its communicator (across nodes, UCX warns of
    buffers 'not returned to mpool' otherwise)."""
    if transport is not None:
        transport.close()


def main(argv=None, allow_sweep: bool = False, prog: str = "python -m hpcfl.launch") -> int:
    """`allow_sweep`: the job file may have a [sweep] table (hpcfl.sweep runs one of its points)."""
    from hpcfl.runtime.lock import release

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _main(parser(prog, checking="--check" in argv).parse_args(argv), allow_sweep)
    finally:
        release()


def _finish(job, status: str) -> None:
    """Rank 0 marks the result file with how the run ended; a completed run drops its checkpoints."""
    from hpcfl.runtime.checkpoint import checkpoint_root

    if job.recorder:
        job.recorder.set_attr("status", status)
        job.recorder.close()
        if status == "completed":
            shutil.rmtree(checkpoint_root(job.config.result_path), ignore_errors=True)
            LOG.info(f"wrote {job.config.result_path}")
        elif status == "interrupted":
            LOG.info(f"stopped at a checkpoint ({job.config.result_path}); run the same command again to resume")


def run_job(job, overrides=(), data_root=None, quiet: bool = False):
    """Run a job in this process (the server hosts every client) and return its result file's path:
    `job` is a job file's path, its tables as a dict, or a JobConfig; `overrides` are --set's
    KEY=VALUE strings. A completed run returns its path at once and an interrupted one resumes, as on
    the command line; bad input raises hpcfl.errors.ConfigError (or DataError, ...) naming the key.
    It logs as rank 0 does (hpcfl.logs), warnings only when `quiet`."""
    from hpcfl.jobs import prepare
    from hpcfl.runtime.build import setup
    from hpcfl.runtime.lock import release
    from hpcfl.runtime.loop import run
    from hpcfl.runtime.resume import STOP, RunCompleted
    from hpcfl.transport import LocalTransport

    resolved = prepare(job, overrides)
    configure(0, "WARNING" if quiet else None, run=resolved.config.run_name)
    STOP.clear()                          # left set by an interrupted run in this process
    transport = LocalTransport({})
    try:
        try:
            state = setup(resolved, transport, data_root, 0)
        except RunCompleted:
            return resolved.config.result_path
        status = "failed"
        try:
            status = "completed" if run(state) else "interrupted"
        finally:
            _finish(state, status)
    finally:
        transport.close()
        release()
    return resolved.config.result_path


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The job overrides a run's options give: its --set's, and --results-root's."""
    return args.overrides + ([f"run.results_root={toml_string(args.results_root)}"] if args.results_root else [])


def _main(args: argparse.Namespace, allow_sweep: bool) -> int:
    from hpcfl.errors import PeerTimeout, StoppedOnFault
    from hpcfl.jobs import prepare
    from hpcfl.runtime.build import SetupFailed, setup
    from hpcfl.runtime.loop import run
    from hpcfl.runtime.resume import RunCompleted

    overrides = run_overrides(args)
    transport = None
    with contextlib.ExitStack() as stopping:
        try:
            resolved = prepare(args.job, overrides, allow_sweep=allow_sweep)
            if args.check:
                print(json.dumps({**resolved.config.to_dict(), "resolved": resolved.tables}, sort_keys=True),
                      flush=True)
                return Exit.DONE
            transport, local_rank = make_transport()
            transport.timeout_s = resolved.config.run.round_timeout_s
            configure(transport.rank, args.log_level, args.log_dir, resolved.config.run_name)
            stopping.enter_context(_stop_signals())
            job = setup(resolved, transport, args.data_root, local_rank)
        except RunCompleted as done:          # raised on every rank alike, as SetupFailed: all close together
            LOG.info(str(done))
            _close(transport)
            return Exit.DONE
        except BrokenPipeError as err:        # `hpcfl check JOB | head` closed stdout: hpcfl.cli ends quietly
            if transport is not None:
                _abort(transport, err)
            raise
        except PeerTimeout as err:            # a rank is stuck in set-up: only an abort ends it
            _abort(transport, err)
        except HpcflError as err:
            if transport is None and _launched():   # the job could not be read here; other ranks may wait for us
                transport, err = _refuse(err)
            elif transport is not None and transport.size > 1 and not isinstance(err, SetupFailed):
                _abort(transport, err, Exit.BAD_INPUT)     # this rank's alone (the server's result file): peers wait
            if transport is None or transport.is_server:
                sys.stderr.write(f"hpcfl: error: {err}\n")
            _close(transport)
            return Exit.BAD_INPUT
        except BaseException as err:          # noqa: BLE001 — a bug in set-up must not leave peers waiting
            _abort(transport if transport is not None or not _launched() else make_transport()[0], err)
        status, code = "completed", Exit.DONE
        try:
            if not run(job):
                status, code = "interrupted", Exit.RESUME
        except StoppedOnFault as err:         # every rank stops after the same round: an orderly end
            status, code = "failed", Exit.FAILED
            if transport.is_server:
                LOG.error(str(err))
        except BaseException as err:          # noqa: BLE001 — any failure must end every rank
            try:
                _finish(job, "failed")
            finally:                          # even if the file cannot be written (a full disk)
                _abort(transport, err)
        try:
            _finish(job, status)
        except BaseException as err:          # noqa: BLE001 — a full disk at the end must still end every rank
            _abort(transport, err)
        transport.close()
    # mpiexec returns the bitwise OR of the ranks' codes: after an orderly end only the server's counts.
    return code if transport.is_server else Exit.DONE


if __name__ == "__main__":
    sys.exit(main())
