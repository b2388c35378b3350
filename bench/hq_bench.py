"""HyperQueue side by side with `flotilla bench cluster`, through HyperQueue's Python API
(`pip install hyperqueue`: the wheel carries the server and worker in its native extension,
so no `hq` binary is needed). Same workloads, same shape: 2 workers x 1 core on this machine.

    python bench/hq_bench.py --reps 3 [--only abc]

a: 10,000 x /bin/true; b: a chain of 1,000 dependent /bin/true; c: 1,000 /bin/true + 1
reduce depending on all. Each task's stdout/stderr go to /dev/null (Flotilla's worker writes
log files, so this favours HyperQueue slightly). Prints one JSON line per workload.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

from hyperqueue import Job, LocalCluster
from hyperqueue.cluster import WorkerConfig


def program(job, deps=()):
    return job.program(["/bin/true"], stdout=None, stderr=None, deps=list(deps))


def build(kind, n):
    job = Job()
    if kind == "a":
        for _ in range(n):
            program(job)
    elif kind == "b":
        prev = None
        for _ in range(n):
            prev = program(job, [prev] if prev is not None else [])
    elif kind == "c":
        maps = [program(job) for _ in range(n)]
        program(job, maps)
    return job


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="abc")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--chain", type=int, default=1000)
    ap.add_argument("--fan", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        with LocalCluster(server_dir=d) as cluster:
            for _ in range(2):
                cluster.start_worker(WorkerConfig(cores=1))
            client = cluster.client()
            # Warm-up: workers connected, first job served.
            client.wait_for_jobs([client.submit(build("a", 10))])
            sizes = {"a": args.n, "b": args.chain, "c": args.fan}
            names = {
                "a": f"a: {args.n} x /bin/true",
                "b": f"b: chain of {args.chain} /bin/true",
                "c": f"c: fan-out {args.fan} /bin/true + 1 reduce",
            }
            for kind in args.only:
                runs = []
                for _ in range(args.reps):
                    job = build(kind, sizes[kind])
                    t0 = time.perf_counter()
                    client.wait_for_jobs([client.submit(job)])
                    runs.append(time.perf_counter() - t0)
                med = statistics.median(runs)
                n = sizes[kind] + (1 if kind == "c" else 0)
                print(json.dumps({
                    "system": "hyperqueue 0.27.0 (python API, LocalCluster, 2 workers x 1 core)",
                    "workload": names[kind],
                    "runs_s": [round(r, 4) for r in runs],
                    "median_s": round(med, 4),
                    "tasks_per_s": round(n / med, 1),
                    "ms_per_task": round(med / n * 1e3, 4),
                    "loadavg": os.getloadavg(),
                }), flush=True)


if __name__ == "__main__":
    main()
