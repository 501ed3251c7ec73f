"""bench_server.py against two revisions in one run: before and after, alternating.

Exports ``--before REV`` and ``--after REV`` (default ``HEAD``) of this repository with
``git archive`` into a temp dir (a path to a checkout, e.g. ``.``, is used as it is,
uncommitted changes included), then runs ``bench/bench_server.py --repeat 1 --only PHASE``
once per phase and tree, alternating: for each round, for each phase, before then after.
Each run starts its own server, ``python -m topics serve`` with
``PYTHONPATH=<tree>/src``, so the server is the tree's code; the benchmark client is the
*after* tree's ``bench/bench_server.py`` for both sides (one client, two servers), or
the one in the checkout that ``--client`` names. The script checks that each tree's
``topics`` really is the one imported.

Per phase metric it reports the median over ``--rounds`` of each side, the ratio
after / before, and flags a metric whose *after* is more than ``--threshold`` (5%) worse:
higher latency, or lower throughput.

Usage::

    .venv/bin/python bench/compare_revs.py --before 1984486 --rounds 3
    .venv/bin/python bench/compare_revs.py --before main --after . --only write_ack batched \\
        -- --durability fsync --quick

Arguments after ``--`` (and any option this script does not know) go to every
bench_server.py run (``--quick``, ``--durability``, ``--sse-watchers``, ...). Prints a
markdown table and one JSON line; writes everything to ``--json`` (default
``bench/results/compare.json``). Both sides share the machine, so run it when it is quiet:
alternating spreads slow drift over both sides, it does not remove noise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _client import get_path  # noqa: E402

PHASES = ["write_ack", "batched", "diff", "sse"]
# (label, path in a bench_server run, higher is better, digits); `*` = every level
METRICS: dict[str, list[tuple[str, str, bool, int]]] = {
    "write_ack": [
        ("p50 µs", "write_ack.p50_us", False, 1),
        ("p99 µs", "write_ack.p99_us", False, 1),
    ],
    "batched": [
        ("records/s", "batched.records_per_s", True, 0),
        ("request p99 ms", "batched.req_p99_ms", False, 2),
    ],
    "diff": [("limit * records/s", "diff.*.records_per_s", True, 0)],
    "sse": [
        ("watchers * p50 ms", "sse.*.p50_ms", False, 2),
        ("watchers * p99 ms", "sse.*.p99_ms", False, 2),
    ],
}
FORBIDDEN = {"--repeat", "--json", "--url", "--server-pid", "--only"}


# -- trees ------------------------------------------------------------------------------------
def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def prepare_tree(repo: Path, rev: str, dest: Path) -> dict[str, Any]:
    """`rev` exported to `dest` (git archive), or an existing checkout used in place."""
    p = Path(rev)
    if (p / "src" / "topics").is_dir():
        path = p.resolve()
        info = {"rev": rev, "path": str(path), "exported": False}
        with contextlib.suppress(subprocess.CalledProcessError):
            info["commit"] = git(path, "rev-parse", "HEAD")
            info["dirty"] = bool(git(path, "status", "--porcelain", "--untracked-files=no"))
        return info
    commit = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    dest.mkdir(parents=True)
    proc = subprocess.Popen(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    if proc.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    build_extensions(dest)
    return {
        "rev": rev,
        "commit": commit,
        "subject": git(repo, "log", "-1", "--format=%s", commit),
        "path": str(dest),
        "exported": True,
    }


def build_extensions(tree: Path) -> None:
    """Build an exported tree's compiled modules in place (trees with a `setup.py`).

    `pip wheel` builds in an isolated environment (the tree's own build
    requirements); the extension modules found in the wheel are copied next to
    their sources, where `PYTHONPATH=<tree>/src` imports them.
    """
    if not (tree / "setup.py").exists():
        return
    with tempfile.TemporaryDirectory(prefix="topics-wheel-") as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp, str(tree)],
            check=True,
            capture_output=True,
        )
        for whl in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(whl) as z:
                for member in z.namelist():
                    if member.endswith(".so") or member.endswith(".pyd"):
                        (tree / "src" / member).write_bytes(z.read(member))


def tree_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    env["PYTHONPATH"] = str(tree / "src")
    return env


def check_import(tree: Path) -> str:
    """The file `import topics` resolves to with the tree's environment (must be inside it)."""
    out = subprocess.run(
        [sys.executable, "-c", "import topics; print(topics.__file__)"],
        env=tree_env(tree),
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"PYTHONPATH={tree / 'src'} imports topics from {out}")
    return out


