#!/usr/bin/env bash
# Runs the image the way deploy/kubernetes runs it, on one machine with a container engine:
# a coordinator and two workers in containers of their own on a private network (non-root,
# read-only root filesystem, every capability dropped, no privilege escalation, tokens in
# read-only files, state and work folders on volumes), a client container that submits a job
# (shell tasks in an array, a task that joins their outputs, a WASM task) and gathers its
# outputs, then a second job during which one worker is stopped as a pod eviction stops it
# (SIGTERM through tini, then a grace period): its task must finish on the other worker with no
# retry counted, and the stopped worker must exit cleanly. Last, a worker allowed to make
# user namespaces runs a task in a bubblewrap sandbox, with --isolation required.
#
#   bash deploy/container/smoke.sh [IMAGE]        # default flotilla:0.1.0; ENGINE=podman works too
#
# Run as root (the job folder and token files are made for the image's uid 10001). Leaves
# nothing behind: its containers, network, volumes and files are removed on exit.
set -euo pipefail

image=${1:-flotilla:0.1.0}
engine=${ENGINE:-docker}
tag=flotilla-smoke-$$
work=$(mktemp -d)
uid=10001

say() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }

cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    for c in coord w1 w2 w3; do
      echo "--- last log lines of $tag-$c" >&2
      "$engine" logs --tail 30 "$tag-$c" >&2 2>&1 || true
    done
  fi
  "$engine" rm -f "$tag-coord" "$tag-w1" "$tag-w2" "$tag-w3" >/dev/null 2>&1 || true
  "$engine" volume rm "$tag-state" "$tag-w1" "$tag-w2" >/dev/null 2>&1 || true
  "$engine" network rm "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# What the manifests' securityContext asks of every container.
locked=(--read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges)

say "the image: its version and its user"
"$engine" run --rm "$image" --version
[ "$("$engine" run --rm --entrypoint id "$image" -u)" = "$uid" ] || fail "the image does not run as uid $uid"

say "the coordinator"
"$engine" network create "$tag" >/dev/null
mkdir -p "$work/admin" "$work/worker"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/admin/token"
chown -R "$uid:$uid" "$work/admin" "$work/worker"
chmod 0400 "$work/admin/token"
"$engine" run -d --name "$tag-coord" --network "$tag" --network-alias coord "${locked[@]}" \
  -v "$tag-state:/var/lib/flotilla" -v "$work/admin/token:/etc/flotilla/admin/token:ro" \
  -e FLOTILLA_LOG=info "$image" \
  server --listen 0.0.0.0:7070 --http-listen 0.0.0.0:9090 --rendezvous-port 7072 \
  --state /var/lib/flotilla --log-format json --admin-token-file /etc/flotilla/admin/token >/dev/null

admin=(--server 127.0.0.1:7070 --token-file /etc/flotilla/admin/token --connect-timeout 60s)
"$engine" exec "$tag-coord" flotilla admin worker-token add --name smoke "${admin[@]}" \
  | tail -n 1 > "$work/worker/token"
[ -s "$work/worker/token" ] || fail "no worker enrolment token"
chown "$uid:$uid" "$work/worker/token"
chmod 0400 "$work/worker/token"

say "two workers"
for w in w1 w2; do
  "$engine" run -d --name "$tag-$w" --network "$tag" --hostname "node-$w" "${locked[@]}" \
    -v "$tag-$w:/var/lib/flotilla-worker" -v "$work/worker/token:/etc/flotilla/worker/token:ro" \
    -e FLOTILLA_SERVER=coord:7070 -e HOME=/tmp -e FLOTILLA_HOME=/var/lib/flotilla-worker/home \
    -e FLOTILLA_LOG=info --entrypoint tini "$image" -- \
    flotilla worker --name "$w" --token-file /etc/flotilla/worker/token \
    --data-listen 0.0.0.0:7071 --work-dir /var/lib/flotilla-worker --cpus 1 --mem 1GiB \
    --gpus none --grace 30s --max-store 1GiB --isolation auto --log-format json >/dev/null
done

status_json() { "$engine" exec "$tag-coord" flotilla status "${admin[@]}" --json "$@"; }
workers=0
for _ in $(seq 1 120); do
  workers=$(status_json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["workers"]))')
  [ "$workers" = 2 ] && break
  sleep 0.5
done
[ "$workers" = 2 ] || fail "the workers did not register (saw $workers)"
status_json | python3 -c '
import json, sys
for w in json.load(sys.stdin)["workers"]:
    print("  %s on host %s: %s" % (w["name"], w["hostname"], w["resources"]))'

