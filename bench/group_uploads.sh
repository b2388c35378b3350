#!/bin/bash
# What replicating uploads adds to a submission: the same transfer job (F files of S KiB,
# fresh content each time) submitted to one coordinator and to a group of three, alternating.
# Usage: [BIN=target/debug/flotilla] [F=20] [S=1024 KiB] [REPS=5] bash bench/group_uploads.sh
# (run from the repository root; uses ports 17511-17541 on 127.0.0.1)
BIN=${BIN:-$PWD/target/debug/flotilla}; F=${F:-20}; S=${S:-1024}; REPS=${REPS:-5}
R=$(mktemp -d /tmp/flotilla-u.XXXX); cd $R
P=(17511 17521 17531); PEERS=127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}
TOKEN=grp-measure-token-0123456789abcdef
pids=()
for i in 1 2 3; do mkdir -p n$i; echo -n $TOKEN > n$i/token; chmod 600 n$i/token
  $BIN server --node-id $i --peers $PEERS --state n$i 2> n$i.log & pids+=($!); done
mkdir -p one; echo -n $TOKEN > one/token; chmod 600 one/token
$BIN server --listen 127.0.0.1:17541 --state one 2> one.log & pids+=($!)
export FLOTILLA_TOKEN=$TOKEN
mkdir -p job/in
printf 'name = "up"\nstaging = "transfer"\n[[task]]\nid = "t"\narray = "0..%d"\ninputs = ["in/{i}.bin"]\ncmd = ["true"]\n' $F > job/up.toml
sleep 4
for rep in $(seq 1 $REPS); do
  for target in one group; do
    for i in $(seq 0 $((F-1))); do head -c $((S*1024)) /dev/urandom > job/in/$i.bin; done
    if [ $target = one ]; then srv=127.0.0.1:17541; else srv=$PEERS; fi
    s=$(date +%s%N); (cd job && FLOTILLA_SERVER=$srv $BIN submit up.toml > /dev/null 2>&1) || echo "submit to $target failed"
    e=$(date +%s%N); echo "$target $(( (e-s)/1000000 )) ms"
  done
done
kill ${pids[@]} 2>/dev/null; wait 2>/dev/null || true
cd / && rm -rf "$R"
