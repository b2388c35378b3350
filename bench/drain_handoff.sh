#!/bin/bash
# What a worker's planned departure costs: N tasks of T seconds each write an output of S
# bytes on worker w0 (w1 joins once they are done); then w0 leaves and every output is
# gathered again (`flotilla wait`), from w1 now. MODE=drain: `flotilla admin worker drain w0`
# (its outputs are handed to w1 before it goes); MODE=kill: SIGKILL (the gather finds them
# lost and they are made again from lineage, on w1). Prints when w0 was gone, when the outputs
# were back in the job folder, and the producers' attempts.
# Usage: [BIN=target/debug/flotilla] [N=200] [T=0.2] [S=1048576] MODE=drain|kill bash bench/drain_handoff.sh
# (run from the repository root; uses port 17611 on 127.0.0.1)
set -e
trap 'kill $SP $W0 $W1 2>/dev/null' EXIT
BIN=${BIN:-$PWD/target/debug/flotilla}; N=${N:-200}; T=${T:-0.2}; S=${S:-1048576}; MODE=${MODE:-drain}
R=$(mktemp -d /tmp/flotilla-dh.XXXX); cd $R
PORT=17611
$BIN server --listen 127.0.0.1:$PORT --state st 2> server.log & SP=$!
for i in $(seq 50); do [ -s st/token ] && break; sleep 0.1; done
export FLOTILLA_SERVER=127.0.0.1:$PORT FLOTILLA_TOKEN=$(cat st/token)
# Two workers of two CPUs: the producers run on w0 first (w1 joins after they are done).
$BIN worker --cpus 2 --gpus none --isolation none --name w0 --work-dir w0 --grace 1s 2> w0.log & W0=$!
mkdir job
cat > job/make.toml <<EOF
name = "make"
staging = "transfer"
[[task]]
id = "p"
array = "0..$N"
cmd = ["sh", "-c", "sleep $T; mkdir -p out; head -c $S /dev/urandom > out/{i}.bin"]
outputs = ["out/{i}.bin"]
EOF
(cd job && mkdir -p out && $BIN submit --wait make.toml > ../make.out 2>&1)
$BIN worker --cpus 2 --gpus none --isolation none --name w1 --work-dir w1 2> w1.log & W1=$!
for i in $(seq 100); do $BIN status --json 2>/dev/null | grep -q '"w1"' && break; sleep 0.1; done
start=$(date +%s.%N)
if [ "$MODE" = kill ]; then
  kill -9 $W0
else
  $BIN admin worker drain w0 > /dev/null
fi
wait $W0 2>/dev/null || true
left=$(date +%s.%N)
# Gather every output again: what w0 held must come from w1 now (copied, or made again).
(cd job && rm -rf out && mkdir out && $BIN wait 1 > ../gather.out 2>&1)
end=$(date +%s.%N)
$BIN status 1 --json > status.json
python3 - "$start" "$left" "$end" "$MODE" "$N" "$S" <<'PY'
import json, sys
start, left, end = map(float, sys.argv[1:4])
s = json.load(open('status.json'))
attempts = sum(t['attempts'] for t in s['tasks'])
print(f"mode {sys.argv[4]}: {sys.argv[5]} outputs of {int(sys.argv[6])//1024} KiB; "
      f"w0 gone after {left-start:.2f} s; outputs back in the job folder after {end-start:.2f} s; "
      f"producer attempts {attempts} (of {sys.argv[5]})")
PY
kill $W1 $SP 2>/dev/null; wait 2>/dev/null || true
cd / && rm -rf "$R"