say "a job from a client container: 8 shell tasks, a join, a WASM task"
mkdir -p "$work/job1"
cat > "$work/job1/job.toml" <<'TOML'
name = "container-smoke"
staging = "transfer"

[[task]]
id = "part"
array = "0..8"
cmd = ["sh", "-c", "mkdir -p parts && sleep 1 && seq 1 {i}000 | sha256sum > parts/{i}.txt"]
outputs = ["parts/{i}.txt"]

[[task]]
id = "join"
after = ["part"]
inputs = ["parts/*.txt"]
cmd = ["sh", "-c", "cat parts/0.txt parts/1.txt parts/2.txt parts/3.txt parts/4.txt parts/5.txt parts/6.txt parts/7.txt | sha256sum > all.txt"]
outputs = ["all.txt"]

[[task]]
id = "hello"
wasm = "hello.wat"
TOML
cat > "$work/job1/hello.wat" <<'WAT'
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello from wasm\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 16))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
WAT
chown -R "$uid:$uid" "$work/job1"
# A client container: the job folder mounted read-write (outputs are gathered into it).
client() {
  "$engine" run --rm --network "$tag" "${locked[@]}" -e FLOTILLA_SERVER=coord:7070 \
    -v "$work/admin/token:/etc/flotilla/admin/token:ro" "$@"
}
client -v "$work/job1:/job" "$image" \
  submit /job/job.toml --token-file /etc/flotilla/admin/token --wait
expected=$(for i in 0 1 2 3 4 5 6 7; do seq 1 "${i}000" | sha256sum; done | sha256sum)
[ "$(cat "$work/job1/all.txt")" = "$expected" ] || fail "all.txt is '$(cat "$work/job1/all.txt" 2>/dev/null)', expected '$expected'"
echo "all.txt gathered, as computed here: $expected"
status_json 1 | python3 -c '
import json, sys
job = json.load(sys.stdin)
assert job["state"] == "succeeded", job["state"]
ran = {job["workers"][str(s["worker"])]: s["tasks"] for s in job["per_worker"]}
print("  tasks per worker:", ran)
assert len(ran) == 2, "one worker ran everything"'
"$engine" exec "$tag-coord" flotilla logs "${admin[@]}" 1 hello | tee "$work/hello.out"
grep -q 'hello from wasm' "$work/hello.out" || fail "the WASM task's output is not in its log"

