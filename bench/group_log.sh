#!/bin/bash
# Raft log and journal size per node after N one-process tasks through a group of three.
# Usage: [BIN=target/debug/flotilla] [N=20000] [EVERY=10000] [COMPACT=SIZE] bash bench/group_log.sh
# (run from the repository root; uses ports 17411-17432 on 127.0.0.1)
# With COMPACT (e.g. 1MiB, the nodes' --compact-journal-after), the job is then removed and
# the journals are measured again once compacted.
set -e
BIN=${BIN:-$PWD/target/debug/flotilla}; N=${N:-20000}; EVERY=${EVERY:-10000}
R=$(mktemp -d /tmp/flotilla-g.XXXX); cd $R
P=(17411 17421 17431); PEERS=127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}
TOKEN=grp-measure-token-0123456789abcdef
pids=()
for i in 1 2 3; do mkdir -p n$i; echo -n $TOKEN > n$i/token; chmod 600 n$i/token
  $BIN server --node-id $i --peers $PEERS --state n$i --snapshot-every $EVERY \
    ${COMPACT:+--compact-journal-after $COMPACT} 2> n$i.log & pids+=($!); done
export FLOTILLA_SERVER=$PEERS FLOTILLA_TOKEN=$TOKEN
$BIN worker --cpus 2 --gpus none --isolation none --name w0 --work-dir w0 2> w0.log & pids+=($!)
mkdir job; printf 'name = "many"\n[[task]]\nid = "t"\narray = "0..%d"\ncmd = ["true"]\n' $N > job/many.toml
sleep 3
start=$(date +%s.%N)
(cd job && $BIN submit --wait many.toml > ../submit.out 2>&1) || true
end=$(date +%s.%N)
$BIN status --json > status.json 2>/dev/null || true
python3 - "$start" "$end" "$N" <<'PY'
import json,os,sys
s=json.load(open('status.json')); g=s.get('group',{})
print("tasks", sys.argv[3], "wall %.1f s" % (float(sys.argv[2])-float(sys.argv[1])), "applied", g.get('applied'), "snapshot", g.get('snapshot'), "purged", g.get('purged'))
for i in (1,2,3):
    lg=os.path.getsize(f'n{i}/group/log'); jn=os.path.getsize(f'n{i}/journal.log')
    print(f"n{i}: raft log {lg} B ({lg/int(sys.argv[3]):.1f} B/task), journal {jn} B ({jn/int(sys.argv[3]):.1f} B/task)")
print([j['state'] for j in s['jobs']])
PY
if [ -n "$COMPACT" ]; then
  id=$(python3 -c "import json; print(json.load(open('status.json'))['jobs'][0]['id'])")
  $BIN rm "$id" > /dev/null
  sleep 5
  for i in 1 2 3; do echo "n$i after removing the job: journal $(stat -c %s n$i/journal.log) B"; done
fi
kill ${pids[@]} 2>/dev/null; wait 2>/dev/null || true
cd / && rm -rf "$R"
