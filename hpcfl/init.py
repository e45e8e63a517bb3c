"""Write hpcfl's SLURM scripts and example job files into a folder, to edit: `hpcfl init [DIR]`.

They ship inside the package (hpcfl/templates/: slurm/ and jobs/), so a `pip install` without the
repository has them; but a site edits slurm/site.sh and its job files, and site-packages is no place
for that, so this command copies them out. Files that already exist are kept (never overwritten), so
running it again after an upgrade adds only what is new. `hpcfl sweep --submit` uses the packaged
sweep.sbatch when the folder it runs in has no slurm/. In a clone, where the repository's slurm/ and
jobs/ link to these folders, only the files git tracks are templates: a researcher's own job files
and editor leftovers there stay theirs.
"""
import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from hpcfl.errors import Exit, exit_help

TEMPLATES = Path(__file__).resolve().parent / "templates"     # the repository's slurm/ and jobs/ link here


def templates(root: Path = TEMPLATES) -> list[Path]:
    """The template files under `root`: those git tracks in a clone, every file in an installed package
    (also one inside some other git work tree, which tracks none of them)."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "."], capture_output=True, check=True)
        tracked = [root / name for name in listed.stdout.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):                 # no git, or not a git work tree
        tracked = []
    return sorted(tracked or (p for p in root.rglob("*") if p.is_file()))


def main(argv=None, prog: str = "hpcfl init") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, epilog=exit_help(Exit.DONE, Exit.BAD_INPUT),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", default=".", help="where slurm/ and jobs/ go (default: here)")
    folder = Path(parser.parse_args(argv).folder)
    written, kept = 0, []
    for source in templates():
        target = folder / source.relative_to(TEMPLATES)
        if target.exists():
            kept.append(str(target))
            continue
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)                       # the scripts stay executable
        except OSError as err:
            sys.stderr.write(f"hpcfl: error: cannot write {target} ({err.strerror}): choose another folder\n")
            return Exit.BAD_INPUT
        written += 1
    print(f"hpcfl: wrote {written} files to {folder / 'slurm'} and {folder / 'jobs'}"
          + (f"; kept {len(kept)} that exist: {' '.join(kept)}" if kept else ""))
    print(f"next: edit {folder / 'slurm' / 'site.sh'} for your site, then from {folder}: "
          "sbatch slurm/hpcfl.sbatch jobs/quickstart.toml")
    return Exit.DONE