say "the coordinator's HTTP port, as the probes and the autoscaler's scraper see it"
coord_ip=$("$engine" inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$tag-coord")
python3 - "http://$coord_ip:9090" "$work/admin/token" <<'PY'
import sys, urllib.error, urllib.request
base, token = sys.argv[1], open(sys.argv[2]).read().strip()
def get(path, auth=None):
    req = urllib.request.Request(base + path)
    if auth:
        req.add_header("Authorization", "Bearer " + auth)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
status, _ = get("/")
assert status == 200, f"the liveness probe's / answered {status}"
status, _ = get("/metrics")
assert status == 401, f"/metrics without a token answered {status}"
status, body = get("/metrics", token)
assert status == 200, f"/metrics with the admin token answered {status}"
for name in ("flotilla_ready_queue_depth", "flotilla_tasks"):
    assert name in body, f"/metrics has no {name}"
print("  / 200 without a token; /metrics 401 without, 200 with the admin token, "
      "flotilla_ready_queue_depth and flotilla_tasks in it")
PY

# A transfer-staging job in $work/NAME: two tasks that each sleep SECS, then write
# out-{i}.txt. Submitted without waiting; prints its id.
submit_pair() {
  local name=$1 secs=$2
  mkdir -p "$work/$name"
  cat > "$work/$name/job.toml" <<TOML
name = "container-$name"
staging = "transfer"

[[task]]
id = "t"
array = "0..2"
cmd = ["sh", "-c", "sleep $secs && echo {i} > out-{i}.txt"]
outputs = ["out-{i}.txt"]
TOML
  chown -R "$uid:$uid" "$work/$name"
  client -v "$work/$name:/job" "$image" \
    submit /job/job.toml --token-file /etc/flotilla/admin/token | tail -n 1
}
# Waits until the workers running JOB's tasks match the shell pattern WANT (names, spaced).
wait_running() {
  local job=$1 want=$2 running=""
  for _ in $(seq 1 120); do
    running=$(status_json "$job" | python3 -c '
import json, sys
job = json.load(sys.stdin)
print(" ".join(sorted(job["workers"][str(t["worker"])] for t in job["tasks"] if t["state"] == "running")))')
    # shellcheck disable=SC2254 # a pattern on purpose
    case " $running " in $want) return 0 ;; esac
    sleep 0.25
  done
  fail "the tasks of $job did not run as expected ($want): running on '$running'"
}
# Follows JOB of $work/NAME to its end from a client, which gathers its outputs there.
wait_gathered() {
  local name=$1 job=$2
  client -v "$work/$name:/job" "$image" wait "$job" --token-file /etc/flotilla/admin/token \
    --connect-timeout 60s
  for i in 0 1; do
    [ "$(cat "$work/$name/out-$i.txt" 2>/dev/null)" = "$i" ] || fail "$name: out-$i.txt was not gathered"
  done
}

say "the coordinator's container restarted mid-job, as a StatefulSet's pod restarts"
job2=$(submit_pair restart 4)
wait_running "$job2" " w1 w2 "
"$engine" restart -t 30 "$tag-coord" >/dev/null
wait_gathered restart "$job2"
status_json "$job2" | python3 -c '
import json, sys
job = json.load(sys.stdin)
assert job["state"] == "succeeded", job["state"]
for t in job["tasks"]:
    print("  %s: %s, attempt %d, failures %d: %s" % (t["name"], t["state"], t["attempts"], t["failures"], t["message"]))
    assert t["failures"] == 0, "the restart cost a task a failure"
    assert t["attempts"] == 1, "the restart made a running task start again"'
status_json | python3 -c '
import json, sys
names = sorted(w["name"] for w in json.load(sys.stdin)["workers"])
print("  workers back:", names)
assert names == ["w1", "w2"], names'

say "a worker stopped mid-task, as a pod eviction stops it"
job3=$(submit_pair evict 6)
wait_running "$job3" "* w1 *"
started=$(date +%s)
"$engine" stop -t 60 "$tag-w1" >/dev/null
took=$(( $(date +%s) - started ))
code=$("$engine" inspect -f '{{.State.ExitCode}}' "$tag-w1")
echo "w1 stopped in ${took}s, exit code $code"
[ "$code" = 0 ] || fail "the stopped worker exited with $code"
wait_gathered evict "$job3"
status_json "$job3" | python3 -c '
import json, sys
job = json.load(sys.stdin)
assert job["state"] == "succeeded", job["state"]
for t in job["tasks"]:
    where = job["workers"][str(t["worker"])]
    print("  %s: %s on %s, attempt %d, failures %d: %s"
          % (t["name"], t["state"], where, t["attempts"], t["failures"], t["message"]))
    assert t["failures"] == 0, "a preempted attempt was counted as a failure"
    assert where == "w2", "a task ended on the stopped worker"
assert any(t["attempts"] >= 2 for t in job["tasks"]), "no task was preempted"'

say "a worker with task sandboxes: user namespaces allowed, /proc unmasked"
# What docs/kubernetes.md ("Security") says a pod needs for sandboxes: a seccomp profile that
# lets bubblewrap make user namespaces, and an unmasked /proc (Kubernetes: procMount Unmasked)
# so that it can mount one for the task's PID namespace. With --isolation required the worker
# refuses to start without them; its task sees bubblewrap, not tini, as its PID 1.
unmask=(--security-opt systempaths=unconfined)
case "$(basename "$engine")" in podman*) unmask=(--security-opt unmask=ALL) ;; esac
"$engine" stop -t 60 "$tag-w2" >/dev/null
"$engine" run -d --name "$tag-w3" --network "$tag" --hostname node-w3 "${locked[@]}" \
  --security-opt seccomp=unconfined "${unmask[@]}" \
  -v "$work/worker/token:/etc/flotilla/worker/token:ro" \
  -e FLOTILLA_SERVER=coord:7070 -e HOME=/tmp -e FLOTILLA_LOG=info --entrypoint tini "$image" -- \
  flotilla worker --name w3 --token-file /etc/flotilla/worker/token --data-listen 0.0.0.0:7071 \
  --work-dir /tmp/work --cpus 1 --mem 1GiB --gpus none --isolation required >/dev/null
mkdir -p "$work/job4"
cat > "$work/job4/job.toml" <<'TOML'
name = "container-sandbox"
staging = "transfer"

[[task]]
id = "where"
cmd = ["sh", "-c", "cat /proc/1/comm > pid1.txt"]
outputs = ["pid1.txt"]
TOML
chown -R "$uid:$uid" "$work/job4"
client -v "$work/job4:/job" "$image" submit /job/job.toml --token-file /etc/flotilla/admin/token --wait
pid1=$(cat "$work/job4/pid1.txt")
echo "the task's PID 1: $pid1"
[ "$pid1" = bwrap ] || fail "the task ran outside a sandbox (its PID 1 is '$pid1')"
say "passed"