# -- runs -----------------------------------------------------------------------------------
def run_bench(bench: Path, tree: Path, phase: str, forward: list[str], out: Path) -> dict[str, Any]:
    """One `bench_server.py --repeat 1 --only phase` with the server from `tree`."""
    cmd = [sys.executable, str(bench), "--repeat", "1", "--only", phase, "--json", str(out)]
    cmd += forward
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=tree_env(tree), capture_output=True, text=True)
    wall = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout)[-1500:]
        return {"error": f"bench_server.py exited {proc.returncode}: {tail}", "wall_s": wall}
    report = json.loads(out.read_text())
    out.unlink()
    run = report["runs"][0]
    err = run.get("errors", {}).get(phase)
    return {"run": run, "error": err, "wall_s": wall}


def expand(phase: str, runs: list[dict[str, Any]]) -> list[tuple[str, str, bool, int]]:
    """The metric rows of `phase`, `*` replaced by every level the runs hold (1, 256, ...)."""
    rows: list[tuple[str, str, bool, int]] = []
    for label, path, higher, digits in METRICS[phase]:
        if "*" not in path:
            rows.append((label, path, higher, digits))
            continue
        head = path.split(".*.")[0]
        levels: set[str] = set()
        for r in runs:
            sub = get_path(r, head)
            if isinstance(sub, dict):
                levels |= {k for k in sub if k.isdigit()}
        for lv in sorted(levels, key=int):
            rows.append((label.replace("*", lv), path.replace("*", lv), higher, digits))
    return rows


def compare(
    phases: list[str],
    before: dict[str, list[dict[str, Any]]],
    after: dict[str, list[dict[str, Any]]],
    threshold: float,
) -> list[dict[str, Any]]:
    """One row per metric: medians of each side, after/before, and whether after is worse."""
    rows: list[dict[str, Any]] = []
    for phase in phases:
        runs_b, runs_a = before.get(phase, []), after.get(phase, [])
        for label, path, higher, digits in expand(phase, runs_b + runs_a):
            vb = [v for r in runs_b if isinstance(v := get_path(r, path), int | float)]
            va = [v for r in runs_a if isinstance(v := get_path(r, path), int | float)]
            mb = statistics.median(vb) if vb else None
            ma = statistics.median(va) if va else None
            ratio = round(ma / mb, 4) if mb and ma is not None else None
            # how much slower after is: the latency added, or the share of throughput lost
            worse = None if ratio is None else round(1 - ratio if higher else ratio - 1, 4)
            cpu = path.rsplit(".", 1)[0] + ".cpu.others_cores"
            ob = [v for r in runs_b if isinstance(v := get_path(r, cpu), int | float)]
            oa = [v for r in runs_a if isinstance(v := get_path(r, cpu), int | float)]
            rows.append(
                {
                    "phase": phase,
                    "metric": label,
                    "path": path,
                    "higher_is_better": higher,
                    "digits": digits,
                    "before": mb,
                    "after": ma,
                    "before_runs": vb,
                    "after_runs": va,
                    "ratio": ratio,
                    "slower": worse is not None and worse > threshold,
                    "slower_by": worse,
                    "others_cores_max": [max(ob, default=None), max(oa, default=None)],
                }
            )
    return rows


