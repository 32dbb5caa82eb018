"""The README tells the truth about the repository: every file it names exists, and no file points outside it."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# repository paths the README names in backticks or links: checkpoints/x.pt, docs/nac.md, driving_data/dataset.py, ...
TRACKED_DIRS = ("agent", "policies", "envs", "benchmarks", "checkpoints", "docs", "tests")


def named_paths(text: str) -> set[str]:
    candidates = set(re.findall(r"`([^`\s]+)`", text)) | set(re.findall(r"\]\(([^)\s]+)\)", text))
    out = set()
    for c in candidates:
        c = c.strip().rstrip(".,;:")
        if c.split("/")[0] in TRACKED_DIRS and "<" not in c and "*" not in c and "=" not in c:
            out.add(c)
    return out


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


def test_every_path_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    paths = named_paths(text) | named_paths((ROOT / "docs" / "udacity.md").read_text())
    assert len(paths) > 10, "the README names the project's files"
    missing = sorted(p for p in paths if not (ROOT / p.split("#")[0]).exists())
    assert not missing, f"README names files that do not exist: {missing}"
    anchors = [p for p in paths if "#" in p]
    assert anchors, "the README links sections of the docs"
    broken = [p for p in anchors
              if p.split("#", 1)[1] not in heading_anchors((ROOT / p.split("#")[0]).read_text())]
    assert not broken, f"README links sections that do not exist: {broken}"


def test_no_tracked_file_points_outside_the_repository():
    out = subprocess.run(["git", "grep", "-n", "-I", "-E", r"(\.\./shared/|shared/[A-Z_]+\.md)", "--", ".",
                          ":!tests/test_readme.py"], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout == "", f"files that point outside the repository (users get the repository alone):\n{out.stdout}"



# patterns are joined from pieces so that this file, which is scanned too, does not match itself
HISTORY = {
    "a machine path (a user has the repository, not this machine's folders)":
        r"(^|[][:space:]\"'=(`,:[])/(" + "work|tmp)/",
    "a pointer to a ticket instead of the reason": r"[Tt]he " + "issue",
    "a file read out of git history instead of a command that makes it": r"git " + "show",
}


def test_no_tracked_file_names_a_machine_path_or_history():
    """Code, docs, cards and scripts say what is and how to make it; history lives in git (logs are output)."""
    found = []
    for why, pattern in HISTORY.items():
        out = subprocess.run(["git", "grep", "-n", "-I", "-E", pattern, "--", ".", ":!*.log"], cwd=ROOT,
                             capture_output=True, text=True)
        found += [f"{why}: {line[:200]}" for line in out.stdout.splitlines()]
    assert not found, "\n".join(found)


def _keys(node) -> set[str]:
    if isinstance(node, dict):
        return set(node) | set().union(*map(_keys, node.values()))
    return set().union(*map(_keys, node)) if isinstance(node, list) else set()


def test_no_card_records_a_previous_model():
    """A card describes its own checkpoint; what it replaced is git history (docs/results.md keeps the figures)."""
    stale = {p.name: sorted(k for k in _keys(json.loads(p.read_text())) if "previous" in k or "shipped 20" in k)
             for p in sorted((ROOT / "checkpoints").glob("*.json"))}
    assert not {n: k for n, k in stale.items() if k}, stale


# ---- the README's "Results at a glance" table is read from the checkpoint cards ----------------------------------

def _card(name: str) -> dict:
    return json.loads((ROOT / "checkpoints" / f"{name}.json").read_text())


def _pct(a: float, b: float, digits: int = 1) -> str:
    return f"{100 * a / b:.{digits}f}"


def _expert(name: str) -> list[str]:
    ev = _card(name)["evaluation"]
    return [f"{ev['mean_return']:.1f}", f"{ev['std_return']:.1f}", f"{ev['laps_finished']}/{ev['episodes']}"]


def _on_the_road(name: str, laps: bool) -> list[str]:
    ev = _card(name)["evaluation"]
    figures = [str(sum(ev["off_road_steps"])), str(len(ev["off_road_steps"]))]
    return figures + ([f"{ev['laps_finished']}/{ev['episodes']}"] if laps else [])


def _carracing_student() -> list[str]:
    ev = _card("carracing_nac")["evaluation"]
    student, expert = ev["pygame:carracing_nac"], ev["pygame:expert"]
    return [f"{student['mean_return']:.1f}", f"{student['std_return']:.1f}",
            _pct(student["mean_return"], expert["mean_return"]), f"{expert['mean_return']:.1f}",
            f"{student['laps_completed']}/{student['num_episodes']}"]


def _latency_student() -> list[str]:
    ev = _card("carracing_nac_latency")["evaluation"]
    late, regular, expert = ev["latency5"], ev["regular"], ev["expert_regular"]
    untold = _card("carracing_nac")["latency"]["latency_0.1_s"]
    return [f"{late['timing']['latency_s']:g}", f"{late['mean_return']:.1f}",
            _pct(late["mean_return"], regular["mean_return"]), f"{regular['mean_return']:.1f}",
            _pct(regular["mean_return"], expert["mean_return"], 2), f"{untold['mean_return']:.1f}"]


def _latency_expert() -> list[str]:
    card = _card("expert_carracing_latency")
    ev, steps = card["evaluation"], card["evaluation"]["latency_steps"]
    regular_expert = card["latency_figures"]["regular_expert_same_tracks"][str(steps)]
    return [f"{steps * 0.02:g}",  # CarRacing steps last 0.02 s
            f"{ev['mean_return']:.1f}", f"{ev['laps_finished']}/{ev['episodes']}", f"{regular_expert:.1f}"]


def _discrete_student() -> list[str]:
    cl = _card("carracing_nac_discrete")["closed_loop"]["renderer_fast_sample_temperature_1.5"]
    return cl["return"].split(" +- ") + [f"{cl['percent_of_expert']:.1f}", cl["laps"], cl["episodes_with_wrong_way"]]


def _udacity_student() -> list[str]:
    ev = _card("udacity_nac")["evaluation"]
    return [f"{ev['autonomy']:g}", str(ev["total_interventions"]), f"{ev['mean_mean_abs_cte']:.3f}",
            str(ev["num_episodes"])]


def _hard_student() -> list[str]:
    ev = _card("udacity-hard_nac")["evaluation"]
    lake, jungle = ev["by_theme"]["lake"]["autonomy"], ev["by_theme"]["jungle"]["autonomy"]
    assert lake == jungle, "the row states one figure for lake and jungle"
    return [f"{lake:g}", f"{ev['by_theme']['mountain']['autonomy']:.2f}",
            f"{ev['by_condition']['fog']['autonomy']:.1f}", f"{ev['mean_mean_abs_cte']:.3f}"]


def _sim2real_student() -> list[str]:
    ev = _card("udacity_sim2real_nac")["evaluation"]
    offline = next(v for k, v in ev.items() if k.startswith("offline"))
    replay = next(v for k, v in ev.items() if k.startswith("replay"))
    ratios, per_100s = [r for r, _ in offline.values()], [r for r, _ in replay.values()]
    assert offline.keys() == replay.keys()
    return [str(len(offline)), f"{min(ratios):.2f}", f"{max(ratios):.2f}", f"{min(per_100s):.1f}",
            f"{max(per_100s):.1f}"]


def _real_student() -> list[str]:
    held = _card("udacity_real_nac")["evaluation"]["held_out_drivers"]
    offline, per_100s = [r["offline_vs_straight"] for r in held.values()], [r["per_100s"] for r in held.values()]
    met = sum(o <= 0.5 and p <= 5 for o, p in zip(offline, per_100s))
    return [str(len(held)), f"{min(offline):.2f}", f"{max(offline):.2f}", f"{min(per_100s):.1f}",
            f"{max(per_100s):.1f}", str(met)]


# file in the table -> the figures its headline must state, computed from the card(s)
CARD_FIGURES = {
    "checkpoints/expert_carracing_continuous.zip": lambda: _expert("expert_carracing_continuous"),
    "checkpoints/carracing_nac.pt": _carracing_student,
    "checkpoints/carracing_nac_latency.pt": _latency_student,
    "checkpoints/expert_carracing_latency.zip": _latency_expert,
    "checkpoints/expert_carracing_discrete.zip": lambda: _expert("expert_carracing_discrete"),
    "checkpoints/carracing_nac_discrete.pt": _discrete_student,
    "checkpoints/expert_udacity.zip": lambda: _on_the_road("expert_udacity", laps=False),
    "checkpoints/udacity_nac.pt": _udacity_student,
    "checkpoints/expert_udacity_hard.zip": lambda: _on_the_road("expert_udacity_hard", laps=True),
    "checkpoints/udacity-hard_nac.pt": _hard_student,
    "checkpoints/udacity_sim2real_nac.pt": _sim2real_student,
    "checkpoints/udacity_real_nac.pt": _real_student,
}
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
UNITS = ("per 100 s",)  # numbers that are part of a unit, not figures


def results_at_a_glance() -> dict[str, str]:
    """The README's results table: the model's file -> its headline figure cell."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`checkpoints/"):
            assert cells[1] not in rows, f"{cells[1]} has two rows"
            rows[cells[1].strip("`")] = cells[2]
    return rows


