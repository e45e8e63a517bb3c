"""MkDocs hooks: pages that live elsewhere in the repository, and reference generated from the code.

- `studies/**/README.md` (and the sweep files they cite) and `CHANGELOG.md` become pages of the
  site, so each has one source and the site's link check covers them.
- A line `<!-- reference: NAME -->` in a page is replaced by `hpcfl.reference.render(NAME)`:
  the job-file keys from the config dataclasses, the registries' parameters from their Params
  dataclasses, the CLI's help and exit codes, so the reference cannot drift from the code.
"""
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- reference: ([\w-]+) -->$", re.MULTILINE)


def on_files(files, config):
    outside = [(ROOT / "CHANGELOG.md", "changelog.md")]
    for path in sorted((ROOT / "studies").rglob("*")):
        relative = path.relative_to(ROOT)
        if path.suffix in (".md", ".toml") and "results" not in relative.parts[:-1]:
            outside.append((path, relative.as_posix()))
    for path, uri in outside:
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if "<!-- reference:" not in markdown:
        return markdown
    from hpcfl.reference import render  # imported only when a page asks, so a docs-only edit builds fast
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