def fmt(v: Any, digits: int) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def table(rows: list[dict[str, Any]], info: dict[str, Any], rounds: int, thr: float) -> str:
    b, a = info["before"], info["after"]

    def name(t: dict[str, Any]) -> str:
        c = t.get("commit", "")[:9]
        return f"{t['rev']} ({c}{', dirty' if t.get('dirty') else ''})" if c else t["rev"]

    out = [
        f"### bench_server.py: before {name(b)} vs after {name(a)}, median of {rounds} round(s)\n",
        "| phase | metric | before | after | after/before | | others' cores b / a |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["digits"]
        if r["ratio"] is None:
            verdict = "n/a"
        elif r["slower"]:
            verdict = f"**SLOWER {r['slower_by']:.1%}**"
        elif r["slower_by"] < -thr:
            verdict = f"faster {-r['slower_by']:.1%}"
        else:
            verdict = "ok"
        if rounds > 1:
            runs_b = " / ".join(fmt(v, d) for v in r["before_runs"])
            runs_a = " / ".join(fmt(v, d) for v in r["after_runs"])
            cb, ca = f"{fmt(r['before'], d)} ({runs_b})", f"{fmt(r['after'], d)} ({runs_a})"
        else:
            cb, ca = fmt(r["before"], d), fmt(r["after"], d)
        ob, oa = r["others_cores_max"]
        out.append(
            f"| {r['phase']} | {r['metric']} | {cb} | {ca} | {fmt(r['ratio'], 3)} | {verdict} "
            f"| {fmt(ob, 2)} / {fmt(oa, 2)} |"
        )
    slow = [f"{r['phase']} {r['metric']}" for r in rows if r["slower"]]
    out.append(
        f"\nMore than {thr:.0%} slower: "
        + (", ".join(slow) if slow else "none")
        + ". Latencies: lower is better; records/s: higher is better. "
        "Others' cores: the most CPU anything but the bench and its server used during a "
        "timed window of that side (bench_server's gate waits for < 0.15 core first)."
    )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--before", required=True, help="git revision (or checkout path) to compare")
    ap.add_argument("--after", default="HEAD", help="git revision or checkout path (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per phase and side (median)")
    ap.add_argument("--only", nargs="+", choices=PHASES, help="phases (default: all four)")
    ap.add_argument("--threshold", type=float, default=0.05, help="flag above this (0.05 = 5%%)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="repository of the revisions")
    ap.add_argument("--keep", action="store_true", help="keep the exported trees")
    ap.add_argument(
        "--client",
        type=Path,
        help="checkout whose bench/bench_server.py is the client of both sides "
        "(default: the after tree's); e.g. `.` to measure old trees with today's client",
    )
    ap.add_argument(
        "--json", type=Path, default=HERE / "results" / "compare.json", help="output JSON path"
    )
    args, forward = ap.parse_known_args()
    forward = [f for f in forward if f != "--"]
    bad = [f for f in forward if f.split("=")[0] in FORBIDDEN]
    if bad:
        ap.error(f"{' '.join(bad)}: set by this script (use --only and --rounds here)")
    phases = args.only or PHASES

    work = Path(tempfile.mkdtemp(prefix="compare-revs-"))
    try:
        info = {
            "before": prepare_tree(args.repo, args.before, work / "before"),
            "after": prepare_tree(args.repo, args.after, work / "after"),
        }
        for side in ("before", "after"):
            info[side]["imports"] = check_import(Path(info[side]["path"]))
        client = args.client.resolve() if args.client else Path(info["after"]["path"])
        bench = client / "bench" / "bench_server.py"
        if not bench.exists():
            raise SystemExit(f"{bench} does not exist: no bench_server.py to run as the client")
        print(
            f"# compare_revs: before {info['before'].get('commit', args.before)[:9]}, "
            f"after {info['after'].get('commit', args.after)[:9]}; phases {' '.join(phases)}; "
            f"{args.rounds} round(s); bench_server.py args: {' '.join(forward) or '(none)'}",
            file=sys.stderr,
        )
        results: dict[str, dict[str, list[dict[str, Any]]]] = {"before": {}, "after": {}}
        errors: list[str] = []
        for rnd in range(1, args.rounds + 1):
            for phase in phases:
                for side in ("before", "after"):
                    tree = Path(info[side]["path"])
                    print(f"round {rnd}: {phase} {side} ...", file=sys.stderr, end="", flush=True)
                    res = run_bench(bench, tree, phase, forward, work / f"{side}-{phase}.json")
                    print(f" {res['wall_s']} s", file=sys.stderr, flush=True)
                    if res.get("error"):
                        errors.append(f"round {rnd} {phase} {side}: {res['error']}")
                        print(f"  error: {res['error']}", file=sys.stderr)
                    if "run" in res:
                        results[side].setdefault(phase, []).append(res["run"])
    finally:
        if args.keep:
            print(f"trees kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    rows = compare(phases, results["before"], results["after"], args.threshold)
    print(table(rows, info, args.rounds, args.threshold))
    if errors:
        print("\nErrors:\n" + "\n".join(f"- {e}" for e in errors))
    slower = [f"{r['phase']} {r['metric']}" for r in rows if r["slower"]]
    summary = {
        "before": info["before"].get("commit", args.before)[:12],
        "after": info["after"].get("commit", args.after)[:12],
        "rounds": args.rounds,
        "threshold": args.threshold,
        "slower": slower,
        "rows": {
            f"{r['phase']} {r['metric']}": {
                "before": r["before"],
                "after": r["after"],
                "ratio": r["ratio"],
            }
            for r in rows
        },
        "errors": len(errors),
    }
    print(json.dumps(summary, ensure_ascii=False))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    full = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "trees": info,
        "phases": phases,
        "forwarded": forward,
        "rows": rows,
        "errors": errors,
        "runs": results,
    }
    args.json.write_text(json.dumps(full, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
