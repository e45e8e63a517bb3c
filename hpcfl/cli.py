"""The `hpcfl` command (a console script, pyproject.toml), one subcommand per task:

    hpcfl run JOB [--set KEY=VALUE ...]     run a job; [mpirun -np N | srun --mpi=pmi2] hpcfl run JOB on N ranks
    hpcfl check JOB [--set KEY=VALUE ...]   validate a job file, print it resolved, train nothing
    hpcfl sweep JOB --list | --index I | --submit [--max-concurrent K] [-- sbatch options]
                                            a sweep's points: list them, run one, or submit all as a job array
    hpcfl status RESULTS... [--sweep JOB]   complete / running / interrupted / failed / missing, with rounds
    hpcfl init [DIR]                        write the SLURM scripts (slurm/) and example jobs (jobs/) to edit
    hpcfl analyze COMMAND RESULTS...        the papers' tables and figures from result files

`hpcfl COMMAND -h` tells more. `python -m hpcfl.launch` (run), `python -m hpcfl.sweep` and
`python -m hpcfl.analyze` are the same commands.
"""
import importlib
import os
import sys

import hpcfl
from hpcfl.errors import Exit, exit_help

# command -> (the module whose main() runs it, arguments it adds)
COMMANDS = {"run": ("hpcfl.launch", []), "check": ("hpcfl.launch", ["--check"]), "sweep": ("hpcfl.sweep", []),
            "status": ("hpcfl.status", []), "analyze": ("hpcfl.analyze", []), "init": ("hpcfl.init", [])}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command in ("-V", "--version"):
        from hpcfl._version import git_commit

        commit = git_commit()
        print(f"hpcfl {hpcfl.__version__}" + (f" (commit {commit})" if commit != "unknown" else ""))
        return Exit.DONE
    if command not in COMMANDS:
        asked = command in ("-h", "--help")
        (sys.stdout if asked else sys.stderr).write(
            ("" if asked else f"hpcfl: error: {'no command' if not command else f'unknown command {command!r}'}\n")
            + "usage:" + __doc__.split("\n", 1)[1] + "\n" + exit_help() + "\n")
        return Exit.DONE if asked else Exit.BAD_INPUT
    module, extra = COMMANDS[command]
    try:
        code = int(importlib.import_module(module).main([*rest, *extra], prog=f"hpcfl {command}"))
        sys.stdout.flush()                      # a closed pipe shows here rather than as Python exits
        return code
    except BrokenPipeError:                     # `hpcfl check JOB | head`: the reader stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.DONE


if __name__ == "__main__":
    sys.exit(main())
