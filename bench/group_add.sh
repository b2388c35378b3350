#!/bin/bash
# How long `flotilla admin group add` takes to bring a new node into a group of three that
# has run N one-process tasks: the new node, started with --join and an empty state folder,
# is sent the log (or, past --snapshot-every entries, the leader's snapshot) and then votes.
# Usage: [BIN=target/debug/flotilla] [N=2000] [EVERY=10000] bash bench/group_add.sh
# (run from the repository root; uses ports 17511-17542 on 127.0.0.1)
set -e
BIN=${BIN:-$PWD/target/debug/flotilla}; N=${N:-2000}; EVERY=${EVERY:-10000}
R=$(mktemp -d /tmp/flotilla-ga.XXXX); cd $R
P=(17511 17521 17531 17541); PEERS=127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}
TOKEN=grp-measure-token-0123456789abcdef
pids=()
for i in 1 2 3 4; do mkdir -p n$i; echo -n $TOKEN > n$i/token; chmod 600 n$i/token; done
for i in 1 2 3; do
  $BIN server --node-id $i --peers $PEERS --state n$i --snapshot-every $EVERY 2> n$i.log & pids+=($!); done
export FLOTILLA_SERVER=$PEERS,127.0.0.1:${P[3]} FLOTILLA_TOKEN=$TOKEN
$BIN worker --cpus 2 --gpus none --isolation none --name w0 --work-dir w0 2> w0.log & pids+=($!)
mkdir job; printf 'name = "many"\n[[task]]\nid = "t"\narray = "0..%d"\ncmd = ["true"]\n' $N > job/many.toml
sleep 3
(cd job && $BIN submit --wait many.toml > ../submit.out 2>&1) || true
$BIN server --node-id 4 --peers $PEERS,127.0.0.1:${P[3]} --state n4 --join 2> n4.log & pids+=($!)
sleep 2
start=$(date +%s.%N)
$BIN admin group add 4 127.0.0.1:${P[3]} --json > add.json
end=$(date +%s.%N)
python3 - "$start" "$end" "$N" <<'PY'
import json,os,sys
g=json.load(open('add.json'))
print("tasks", sys.argv[3], "add took %.2f s" % (float(sys.argv[2])-float(sys.argv[1])),
      "applied", g.get('applied'), "snapshot", g.get('snapshot'), "purged", g.get('purged'))
for m in g['members']:
    print(f"node {m['id']}: voter {m['voter']}, matched {m['matched']}")
print("journal of the new node:", os.path.getsize('n4/journal.log'), "B; of node 1:", os.path.getsize('n1/journal.log'), "B")
PY
kill ${pids[@]} 2>/dev/null; wait 2>/dev/null || true
cd / && rm -rf "$R"
