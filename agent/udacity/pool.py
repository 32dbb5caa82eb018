"""A pool of public recordings of the real Udacity simulator, as one training set.

    python -m agent.udacity.pool sources --root recordings          # how to get each recording (git clone + checkout)
    python -m agent.udacity.pool import --root recordings --out data/pool           # every pool recording on disk
    python -m agent.udacity.pool import --root recordings --out data/heldout --role held-out
    python train.py --data data/pool --split blocks --out runs/pool                  # one student from many drivers

Why: a student cloned from one person's few minutes steers that person's laps and little else; many drivers (both
tracks, keyboard, mouse and analog steering) teach what the roads have in common. The manifest (``pool.csv`` beside
this module) names each public recording by repository, commit and folder, with its track, steering input, rows and
stated licence, and, where one published log holds two recordings (a lake session, then a jungle one), which of its
rows each is (``csv_rows``); the recordings themselves are never part of this repository. ``ROOT/<name>/`` is where
each is expected (the folder holding ``driving_log.csv`` and ``IMG/``; a symbolic link to a clone's folder is fine).

Held-out recordings (role ``held-out``) are kept out of the pool and out of every choice made on it: they measure
how the pool's student drives people it never saw. The import writes ``OUT/<name>/`` (one dataset per recording,
reused while the recording is unchanged) and ``OUT/pool.json``, which makes ``OUT`` usable as one ``--data``
folder; its recordings are weighted by the square root of their steps (``train.py --dataset-weight``), so one long
recording does not dominate an epoch.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from common.cli import option, run_command
from common.files import write_json
from driving_data.dataset import POOL_NAME, open_dataset
from driving_data.udacity_import import import_recordings
from driving_data.udacity_log import CSV_NAME, IMG_DIR, is_header

MANIFEST = Path(__file__).with_name("pool.csv")
COLUMNS = ("name", "repo", "commit", "folder", "track", "steering", "rows", "csv_rows", "licence", "role", "note")
TRACKS = ("lake", "jungle", "mountain", "other")
STEERING = ("keyboard", "mouse", "analog")
ROLES = ("pool", "held-out")
PARTS_DIR = ".parts"  # OUT/.parts/<name>: the rows of a log a recording is only part of, with a link to its images
POOL_WEIGHT = "sqrt"  # how a pool's recordings share an epoch (train.py --dataset-weight auto)


@dataclass(frozen=True)
class Entry:
    """One public recording: where it comes from and what it is."""

    name: str
    repo: str
    commit: str
    folder: str
    track: str
    steering: str
    rows: int
    licence: str
    role: str
    note: str = ""
    csv_rows: tuple[int, int] | None = None  # [start, stop) of the folder's log rows (header excluded); None: all

    def clone_commands(self, root: Path) -> str:
        """A clone per repository and commit: two recordings of one repository at two commits (one driver's two
        sessions in one folder) each keep their own files, where one clone checked out twice would give both the
        later session's."""
        clone = root / ".clones" / f"{self.repo.replace('/', '+')}@{self.commit[:12]}"
        inside = clone if self.folder in ("", ".") else clone / self.folder
        return (f"{{ [ -d {clone} ] || git clone -q https://github.com/{self.repo}.git {clone}; }} && "
                f"git -C {clone} checkout -q {self.commit} && ln -sfn {inside.resolve()} {root / self.name}")


