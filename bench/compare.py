#!/usr/bin/env python3
"""Reruns the headline benchmarks and fails when one regressed beyond its noise.

    python3 bench/compare.py            # full: the release build's headline figures
    python3 bench/compare.py --quick    # quick: small sizes on the debug build (.ci/run runs it)
    python3 bench/compare.py --quick --update   # measure and write the quick baselines

The baselines are in bench/baseline.json: for each benchmark, the `flotilla` arguments, the
JSON field compared, which way is better, the baseline value, and the noise band (a relative
margin: the spread measured over repeated runs on the machine that recorded it, widened for
the quick mode, whose CI machine is another). The full baselines are the figures recorded in
BENCHMARKS.md. A result worse than baseline × (1 ∓ noise) is a regression: the script prints
every result and exits 1 if any regressed.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(binary, args):
    out = subprocess.run(
        [binary, *args], capture_output=True, text=True, cwd=ROOT, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"flotilla {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
    lines = [l for l in out.stdout.splitlines() if l.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"flotilla {' '.join(args)} printed no JSON: {out.stdout[-2000:]}")
    return json.loads(lines[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the quick set (debug build)")
    p.add_argument("--bin", help="the flotilla binary (default: target/{release,debug}/flotilla)")
    p.add_argument("--update", action="store_true", help="write the measured values as baselines")
    p.add_argument("--only", help="run only the benchmarks whose name contains this")
    a = p.parse_args()
    mode = "quick" if a.quick else "full"
    binary = a.bin or os.path.join(ROOT, "target", "debug" if a.quick else "release", "flotilla")
    path = os.path.join(HERE, "baseline.json")
    with open(path) as f:
        baseline = json.load(f)
    regressed = []
    for name, b in baseline[mode].items():
        if a.only and a.only not in name:
            continue
        try:
            r = run(binary, b["args"])
        except RuntimeError as e:
            print(f"FAIL {name}: {e}")
            regressed.append(name)
            continue
        value = r[b["metric"]]
        base, noise, higher = b["value"], b["noise"], b["higher"]
        if higher:
            bound = base * (1 - noise)
            bad = value < bound
        else:
            bound = base * (1 + noise)
            bad = value > bound
        ratio = value / base if base else float("nan")
        verdict = "REGRESSED" if bad else "ok"
        better = "higher" if higher else "lower"
        print(
            f"{verdict:9} {name}: {b['metric']} = {value:.4g} (baseline {base:.4g}, "
            f"{ratio:.2f}x; {better} is better; bound {bound:.4g})"
        )
        if bad:
            regressed.append(name)
        if a.update:
            b["value"] = round(value, 6)
    if a.update:
        with open(path, "w") as f:
            json.dump(baseline, f, indent=2)
            f.write("\n")
        print(f"baselines written to {path}")
    if regressed:
        print(f"{len(regressed)} regressed: {', '.join(regressed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