def test_every_shipped_model_has_one_row_in_the_results_table():
    shipped = {str(p.with_suffix(s).relative_to(ROOT)) for p in (ROOT / "checkpoints").glob("*.json")
               for s in (".pt", ".zip") if p.with_suffix(s).exists()}
    assert set(results_at_a_glance()) == shipped == set(CARD_FIGURES)


def test_the_results_table_states_the_cards_figures_and_no_others():
    for path, cell in results_at_a_glance().items():
        figures = cell
        for unit in UNITS:
            figures = figures.replace(unit, "")
        stated, expected = sorted(NUMBER.findall(figures)), sorted(CARD_FIGURES[path]())
        assert stated == expected, f"{path}: the README says {stated}, its card {expected}:\n{cell}"


def test_every_docs_link_resolves():
    """Every relative link of README.md and docs/*.md names a file that exists and, with #anchor, one of its
    headings."""
    broken = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            file = (md.parent / path).resolve() if path else md
            if not file.exists():
                broken.append(f"{md.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
                broken.append(f"{md.name}: {target}")
    assert not broken, f"links that lead nowhere: {broken}"


def test_the_guide_and_the_report_stay_short():
    """The README is a newcomer's guide and docs/results.md a report by question, not a log: their length is held."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    assert len((ROOT / "docs" / "results.md").read_text().splitlines()) <= 700


def test_the_demo_times_say_what_they_depend_on():
    """A demo's wall time on 2 cores doubles when other work shares them (make demo: 48 s idle, 1 min 56 s shared):
    each time the README gives says on which cores it was measured, idle and shared."""
    block = (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    demos = [line for line in block.splitlines() if line.startswith("make demo")]
    assert len(demos) == 2
    for line in demos:
        assert "idle" in line and "shared" in line and len(re.findall(r"\d+ s\b", line)) >= 2, line
