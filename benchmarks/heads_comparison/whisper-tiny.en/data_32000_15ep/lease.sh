#!/usr/bin/env bash
# tiny.en data scaling on the lent GPU: 32 000 utterances, one lease, calls back to back (a warm machine keeps /tmp
# for 30 s after each call). The work itself runs in the background (pipeline.sh), so no call's 600 s limit cuts it:
#   bash lease.sh start        carrying .gpu/bd and .gpu/t1_tokenizer.json.xz: unpack, start pipeline.sh
#   bash lease.sh carry t1     carrying .gpu/t1, then t2, t3: the base's float16 parts, made here with
#                              python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/t --parts 3
#                              (with .gpu/t1/tokenizer.json moved out and xz-compressed to .gpu/t1_tokenizer.json.xz:
#                              each call under 64 MiB)
#   bash lease.sh wait         until the pipeline ends (or 560 s), printing its log; at the end it packs the results
#                              as one tar in 15 MiB parts under $OUT (here: cat run.tar.* | tar -x)
#   bash lease.sh pack         the same packing alone
# Then here: bash after_lease.sh FILES_AT (heads, comparison, GPU rows merged, CPU rows and the card again).
# As run on 2026-12-04, twice, and nothing came back. The first lease ran the synthesis (298 s, 107 utterances/s),
# then carried parts of an older layout that tools.carry_weights cannot join (since re-split as above) and was
# taken back while they were carried again. The second, 06:31-06:51 UTC, ran to the end (`ended (status 0)` at
# 1093 s: synthesis 296 s, collection 443 s at 72 clips/s, training 163 s, export, two rows); its log is in
# lease_log_2026-12-04.txt. But `pack` ran as a separate call more than 30 s after the last `wait` returned and
# found a fresh machine: the heads and the rows went with the first one (hence `wait` now packs, in its own call).
set -euo pipefail
W=/tmp/w; HERE=benchmarks/heads_comparison/whisper-tiny.en/data_32000_15ep
case "${1:?usage: lease.sh start|carry PART|wait|pack}" in
  start)
    mkdir -p $W/parts; cp -r .gpu/bd/. $W/bd/; xz -dc .gpu/t1_tokenizer.json.xz > $W/tokenizer.json
    cp -r . $W/repo  # the background job outlives this call's copy of the tree
    cd $W/repo && setsid nohup bash $HERE/pipeline.sh > $W/pipeline.log 2>&1 < /dev/null &
    sleep 25; cat $W/pipeline.log ;;
  carry)
    cp -r ".gpu/${2:?usage: lease.sh carry PART}" $W/parts/
    [ -d $W/parts/t1 ] && [ -d $W/parts/t2 ] && [ -d $W/parts/t3 ] && touch $W/parts/ready
    ls $W/parts; tail -n 3 $W/pipeline.log ;;
  wait)  # until the pipeline ends, 560 s, or the time (seconds since 1970) in ./deadline if there is one; at the
         # end or the deadline it packs the results into this call's $OUT: the next call may find a fresh machine
    deadline=$(cat $HERE/deadline 2>/dev/null || echo 0)
    for _ in $(seq 112); do
      if [ "$deadline" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ] && [ ! -f $W/ended ]; then
        echo "ended (status: stopped at the lease's deadline, results so far packed)" >> $W/pipeline.log; touch $W/ended
      fi
      [ -f $W/ended ] && { bash $HERE/lease.sh pack; break; }
      sleep 5
    done
    tr '\r' '\n' < $W/pipeline.log | grep -v "it/s\]" | tail -n 40 ;;
  pack)
    tar -C $W -cf $W/run.tar results; split -b 15M -d $W/run.tar $OUT/run.tar.; ls -la $OUT ;;
esac