def read_manifest(path: str | Path = MANIFEST) -> list[Entry]:
    """The manifest's entries, each checked: a malformed line is one error naming the line and the rule."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pool manifest {str(path)!r} does not exist")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: the header must be {','.join(COLUMNS)} (it is "
                             f"{','.join(reader.fieldnames or [])})")
        entries = [_entry(row, f"{path}:{i + 2}") for i, row in enumerate(reader)]
    seen: set[str] = set()
    for e in entries:
        if e.name in seen:
            raise ValueError(f"{path}: the name {e.name!r} is listed twice")
        seen.add(e.name)
    if not entries:
        raise ValueError(f"{path} lists no recordings")
    return entries


def _entry(row: dict[str, str], where: str) -> Entry:
    values = {k: (row.get(k) or "").strip() for k in COLUMNS}
    rules = [("name", r"[a-z0-9][a-z0-9_-]*", "lowercase letters, digits, - and _"),
             ("repo", r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+", "owner/name"),
             ("commit", r"[0-9a-f]{40}", "40 hexadecimal digits"), ("rows", r"[0-9]+", "a whole number")]
    for key, pattern, what in rules:
        if not re.fullmatch(pattern, values[key]):
            raise ValueError(f"{where}: {key} {values[key]!r} is not {what}")
    for key, allowed in (("track", TRACKS), ("steering", STEERING), ("role", ROLES)):
        if values[key] not in allowed:
            raise ValueError(f"{where}: unknown {key} {values[key]!r} (one of {', '.join(allowed)})")
    if not values["licence"]:
        raise ValueError(f"{where}: licence is empty (write 'none stated' when the repository states none)")
    part = None
    if values["csv_rows"]:
        found = re.fullmatch(r"([0-9]+)-([0-9]+)", values["csv_rows"])
        if not found or int(found[1]) >= int(found[2]):
            raise ValueError(f"{where}: csv_rows {values['csv_rows']!r} is not START-STOP with START < STOP "
                             "(rows of the log counted from 0, header excluded; empty: all of them)")
        part = (int(found[1]), int(found[2]))
        if part[1] - part[0] != int(values["rows"]):
            raise ValueError(f"{where}: csv_rows {values['csv_rows']} is {part[1] - part[0]} rows, but rows says "
                             f"{values['rows']}")
    return Entry(**{**values, "rows": int(values["rows"]), "folder": values["folder"] or ".", "csv_rows": part})


def locate(entry: Entry, root: Path) -> Path | None:
    """``ROOT/<name>``, None when absent; one error when it is there but is not a recording."""
    where = root / entry.name
    if not where.exists():
        return None
    if not (where / CSV_NAME).is_file():
        raise ValueError(f"{entry.name}: {str(where)!r} has no {CSV_NAME} (it should be the folder {entry.folder!r} of "
                         f"{entry.repo} @ {entry.commit[:12]})")
    if not (where / IMG_DIR).is_dir() or not any((where / IMG_DIR).iterdir()):
        raise ValueError(f"{entry.name}: {str(where)!r} has no images in {IMG_DIR}/ (a clone without its images? "
                         "Git LFS content must be fetched too)")
    return where


def _log_lines(csv_path: Path) -> tuple[list[str], list[str]]:
    """(header line, if the log has one; its rows), blank lines left out: how the manifest counts a log's rows."""
    with csv_path.open(newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
        lines = [line for line in f if line.strip()]
    header = lines[:1] if lines and is_header(next(csv.reader(lines[:1], skipinitialspace=True))) else []
    return header, lines[len(header):]


def check_rows(entry: Entry, folder: Path) -> Path:
    """``folder`` when its log holds the entry's ``rows`` (an entry of a whole log); ValueError otherwise: another
    commit of the repository, or another recording in the folder, would pass unnoticed."""
    csv_path = folder / CSV_NAME
    found = len(_log_lines(csv_path)[1])
    if found != entry.rows:
        raise ValueError(f"{str(csv_path)!r} has {found} rows, but the manifest's entry {entry.name} says "
                         f"{entry.rows} (another commit of its repository, or another recording?)")
    return folder


def take_rows(folder: Path, rows: tuple[int, int], into: Path) -> Path:
    """``into``, a recording of the rows [start, stop) of ``folder``'s log (its header kept) with a link to its
    images: where one published log holds two recordings (a lake session and a jungle one), each is a part. The
    log is rewritten only when its rows change, so the import of the part is reused while the source is."""
    csv_path = folder / CSV_NAME
    header, body = _log_lines(csv_path)
    if rows[1] > len(body):
        raise ValueError(f"{str(csv_path)!r} has {len(body)} rows; the manifest takes rows {rows[0]}-{rows[1]} "
                         "(another commit of its repository?)")
    text = "".join(header + body[rows[0]:rows[1]])
    into.mkdir(parents=True, exist_ok=True)
    target = into / CSV_NAME
    if not target.is_file() or target.read_text(encoding="utf-8", errors="surrogateescape") != text:
        target.write_text(text, encoding="utf-8", errors="surrogateescape")
    images = into / IMG_DIR
    if images.is_symlink() and images.resolve() != (folder / IMG_DIR).resolve():
        images.unlink()
    if not images.is_symlink():
        images.symlink_to((folder / IMG_DIR).resolve(), target_is_directory=True)
    return into


def import_pool(entries: Sequence[Entry], root: Path, out: Path, role: str, say=print) -> dict:
    """Import every ``role`` entry found under ``root`` into ``out/<name>`` and write ``out/pool.json``."""
    chosen = [e for e in entries if e.role == role]
    found = [(e, p) for e in chosen if (p := locate(e, root)) is not None]
    missing = [e.name for e in chosen if all(e is not f for f, _ in found)]
    if not found:
        raise ValueError(f"none of the {len(chosen)} {role} recordings of the manifest is under {str(root)!r} "
                         f"(expected {root}/<name>/{CSV_NAME}; `python -m agent.udacity.pool sources --root {root}` "
                         "says how to get them)")
    if missing:
        say(f"{len(missing)} of {len(chosen)} {role} recordings are not under {root}, going on without them: "
            + ", ".join(missing))
    out.mkdir(parents=True, exist_ok=True)
    members, refused = [], {}
    for e, path in found:
        try:
            source = (check_rows(e, path) if e.csv_rows is None
                      else take_rows(path, e.csv_rows, out / PARTS_DIR / e.name))
            import_recordings([source], [out / e.name], warn=lambda m, n=e.name: say(f"{n}: {m}"))
        except ValueError as err:  # a recording the import refuses (impossible data) is left out, not the pool
            say(f"{e.name}: left out of the pool: {err}")
            refused[e.name] = str(err)
            continue
        ds = open_dataset(out / e.name)
        members.append({"name": e.name, "repo": e.repo, "commit": e.commit, "folder": e.folder, "track": e.track,
                        "steering": e.steering, "licence": e.licence, "sessions": len(ds), "steps": ds.num_steps})
    if not members:
        raise ValueError(f"the import refused every {role} recording found under {str(root)!r}")
    card = {"role": role, "weight": POOL_WEIGHT, "recordings": members, "missing": missing, "refused": refused,
            "steps": sum(m["steps"] for m in members)}
    write_json(out / POOL_NAME, card)
    return card


def summary(card: dict) -> str:
    """The pool's recordings, a line each, and its totals by track and steering input."""
    lines = [f"{'recording':<28} {'track':<8} {'steering':<9} {'sessions':>8} {'frames':>8}"]
    lines += [f"{m['name']:<28} {m['track']:<8} {m['steering']:<9} {m['sessions']:>8} {m['steps']:>8}"
              for m in card["recordings"]]
    by = {}
    for key in ("track", "steering"):
        for m in card["recordings"]:
            by.setdefault(key, {}).setdefault(m[key], 0)
            by[key][m[key]] += m["steps"]
    totals = "; ".join(", ".join(f"{k} {v:,}" for k, v in sorted(d.items())) for d in by.values())
    lines.append(f"{len(card['recordings'])} recordings, {card['steps']:,} frames ({totals})")
    return "\n".join(lines)


PROG = "python -m agent.udacity.pool"


@dataclass
class SourcesArgs:
    root: Path = option(Path("recordings"), "where the recordings go: ROOT/<name>/ holds driving_log.csv and IMG/",
                        group="input")
    manifest: Path = option(MANIFEST, "the pool's manifest", group="input")
    role: str = option("all", "which recordings: pool, held-out or all", group="input", choices=("all", *ROLES))


@dataclass
class PoolImportArgs:
    root: Path = option(Path("recordings"), "where the recordings are: ROOT/<name>/ holds driving_log.csv and IMG/",
                        group="input")
    out: Path = option(Path("data/pool"), "the training set to write: OUT/<name>/ per recording and OUT/pool.json",
                       group="output")
    role: str = option("pool", "import the pool's recordings or the held-out ones", group="input", choices=ROLES)
    manifest: Path = option(MANIFEST, "the pool's manifest", group="input")


COMMANDS = {
    "sources": (SourcesArgs, "Print, for each recording of the manifest, the commands that put it at\n"
                             "ROOT/<name>: a git clone of its repository at the manifest's commit and a link\n"
                             "to its folder. Licences as each repository states them are in the manifest."),
    "import": (PoolImportArgs, "Import every recording of the manifest found under ROOT (the pool's, or the\n"
                           "held-out ones) into OUT as one training set (train.py --data OUT), and list\n"
                           "each recording's frames. Recordings not on disk are named and left out."),
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(COMMANDS, _run, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError),
                       interrupted="interrupted (the recordings imported so far are kept and reused)")


def _run(args: SourcesArgs | PoolImportArgs) -> None:
    entries = read_manifest(args.manifest)
    if isinstance(args, SourcesArgs):
        for e in entries:
            if args.role in ("all", e.role):
                part = (f" (the import takes rows {e.csv_rows[0]}-{e.csv_rows[1]} of its {CSV_NAME})"
                        if e.csv_rows else "")
                print(f"# {e.name}: {e.track}, {e.steering}, {e.rows} rows{part}, {e.role}, licence: {e.licence}\n"
                      + e.clone_commands(args.root))
        return
    card = import_pool(entries, args.root, args.out, args.role)
    print(summary(card))
    print(f"train on it: python train.py --data {args.out} --split blocks")


if __name__ == "__main__":
    raise SystemExit(main())
